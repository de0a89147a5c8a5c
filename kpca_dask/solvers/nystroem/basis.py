"""The landmark side of the Nyström approximation: ``W = k(Z, Z) = U S U^T`` and
``T = U S^-1/2`` over its kept eigenvalues (:class:`NystroemBasis`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from ...kernels import Kernel
from ...threads import blas_threads_for_driver

__all__ = ["NystroemBasis", "default_w_rtol", "nystroem_basis"]


@dataclass
class NystroemBasis:
    """The landmark side of the Nyström approximation.

    Attributes
    ----------
    landmarks : ndarray of shape (m, n_features), float64
    kernel : Kernel
    dtype : numpy dtype
        Precision of kernel evaluation and in-block products.
    T : ndarray of shape (m, m'), float64
        ``U S^-1/2`` over the kept eigenvalues of ``W = k(Z, Z)``.
    w_eigenvalues : ndarray of shape (m',)
        The kept eigenvalues of W, descending.
    shift : ndarray of shape (m,)
        ``c0``, the estimate of the column means subtracted before products.
    n_dropped : int
        Eigenvalues of W below the threshold (numerically dependent landmarks,
        or the negative part of an indefinite kernel).
    """

    landmarks: np.ndarray
    kernel: Kernel
    dtype: np.dtype
    T: np.ndarray
    w_eigenvalues: np.ndarray
    shift: np.ndarray
    n_dropped: int = 0

    @property
    def m(self) -> int:
        return int(self.landmarks.shape[0])

    @property
    def rank(self) -> int:
        return int(self.T.shape[1])

    def prepared(self) -> np.ndarray:
        """The landmarks prepared as the right-hand side of kernel blocks."""
        return self.kernel.prepare(self.landmarks, self.dtype, "right")


def default_w_rtol(dtype: Any) -> float:
    """Relative cut-off for the eigenvalues of W by evaluation precision.

    Maintenance note: a feature direction ``U_j / sqrt(S_j)`` amplifies the
    rounding error of the kernel values (relative ``eps`` of the dtype) by
    ``1 / sqrt(S_j / S_max)``. Below ``1e-6 S_max`` in float32 (``1e-12`` in
    float64) the direction is mostly rounding noise, and it carries at most
    that fraction of the kernel's energy, so dropping it costs nothing
    measurable while keeping T well conditioned.
    """
    return 1e-12 if np.dtype(dtype) == np.float64 else 1e-6


def _cut_reference(S: np.ndarray) -> float:
    """What the relative cut-off of W's eigenvalues ``S`` (descending) is relative to: a
    lower bound of the top eigenvalue of the *centred* landmark kernel, ``S[1]``.

    Maintenance note (issue 36): the exact solver and scikit-learn drop centred
    eigenvalues below ``1e-12`` times the top centred one (kpca_dask/_eigvals.py), and
    so does a Nyström fit on the eigenvalues of Sigma. Cut relative to W's own top
    ``S[0]`` -- uncentred, it holds the kernel's mean: 3x the centred top for an rbf
    kernel of moderate gamma -- W lost directions the exact rule keeps. Centring is a
    rank-one projection, so by interlacing ``S[1] <= lambda_1(J W J) <= S[0]``: relative
    to ``S[1]`` the cut is never stricter than the exact one's."""
    if S.size > 1 and S[1] > 0:
        return float(S[1])
    return max(float(S[0]), 0.0) if S.size else 0.0


def nystroem_basis(
    landmarks: np.ndarray,
    kernel: Kernel,
    dtype: Any,
    shift: np.ndarray | None = None,
    rtol: float | None = None,
) -> NystroemBasis:
    """Eigendecompose ``W = k(Z, Z)`` (evaluated in ``dtype``, solved in float64).

    ``shift`` defaults to the column means of W (an unbiased estimate of
    ``c`` when Z is a uniform sample; exactly ``c`` when Z is all of X).
    """
    dtype = np.dtype(dtype)
    Z = np.ascontiguousarray(landmarks, dtype=np.float64)
    with blas_threads_for_driver():
        with np.errstate(over="ignore", invalid="ignore"):
            W = np.asarray(kernel(Z, Z, dtype=dtype), dtype=np.float64)
        from ..landmarks import _check_finite_kernel

        _check_finite_kernel(W)  # NaN would reach LAPACK (and read as "no eigenvalue")
        W = (W + W.T) / 2
        S, U = scipy.linalg.eigh(W, check_finite=False)
    S, U = S[::-1], U[:, ::-1]
    tol = default_w_rtol(dtype) if rtol is None else rtol
    top = float(S[0]) if S.size else 0.0
    keep = S > _cut_reference(S) * tol
    if not top > 0 or not keep.any():
        from ...exceptions import ConstantKernelError

        raise ConstantKernelError(
            "The kernel matrix of the landmarks has no positive eigenvalue: the kernel is "
            "(nearly) zero on the data. Check the kernel parameters."
        )
    T = U[:, keep] / np.sqrt(S[keep])
    if shift is None:
        shift = W.mean(axis=0)
    return NystroemBasis(
        Z,
        kernel,
        dtype,
        np.ascontiguousarray(T),
        S[keep],
        np.asarray(shift, dtype=np.float64),
        int((~keep).sum()),
    )
