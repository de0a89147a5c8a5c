"""Embedding new rows with a fitted model: the per-block task functions.

A fitted model (exact or Nyström, ``kpca_dask._fitted``) reduces to
coefficients ``A_aug`` on its kept rows ``X_fit`` and four centring constants;
a block of new rows ``x`` is then embedded as

    ``P = k(x, X_fit) @ A_aug``;  ``emb = P[:, :k] - muA - s oneA + g oneA``

with ``s = P[:, k] / n`` the row's mean kernel value (the last column of
``A_aug``). These functions run in Dask tasks: they import only numpy and the
block kernel products.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .gram import cross_products

__all__ = ["finish_projection", "project_block", "project_precomputed_block"]


def project_precomputed_block(
    kb: Any, A_aug: np.ndarray, consts: tuple, dtype: Any, out_dtype: Any
) -> np.ndarray:
    """Embedding of new rows given their kernel values ``kb = k(x, X_fit)`` (m x n)."""
    P = np.asarray(kb, dtype=np.float64) @ A_aug
    return finish_projection(P, None, None, A_aug, consts, dtype, "transform", out_dtype)


def project_block(
    xb: np.ndarray,
    X_fit: np.ndarray,
    A_aug: np.ndarray,
    consts: tuple,
    kernel: Any,
    dtype: Any,
    what: str,
    out_dtype: Any = None,
) -> np.ndarray:
    """Embedding (``what="transform"``) or novelty score (``"score"``) of the rows ``xb``."""
    P = cross_products(kernel, xb, X_fit, A_aug, dtype)
    return finish_projection(P, xb, kernel, A_aug, consts, dtype, what, out_dtype)


def finish_projection(
    P: np.ndarray,
    xb: np.ndarray | None,
    kernel: Any,
    A_aug: np.ndarray,
    consts: tuple,
    dtype: Any,
    what: str,
    out_dtype: Any = None,
) -> np.ndarray:
    """Centre the products ``P = k(x, X_fit) @ A_aug``: the embedding, or the score
    ``||phi_c(x)||^2 - |emb|^2`` (a column) for ``what="score"``."""
    muA, oneA, g, n = consts
    k = A_aug.shape[1] - 1
    s = P[:, k] / n  # mean(k(x, X)) per new row
    emb = P[:, :k] - muA[None, :] - s[:, None] * oneA[None, :] + g * oneA[None, :]
    if what == "transform":
        return emb.astype(out_dtype or dtype, copy=False)
    norm2 = kernel.diag(xb, np.float64) - 2.0 * s + g
    return (norm2 - np.einsum("ij,ij->i", emb, emb))[:, None]
