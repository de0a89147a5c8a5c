"""The project stage: the embedding of every row (zarr, optional Parquet) and the
spectrum."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import dask.array as da

from pipeline.data.ingest import IngestResult
from pipeline.data.stage_data import ingested, read_split
from pipeline.embed.project import write_embedding, write_parquet
from pipeline.output import EMBEDDING, PARQUET, SPECTRUM_ARRAYS, run_layout, write_spectrum
from pipeline.runner.registry import Stage
from pipeline.runner.results import ProjectResult, SolveResult, SplitResult

from .common import checksums, files_under

__all__ = ["PROJECT", "stage_project"]

_PROJECT_ARRAYS = (EMBEDDING, *SPECTRUM_ARRAYS)


def stage_project(
    cfg: Any, ing: IngestResult, split: SplitResult, solved: SolveResult
) -> ProjectResult:
    """Embedding of every row (zarr, optional Parquet) and the spectrum."""
    import kpca_dask

    layout = run_layout(cfg)
    out = layout.out
    _, src = ingested(ing)
    # the model of the version being written (a cached result may name an earlier one)
    model = kpca_dask.load(layout.model.zarr_source())
    mask = read_split(layout, split)
    # the ingest store's rows: read once (ingest refused NaN/inf; reads check digests)
    result = ProjectResult(**write_embedding(model, src.X, out, split=mask, one_read=True))
    write_spectrum(out, model)
    if cfg.output.parquet:
        g = out.open_group("r")
        pq = write_parquet(
            out,
            da.from_zarr(g[EMBEDDING]),
            ids=src.ids,
            labels=src.labels,
            classes=src.classes,
            split=None if mask is None else da.from_array(mask, chunks=src.X.chunks[0]),
        )
        result = replace(result, parquet=pq["path"])
    return result


def _fingerprint_project(cfg: Any, res: dict) -> dict:
    layout = run_layout(cfg)
    return {
        **res,
        "checksums": checksums(layout.out.open_group("r"), _PROJECT_ARRAYS),
        "files": files_under(layout, PARQUET),
    }


def _fresh_project(cfg: Any, inputs: dict, res: dict) -> str | None:
    layout = run_layout(cfg)
    if checksums(layout.out.open_group("r"), _PROJECT_ARRAYS) != res.get("checksums"):
        return "the embedding or spectrum changed"
    if files_under(layout, PARQUET) != res.get("files", {}):
        return "the Parquet embedding changed"
    return None


PROJECT = Stage(
    "project",
    stage_project,
    inputs=("ing", "split", "solved"),
    result="projected",
    result_type=ProjectResult,
    config=("output.parquet",),
    publishes=(EMBEDDING, "spectrum", PARQUET),
    fingerprint=_fingerprint_project,
    fresh=_fresh_project,
    doc="embedding of every row (zarr, optional Parquet) and the spectrum",
)
