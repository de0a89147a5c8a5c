"""The embedding as a Parquet dataset (``id``, ``label``, ``kernelpca*``, ``split``).

Written by the project stage (``<out>/embedding.parquet``) and by ``kpca transform`` with
an output ending in ``.parquet``; one part per row chunk, never the whole embedding in
memory.
"""

from __future__ import annotations

import logging
import time

import dask
import dask.array as da
import numpy as np
import pandas as pd

from pipeline.output import Location, mark_folder
from pipeline.runtime import compute

__all__ = ["component_names", "write_parquet"]

logger = logging.getLogger("pipeline")


#: the columns written with Parquet dictionary pages (few distinct values); ids and the
#: components are written plain
DICTIONARY_COLUMNS = ("label", "split")


def component_names(k: int) -> list[str]:
    return [f"kernelpca{i}" for i in range(k)]


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
            # code -1: a row without a label (an unlabelled update batch): a null label
            names = np.asarray(classes, dtype=object)[np.maximum(codes, 0)]
            names[codes < 0] = None
            df.insert(1, "label", pd.Series(names, dtype="str"))
        else:
            df.insert(1, "label", codes)
    if split is not None:
        df["split"] = np.where(np.asarray(split) > 0, "train", "test")
    return df


def write_parquet(
    out: Location,
    emb: da.Array,
    *,
    ids: da.Array | None = None,
    labels: da.Array | None = None,
    classes: list[str] | None = None,
    split: da.Array | None = None,
    name: str = "embedding.parquet",
) -> dict:
    """The embedding as Parquet: ``id``, ``label``, ``kernelpca*`` and ``split`` columns."""
    import dask.dataframe as dd

    t0 = time.perf_counter()
    cols = component_names(emb.shape[1])
    rows = emb.chunks[0]
    offsets = np.concatenate([[0], np.cumsum(rows)])

    def blocks(a):
        return None if a is None else a.rechunk({0: rows}).to_delayed().ravel()

    eb, ib, lb, sb = blocks(emb), blocks(ids), blocks(labels), blocks(split)
    parts = [
        dask.delayed(_frame)(
            eb[b],
            None if ib is None else ib[b],
            None if lb is None else lb[b],
            None if sb is None else sb[b],
            classes,
            int(offsets[b]),
            cols,
        )
        for b in range(len(rows))
    ]
    meta = _frame(
        np.zeros((0, len(cols)), dtype=emb.dtype),
        None if ids is None else np.zeros(0, dtype=ids.dtype),
        None if labels is None else np.zeros(0, dtype=np.int64),
        None if split is None else np.zeros(0, dtype=np.uint8),
        classes,
        0,
        cols,
    )
    ddf = dd.from_delayed(parts, meta=meta)
    target = out.child(name)
    target.remove(root=out)
    mark_folder(target, "parquet")  # ownership marker first: a half-written folder is ours too
    compute(
        ddf.to_parquet(
            target.url,
            write_index=False,
            compute=False,
            # dictionary pages only for the low-cardinality text columns: pyarrow's
            # default tries them on every column, and on the components (unique floats)
            # it builds a 1 MB dictionary per column and row group, then falls back to
            # plain: 1.6-4.7x the write's time and a 13-50 % larger file (64k to 1M rows a
            # part: benchmarks/bench_parquet_write.py, docs/scaling.md)
            use_dictionary=list(DICTIONARY_COLUMNS),
            storage_options=out.storage_options or None,
        ),
        label="parquet",
    )
    secs = time.perf_counter() - t0
    logger.info("project: wrote %s in %.1f s", target, secs)
    return {"path": str(target), "seconds": secs}
