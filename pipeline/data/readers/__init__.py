"""Readers: a source (NPY, CSV, Parquet or zarr; local path or fsspec URL) as lazy arrays.

``read_input`` returns a :class:`SourceData`: the float64 feature matrix in row chunks
of about ``target_chunk_mb``, optional class labels (int codes plus the class names) and
optional row ids. Nothing is computed or written here: the ingest stage
(pipeline/data/ingest.py) validates and stores what a reader returns, and ``kpca transform``
embeds it directly. Problems with the source raise :class:`InputError`, one line naming
the problem and the fix.

The readers, one module each: npy.py, zarr_array.py, tables.py (CSV and Parquet);
base.py holds what they share.
"""

from __future__ import annotations

from pipeline.config import ChunkConfig, InputConfig

from .base import (
    InputError,
    SourceData,
    check_exists,
    detect_format,
    rows_per_chunk,
)
from .npy import NpyFile, RemoteNpyFile, read_npy
from .tables import explain_table_error, read_table, table_columns
from .zarr_array import read_zarr

__all__ = [
    "InputError",
    "NpyFile",
    "RemoteNpyFile",
    "SourceData",
    "check_exists",
    "detect_format",
    "explain_table_error",
    "read_input",
    "rows_per_chunk",
    "table_columns",
]


def read_input(
    cfg: InputConfig, chunks: ChunkConfig | None = None, *, min_classes: int = 2
) -> SourceData:
    """Lazy feature matrix (+ labels, ids) from the configured source.

    ``min_classes``: the label column must hold at least this many classes (2 where the
    run evaluates; an update or a transform carries whatever labels a batch has)."""
    chunks = chunks or ChunkConfig()
    loc = check_exists(cfg)
    fmt = detect_format(cfg)
    if fmt == "npy":
        return read_npy(cfg, loc, chunks)
    if fmt == "zarr":
        return read_zarr(cfg, loc, chunks)
    return read_table(cfg, fmt, chunks, min_classes=min_classes)
