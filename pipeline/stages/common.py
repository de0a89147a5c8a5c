"""What several stage modules share: the training rows, row arrays next to the
embedding, content checksums and a JSON-equality test for the freshness checks."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import dask.array as da

from pipeline.data.ingest import IngestResult, InputError
from pipeline.data.stage_data import ingested, read_split
from pipeline.output import (
    DENSE,
    RunLayout,
    array_checksum,
    file_checksums,
    json_default,
    run_layout,
)
from pipeline.runner.results import SplitResult

from ..config import ConfigError

__all__ = ["checksums", "evaluation_wanted", "files_under"]


def evaluation_wanted(cfg: Any, ing: IngestResult) -> bool:
    enabled = cfg.evaluate.enabled
    if enabled and ing.has_labels and len(ing.classes or []) < 2:
        raise InputError(
            f"label column {ing.label_column!r} has {len(ing.classes or [])} class(es); "
            "evaluation needs at least 2 (or drop input.label_column)."
        )
    if enabled == "auto":
        return ing.has_labels
    if enabled and not ing.has_labels:
        raise ConfigError(
            "evaluate.enabled is true but the input has no label column; set "
            "input.label_column or evaluate.enabled: auto."
        )
    return bool(enabled)


def _training_rows(cfg: Any, ing: IngestResult, split: SplitResult) -> da.Array:
    """Training rows of the ingested X (in the ingest store's chunks)."""
    _, src = ingested(ing)
    mask = read_split(run_layout(cfg), split)
    return src.X if mask is None else src.X[mask.astype(bool)]


def _store_array(g, name: str, arr: da.Array, rows) -> None:
    if name in g:
        del g[name]
    arr = arr.rechunk({0: rows})
    dtype = str if arr.dtype.kind in "OUT" else arr.dtype
    z = g.create_array(name, shape=arr.shape, dtype=dtype, chunks=(rows[0],), config=DENSE)
    da.store(arr, z, lock=False)


def checksums(group: Any, names: Iterable[str]) -> dict[str, str]:
    """``array_checksum`` of each named array present in a zarr group."""
    return {name: array_checksum(group[name]) for name in names if name in group}


def files_under(layout: RunLayout, folder: str) -> dict[str, str]:
    """SHA-256 of the run's files under ``folder`` (as the manifest records them)."""
    sums = file_checksums(layout.out)
    return {k: v for k, v in sums.items() if k == folder or k.startswith(folder + "/")}


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON (so NaN equals NaN, and tuples equal lists)."""
    return json.dumps(a, sort_keys=True, default=json_default) == json.dumps(
        b, sort_keys=True, default=json_default
    )
