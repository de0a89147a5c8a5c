"""zarr input: a v3 array (or the array ``input.zarr_array`` of a group), its missing
chunks refused or read as the fill value as ``input.missing_chunks`` says."""

from __future__ import annotations

import logging

import dask.array as da
import numpy as np

from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks

from .base import InputError, SourceData, check_matrix_dtype, rows_per_chunk

__all__ = ["read_zarr"]

logger = logging.getLogger("pipeline")


def read_zarr(cfg, loc, chunks) -> SourceData:
    import zarr

    if cfg.columns or cfg.label_column or cfg.id_column or cfg.exclude_columns:
        raise InputError(
            "zarr input has no named columns: remove input.columns/label_column/"
            "id_column/exclude_columns, or pass a Parquet/CSV file."
        )
    try:
        node = zarr.open(
            loc.zarr_store(),
            mode="r",
            **({} if loc.is_local else {"storage_options": cfg.storage_options}),
        )
    except Exception as exc:
        msg = " ".join(str(exc).split())[:300]
        raise InputError(
            f"{cfg.path} is not a readable zarr store ({type(exc).__name__}: "
            f"{msg}); restore it from a good copy or point input.path at an "
            "intact store."
        ) from exc
    if isinstance(node, zarr.Group):
        name = cfg.zarr_array or "X"
        if name not in node:
            raise InputError(
                f"{cfg.path} is a zarr group without an array {name!r}; set "
                f"input.zarr_array to one of {sorted(node.array_keys())}."
            )
        parent, node = node, node[name]
        if isinstance(node, zarr.Group):
            raise InputError(
                f"{cfg.path}: {name!r} is a zarr group, not an array; set "
                f"input.zarr_array to an array's path (arrays at the top: "
                f"{sorted(parent.array_keys())[:10]})."
            )
    check_matrix_dtype(node.dtype, cfg.path)
    if node.ndim != 2:
        raise InputError(f"{cfg.path}: array of shape {node.shape}; need 2-D.")
    if cfg.missing_chunks == "error":
        missing = missing_zarr_chunks(node)
        if missing:
            raise InputError(
                f"{cfg.path}: {describe_missing_chunks(node, missing)}; zarr would read them "
                "as zeros. Restore the store from a good copy, or set input.missing_chunks: "
                "fill if those chunks are meant to hold the fill value."
            )
    elif missing_zarr_chunks(node):
        logger.warning(
            "ingest: %s lacks chunk files; reading them as the fill value %r "
            "(input.missing_chunks: fill)",
            cfg.path,
            node.fill_value,
        )
    X = da.from_zarr(node)
    rows = rows_per_chunk(node.shape[1], chunks.target_chunk_mb)
    X = X.rechunk({0: rows, 1: -1})
    return SourceData(X=X.astype(np.float64), columns=[f"x{i}" for i in range(node.shape[1])])
