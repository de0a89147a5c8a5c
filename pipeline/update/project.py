"""The ``project`` stage of ``kpca update`` (pipeline/update/run.py): the union's embedding (the
base's rows then the batch's, row-chunked like the base's), its row arrays (split, labels,
ids), the spectrum and the Parquet copy."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import dask.array as da
import numpy as np

from pipeline.data.ingest import IngestResult, load_ingested
from pipeline.output import DENSE, EMBEDDING, run_layout, write_spectrum
from pipeline.runner.results import ProjectResult, SolveResult
from pipeline.stages import _store_array
from pipeline.update.base import _all_rows, _base_location

logger = logging.getLogger("pipeline")


def stage_project(
    cfg: Any,
    ing: IngestResult,
    base: dict[str, Any],
    solved: SolveResult,
) -> ProjectResult:
    """The union's embedding (base rows then the batch's), row arrays, spectrum, Parquet."""
    import kpca_dask
    from pipeline.embed.project import component_names, write_parquet
    from pipeline.embed.transform import embed_rows
    from pipeline.runtime import compute

    t0 = time.perf_counter()
    layout = run_layout(cfg)
    out = layout.out
    model = kpca_dask.load(layout.model.zarr_source())  # the version being written's
    src = load_ingested(ing)
    bg = _base_location(base).open_group("r")
    old = da.from_zarr(bg[EMBEDDING])
    rows = old.chunks[0][0]
    reembed = solved.info.get("action") != "merge" or cfg.update.reembed
    if reembed:
        X = _all_rows(base["lineage"], src.X).rechunk({0: rows, 1: -1})
        emb = embed_rows(model, X, training_data=False, dtype=model.dtype_, one_read=True)
    else:
        new = embed_rows(model, src.X, training_data=False, dtype=model.dtype_, one_read=True)
        emb = da.concatenate([old.astype(new.dtype), new], axis=0)
    emb = emb.rechunk({0: rows, 1: -1})
    g = out.open_group("a")
    if EMBEDDING in g:
        del g[EMBEDDING]
    z = g.create_array(
        EMBEDDING, shape=emb.shape, dtype=emb.dtype, chunks=(rows, emb.shape[1]), config=DENSE
    )
    z.attrs["columns"] = component_names(emb.shape[1])
    z.attrs["rows_by_this_model"] = [0 if reembed else int(old.shape[0]), int(emb.shape[0])]
    compute(da.store(emb, z, lock=False, compute=False), label="embedding")
    arrays = _row_arrays(bg, src, int(src.X.shape[0]))
    chunks = emb.chunks[0]
    for name in ("split", "labels", "ids"):
        if arrays.get(name) is not None:
            _store_array(g, name, arrays[name], chunks)
        elif name in g:
            del g[name]
    if arrays.get("labels") is not None:
        g["labels"].attrs["classes"] = arrays["classes"]
    write_spectrum(out, model)
    result = ProjectResult(
        rows=int(emb.shape[0]), components=int(emb.shape[1]), seconds=time.perf_counter() - t0
    )
    if cfg.output.parquet:
        pq = write_parquet(
            out,
            da.from_zarr(g[EMBEDDING]),
            ids=arrays.get("ids"),
            labels=arrays.get("labels"),
            classes=arrays.get("classes"),
            split=arrays.get("split"),
        )
        result = replace(result, parquet=pq["path"])
    elif layout.parquet.exists():
        layout.parquet.remove(root=out)
    logger.info(
        "update: embedding of %d rows (%s) in %.1f s",
        result.rows,
        "every row embedded again" if reembed else f"{src.X.shape[0]} appended",
        time.perf_counter() - t0,
    )
    return result


def _row_arrays(bg: Any, src: Any, n_new: int) -> dict[str, Any]:
    """split / labels / ids of the union: the base's then the batch's.

    split: the batch is training data. labels: every row that has one keeps it -- the
    classes are the base's, then the batch's new ones appended (so the base's codes stay
    valid); a row without a label (an unlabelled batch, or an unlabelled base) has code
    -1. ids: the base's then the batch's, int64 when both are, else text; none when
    either side has none (``update.no_ids``)."""
    out: dict[str, Any] = {}
    n_old = int(bg[EMBEDDING].shape[0])
    if "split" in bg:
        out["split"] = da.concatenate(
            [da.from_zarr(bg["split"]), da.ones(n_new, dtype=bg["split"].dtype, chunks=n_new)]
        )
    old_classes = list(bg["labels"].attrs.get("classes") or []) if "labels" in bg else None
    if old_classes is not None or src.labels is not None:
        classes = list(old_classes or [])
        classes += [c for c in (src.classes or []) if c not in classes]
        old = (
            da.from_zarr(bg["labels"]).astype(np.int64)
            if old_classes is not None
            else da.full(n_old, -1, dtype=np.int64, chunks=max(1, n_old))
        )
        if src.labels is not None:
            lookup = np.array([classes.index(c) for c in src.classes or []], dtype=np.int64)
            new = src.labels.astype(np.int64).map_blocks(
                lambda c, t=lookup: np.where(c >= 0, t[np.maximum(c, 0)], -1), dtype=np.int64
            )
        else:
            new = da.full(n_new, -1, dtype=np.int64, chunks=max(1, n_new))
        out["labels"] = da.concatenate([old, new])
        out["classes"] = classes
    if "ids" in bg and src.ids is not None:
        old_ids = da.from_zarr(bg["ids"])
        if old_ids.dtype.kind in "OUT" or src.ids.dtype.kind in "OUT":
            out["ids"] = da.concatenate([old_ids.astype(str), src.ids.astype(str)])
        else:
            out["ids"] = da.concatenate([old_ids, src.ids.astype(old_ids.dtype)])
    return out
