"""The linear PCA baseline: the same classifier on linear PCA of the same rows."""

from __future__ import annotations

import logging
from typing import Any

import dask.array as da
import numpy as np

from ..errors import EvaluationError
from .classify import row_blocks, to_numpy

logger = logging.getLogger("pipeline.evaluate")

__all__ = ["linear_pca_baseline"]


def linear_pca_baseline(
    X_train: Any,
    X_test: Any,
    n_components: int,
    *,
    random_state: int = 0,
    memory_mb: float = 512.0,
    batch_rows: int | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Linear PCA fitted on the training rows only; embed training and held-out rows.

    Parameters
    ----------
    X_train : array of shape (n_train, d), numpy or dask
    X_test : array of shape (n_test, d), numpy or dask
    n_components : int
        Capped at ``min(n_train, d)`` (linear PCA has no more components);
        the number used is ``info["n_components"]``.
    memory_mb : float
        When ``n_train * d * 8`` bytes fit, scikit-learn's PCA is fitted in
        memory; otherwise :class:`~sklearn.decomposition.IncrementalPCA`
        streams the training rows batch by batch and never holds more than
        one batch (exact for the leading, well separated directions).
    batch_rows : int, optional
        Rows per IncrementalPCA batch (default: about 64 MB of float64, at
        least ``2 * n_components``); a short last batch is merged into the
        one before it.

    Returns
    -------
    train_embedding, test_embedding : numpy arrays (numpy in) or lazy dask arrays (dask in)
    info : dict with ``method`` ("pca" or "incremental_pca"), ``n_components``,
        ``n_fit_rows`` and ``explained_variance_ratio``.
    """
    from sklearn.decomposition import PCA

    n_train, d = int(X_train.shape[0]), int(X_train.shape[1])
    k = int(min(n_components, d, n_train))
    if k < 1:
        raise EvaluationError(
            "the linear PCA baseline needs at least one training row and one feature"
        )
    lazy = isinstance(X_train, da.Array) or isinstance(X_test, da.Array)
    if n_train * d * 8 <= memory_mb * 2**20:
        (Xtr,) = to_numpy(X_train)
        pca: Any = PCA(n_components=k, random_state=random_state).fit(Xtr)
        method = "pca"
        train_emb: Any = pca.transform(Xtr)
        if isinstance(X_train, da.Array):
            train_emb = da.from_array(train_emb, chunks=(X_train.chunks[0], (k,)))
    else:
        pca, train_emb = _incremental_pca(X_train, k, batch_rows)
        method = "incremental_pca"
    if isinstance(X_test, da.Array):
        Xt = X_test.rechunk({1: -1})
        test_emb: Any = Xt.map_blocks(
            pca.transform, chunks=(Xt.chunks[0], (k,)), dtype=np.float64
        )
    else:
        test_emb = pca.transform(np.asarray(X_test))
    if lazy and not isinstance(train_emb, da.Array):
        train_emb = da.from_array(train_emb)
    info = {
        "method": method,
        "n_components": k,
        "n_fit_rows": n_train,
        "explained_variance_ratio": [float(v) for v in pca.explained_variance_ratio_],
    }
    return train_emb, test_emb, info


def _incremental_pca(X_train: Any, k: int, batch_rows: int | None) -> tuple[Any, Any]:
    """IncrementalPCA streamed over row batches (one batch in memory at a time); the
    fitted PCA and the training rows' embedding (lazy for dask input)."""
    from sklearn.decomposition import IncrementalPCA

    n_train, d = int(X_train.shape[0]), int(X_train.shape[1])
    if batch_rows is None:
        batch_rows = max(2 * k, int(64 * 2**20 // (8 * d)))
    batch_rows = max(int(batch_rows), k)
    Xd = X_train if isinstance(X_train, da.Array) else da.from_array(np.asarray(X_train))
    Xd = Xd.rechunk({0: _batch_chunks(n_train, batch_rows), 1: -1})
    pca = IncrementalPCA(n_components=k)
    for xb, _ in row_blocks(Xd):
        pca.partial_fit(xb)
    if isinstance(X_train, da.Array):
        Xw = X_train.rechunk({1: -1})
        train_emb = Xw.map_blocks(pca.transform, chunks=(Xw.chunks[0], (k,)), dtype=np.float64)
    else:
        train_emb = np.vstack([pca.transform(xb) for xb, _ in row_blocks(X_train)])
    return pca, train_emb


def _batch_chunks(n: int, rows: int) -> tuple[int, ...]:
    """Row chunks of ``rows`` with the remainder folded into the last one (no tiny batch)."""
    q, r = divmod(n, rows)
    if q == 0:
        return (n,)
    sizes = [rows] * q
    sizes[-1] += r
    return tuple(sizes)
