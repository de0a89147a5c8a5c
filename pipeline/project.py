"""Project stage: the embedding of every ingested row, in zarr (and Parquet).

The embedding keeps the ingested row chunks; see :func:`write_embedding` for
how training and held-out rows are embedded.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dask
import dask.array as da
import numpy as np
import pandas as pd

from .progress import compute
from .store import Location, mark_folder

__all__ = ["write_embedding", "write_parquet", "component_names"]

logger = logging.getLogger("pipeline")


def component_names(k: int) -> list[str]:
    return [f"kernelpca{i}" for i in range(k)]


def write_embedding(model: Any, X: da.Array, out: Location, *, split: np.ndarray | None = None,
                    name: str = "embedding") -> dict:
    """Write the embedding of every row of ``X`` to the zarr array ``<out>/<name>``.

    Exact models: the training rows' embedding is ``V sqrt(lambda)`` (what
    ``fit_transform`` returns; ``transform`` on those rows reproduces it to the
    solver's certified residual), held-out rows (``split == 0``) go through
    ``transform``. This avoids an n x n evaluation for the training rows.
    Nyström models: ``transform`` for every row (O(n m), streaming).
    """
    t0 = time.perf_counter()
    rows = X.chunks[0]
    exact = getattr(model, "eigen_solver_", None) in ("dense", "randomized")
    if exact:
        train = (model.eigenvectors_ * np.sqrt(model.eigenvalues_)).astype(model._dtype)
        if split is None:
            full = train
        else:
            mask = split.astype(bool)
            full = np.empty((X.shape[0], train.shape[1]), dtype=train.dtype)
            full[mask] = train
            if (~mask).any():
                (full[~mask],) = compute(model.transform(X[~mask]), label="embed held-out rows")
        emb = da.from_array(full, chunks=(rows, -1))
    else:
        emb = model.transform(X).rechunk({0: rows, 1: -1})
    g = out.open_group("a")
    if name in g:
        del g[name]
    z = g.create_array(name, shape=emb.shape, dtype=emb.dtype, chunks=(rows[0], emb.shape[1]))
    z.attrs["columns"] = component_names(emb.shape[1])
    compute(da.store(emb, z, lock=False, compute=False), label="embedding")
    secs = time.perf_counter() - t0
    logger.info("project: embedded %d rows into %s/%s in %.1f s", X.shape[0], out, name, secs)
    return {"rows": int(X.shape[0]), "components": int(emb.shape[1]), "seconds": secs}


def _frame(emb, ids, labels, split, classes, offset, cols):
    df = pd.DataFrame(np.asarray(emb), columns=cols)
    if ids is None:
        id_col = pd.Series(np.arange(offset, offset + len(df), dtype=np.int64))
    else:
        ids = np.asarray(ids)
        id_col = pd.Series(ids, dtype="str" if ids.dtype.kind in "OUT" else ids.dtype)
    df.insert(0, "id", id_col)
    if labels is not None:
        codes = np.asarray(labels, dtype=np.int64)
        if classes:  # class names, as text (same dtype whether or not the part is empty)
            df.insert(1, "label", pd.Series(np.asarray(classes, dtype=object)[codes], dtype="str"))
        else:
            df.insert(1, "label", codes)
    if split is not None:
        df["split"] = np.where(np.asarray(split) > 0, "train", "test")
    return df


def write_parquet(out: Location, emb: da.Array, *, ids: da.Array | None = None,
                  labels: da.Array | None = None, classes: list[str] | None = None,
                  split: da.Array | None = None, name: str = "embedding.parquet") -> dict:
    """The embedding as Parquet (``id``, ``label``, ``kernelpca*``, ``split``) for downstream tools."""
    import dask.dataframe as dd

    t0 = time.perf_counter()
    cols = component_names(emb.shape[1])
    rows = emb.chunks[0]
    offsets = np.concatenate([[0], np.cumsum(rows)])

    def blocks(a):
        return None if a is None else a.rechunk({0: rows}).to_delayed().ravel()

    eb, ib, lb, sb = blocks(emb), blocks(ids), blocks(labels), blocks(split)
    parts = [dask.delayed(_frame)(eb[b], None if ib is None else ib[b],
                                  None if lb is None else lb[b], None if sb is None else sb[b],
                                  classes, int(offsets[b]), cols) for b in range(len(rows))]
    meta = _frame(np.zeros((0, len(cols)), dtype=emb.dtype),
                  None if ids is None else np.zeros(0, dtype=ids.dtype),
                  None if labels is None else np.zeros(0, dtype=np.int64),
                  None if split is None else np.zeros(0, dtype=np.uint8), classes, 0, cols)
    ddf = dd.from_delayed(parts, meta=meta)
    target = out.child(name)
    target.remove(root=out)
    mark_folder(target, "parquet")  # ownership marker first: a half-written folder is ours too
    compute(ddf.to_parquet(target.url, write_index=False, compute=False,
                           storage_options=out.storage_options or None), label="parquet")
    secs = time.perf_counter() - t0
    logger.info("project: wrote %s in %.1f s", target, secs)
    return {"path": str(target), "seconds": secs}
