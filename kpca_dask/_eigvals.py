"""Which eigenpairs a fit keeps: scikit-learn's rules for zero and negative eigenvalues.

scikit-learn's ``KernelPCA`` (``_check_psd_eigenvalues`` then ``remove_zero_eig``):

* a *significantly* negative eigenvalue among those computed (below
  ``-ratio * max |lambda|``, ratio 1e-5 in float64, 5e-3 in float32) is an
  error: the kernel matrix is not positive semi-definite;
* insignificant negative ones, and positive ones below ``1e-12 * max``
  (2e-7 in float32), are set to exactly 0;
* ``remove_zero_eig=False`` (default) with an explicit ``n_components`` keeps
  the zero pairs as zero columns of the embedding; ``remove_zero_eig=True`` or
  ``n_components=None`` removes them.

Deliberate differences (docs/sklearn.md): a centred kernel matrix with no
positive eigenvalue at all (constant data in feature space) is an error here,
not an empty embedding; ``n_components=None`` and ``remove_zero_eig=True`` drop
negative eigenvalues (non-PSD kernels such as sigmoid) with a
:class:`~kpca_dask.exceptions.DroppedComponentsWarning` instead of refusing.
"""

from __future__ import annotations

import warnings

import numpy as np

from .exceptions import DroppedComponentsWarning, InvalidInputError
from .solvers._common import drop_nonpositive

__all__ = ["select_eigenpairs", "inv_sqrt"]

#: scikit-learn's thresholds (sklearn.utils.validation._check_psd_eigenvalues).
_NEG_RATIO = {np.dtype(np.float32): 5e-3, np.dtype(np.float64): 1e-5}
_SMALL_POS_RATIO = {np.dtype(np.float32): 2e-7, np.dtype(np.float64): 1e-12}


def inv_sqrt(w: np.ndarray) -> np.ndarray:
    """``1 / sqrt(w)`` with 0 where ``w == 0`` (zero components embed as 0, as in
    scikit-learn), without a division warning."""
    w = np.asarray(w, dtype=np.float64)
    out = np.zeros_like(w)
    nz = w > 0
    out[nz] = 1.0 / np.sqrt(w[nz])
    return out


def select_eigenpairs(
    eigenvalues: np.ndarray,
    eigenvectors: np.ndarray,
    residuals: np.ndarray,
    *,
    n_components: int | None,
    remove_zero_eig: bool,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs a fit keeps, descending (see the module docstring)."""
    w = np.asarray(eigenvalues, dtype=np.float64)
    dtype = np.dtype(dtype)
    small = _SMALL_POS_RATIO.get(dtype, 1e-12)
    if not np.all(np.isfinite(w)):
        return drop_nonpositive(w, eigenvectors, residuals, rtol=small, requested=w.size)
    top = float(w.max()) if w.size else 0.0
    if top <= 0:
        # no positive eigenvalue: drop_nonpositive names the problem (constant data)
        return drop_nonpositive(w, eigenvectors, residuals, rtol=small, requested=w.size)
    scale = float(np.abs(w).max())
    neg_ratio = _NEG_RATIO.get(dtype, 1e-5)
    if n_components is None:
        # all positive components: the zero ones are no news, negative ones are
        n_neg = int(np.sum(w < -neg_ratio * scale))
        if n_neg:
            warnings.warn(
                f"{n_neg} eigenvalue(s) of the centred kernel matrix are significantly "
                f"negative (down to {w.min():.3g}, largest {top:.3g}) and were dropped: the "
                "kernel is not positive semi-definite (e.g. sigmoid); only the positive "
                "components are kept.",
                DroppedComponentsWarning,
                stacklevel=3,
            )
        return drop_nonpositive(w, eigenvectors, residuals, rtol=small, requested=0)
    if remove_zero_eig:
        # fewer pairs than asked (a solver that stopped early) warned already
        return drop_nonpositive(
            w, eigenvectors, residuals, rtol=small, requested=min(int(n_components), w.size)
        )
    lo = float(w.min())
    if lo < -neg_ratio * scale:
        n_pos = int(np.sum(w > small * top))
        n_neg = int(np.sum(w < -neg_ratio * scale))
        # counts only, no computed digits: the message is the same on every CPU
        raise InvalidInputError(
            f"There are significant negative eigenvalues among the {w.size} requested "
            f"components ({n_neg} significantly negative, {n_pos} positive): the kernel "
            "matrix is not positive semi-definite (a kernel such as sigmoid, or a precomputed "
            f"matrix that is not a Gram matrix). Ask for n_components={n_pos} or fewer, or "
            "pass remove_zero_eig=True to drop the non-positive components."
        )
    w = w.copy()
    zero = w < small * top
    residuals = np.asarray(residuals, dtype=np.float64).copy()
    with np.errstate(invalid="ignore"):
        # ||Kc v - lambda v|| / lambda means nothing for lambda ~ 0: relative to the top
        residuals[zero] = residuals[zero] * np.abs(w[zero]) / top
    w[zero] = 0.0
    return w, eigenvectors, residuals
