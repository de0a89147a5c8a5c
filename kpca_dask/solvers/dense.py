"""Dense eigensolver: the whole centred kernel matrix in memory (small n only)."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ._common import EigResult, deterministic_signs

__all__ = ["dense_eigh", "centre_inplace"]


def centre_inplace(K: np.ndarray) -> tuple[np.ndarray, float]:
    """``K <- H K H`` in place; returns the row means and the grand mean.

    Uses ``Kc = K - mu 1^T - 1 mu^T + g 11^T`` (docs/design.md), no copy of K.
    """
    mu = K.mean(axis=1)
    g = float(mu.mean())
    K -= mu[:, None]
    K -= mu[None, :]
    K += g
    return mu, g


def dense_eigh(Kc: np.ndarray, n_components: int) -> EigResult:
    """Top ``n_components`` eigenpairs of the centred matrix ``Kc`` (n x n).

    ``scipy.linalg.eigh`` computes only the requested index range. Memory is
    the matrix itself, ``n^2 * itemsize``, plus eigh's workspace.
    """
    n = Kc.shape[0]
    k = min(n_components, n)
    w, V = scipy.linalg.eigh(Kc, subset_by_index=(n - k, n - 1))
    order = np.argsort(w)[::-1]
    w = w[order]
    V = deterministic_signs(V[:, order])
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.linalg.norm(Kc @ V - V * w, axis=0) / np.abs(w)
    return EigResult(
        eigenvalues=w, eigenvectors=V, residuals=res, n_passes=1, info={"solver": "dense"}
    )
