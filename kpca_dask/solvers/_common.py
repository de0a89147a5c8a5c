"""Shared pieces of the eigensolvers: the result type, sign convention, clean-up."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import ConstantKernelError, DroppedComponentsWarning, InvalidInputError

__all__ = ["EigResult", "deterministic_signs", "drop_nonpositive"]


@dataclass
class EigResult:
    """Leading eigenpairs of the centred kernel matrix.

    Attributes
    ----------
    eigenvalues : ndarray of shape (k,)
        Descending, all positive.
    eigenvectors : ndarray of shape (n, k)
        Orthonormal columns, signs fixed by :func:`deterministic_signs`.
    residuals : ndarray of shape (k,)
        ``||Kc v - lambda v|| / lambda`` per pair, measured with a real product.
    n_passes : int
        Products with the kernel matrix (passes over its blocks) used.
    converged : bool
        Whether the solver reached its tolerance (always True for dense).
    info : dict
        Solver-specific diagnostics (JSON-serialisable).
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    residuals: np.ndarray
    n_passes: int = 0
    converged: bool = True
    info: dict[str, Any] = field(default_factory=dict)


def deterministic_signs(V: np.ndarray) -> np.ndarray:
    """Flip columns so that each one's largest-magnitude entry is positive.

    The same convention as scikit-learn's ``svd_flip(u, None)``, so that runs,
    solvers, chunkings and machines agree on the sign of each component.
    """
    if V.size == 0:
        return V
    idx = np.argmax(np.abs(V), axis=0)
    signs = np.sign(V[idx, np.arange(V.shape[1])])
    signs[signs == 0] = 1.0
    return V * signs


def drop_nonpositive(
    eigenvalues: np.ndarray,
    eigenvectors: np.ndarray,
    residuals: np.ndarray,
    *,
    rtol: float,
    requested: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep the pairs whose eigenvalue is clearly positive; warn about the rest.

    Maintenance note: the centred kernel matrix always has the eigenvalue 0
    (eigenvector 1), and rank deficiency (duplicate rows, linear kernel with
    few features) or a non-PSD kernel (sigmoid) adds zero or negative ones.
    Their eigenvectors cannot be scaled by ``1/sqrt(lambda)``, so they are
    removed rather than returned as zero columns. "Clearly positive" means
    above ``rtol * lambda_max``, where ``rtol`` reflects the precision of the
    kernel evaluation.
    """
    if not np.all(np.isfinite(eigenvalues)):
        raise InvalidInputError(
            "The kernel matrix produced non-finite eigenvalues: the kernel returned NaN or inf "
            "for this data (check the kernel parameters, e.g. a non-integer polynomial degree "
            "with negative inner products)."
        )
    top = float(eigenvalues.max()) if eigenvalues.size else 0.0
    keep = eigenvalues > max(top, 0.0) * rtol
    if top <= 0 or not keep.any():
        raise ConstantKernelError(
            "The centred kernel matrix has no positive eigenvalue: the data are constant in "
            "feature space (all rows identical, or gamma so large or small that the kernel "
            "is (nearly) constant). Check the data and the kernel parameters."
        )
    n_drop = int(requested - keep.sum())
    if n_drop > 0:
        # a solver may return fewer pairs than requested (numerical rank below k):
        # those count as dropped zero eigenvalues
        largest = float(eigenvalues[~keep].max()) if (~keep).any() else 0.0
        warnings.warn(
            f"Kept {int(keep.sum())} of {requested} requested components: {n_drop} had "
            f"eigenvalues that are not positive (largest dropped: "
            f"{largest:.3g}, largest kept: {top:.3g}). "
            "The centred kernel matrix has fewer positive eigenvalues than requested "
            "(rank deficiency, duplicate rows, or a kernel that is not positive "
            "semi-definite such as sigmoid); ask for fewer components to silence this.",
            DroppedComponentsWarning,
            stacklevel=3,
        )
    return eigenvalues[keep], eigenvectors[:, keep], residuals[keep]
