"""zarr input: a v3 array (or the array ``input.zarr_array`` of a group), its missing
chunks refused or read as the fill value as ``input.missing_chunks`` says."""

from __future__ import annotations

import logging
import math

import dask.array as da
import numpy as np

from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks

from ..checks.inputs import MAX_FILL_CHUNKS
from .base import InputError, SourceData, check_matrix_dtype, rows_per_chunk

__all__ = ["read_zarr"]

logger = logging.getLogger("pipeline")


_METADATA = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}


def _refuse_implausible_grid(cfg, node) -> int:
    """How many of the array's chunk objects are absent from its store, found in memory
    and time bounded by the objects the store holds, not by the grid the metadata claim.

    Maintenance: ``missing_zarr_chunks`` (kpca_dask/validation.py) lists every missing
    index, and ``np.ndindex`` materialises each axis's range: a ``zarr.json`` edited to
    claim 1e12 rows grew the client past 20 GB before anything was said (issue 36). So
    the grid size is compared with the listing first; only a plausible grid is enumerated
    (by the caller), and an implausible one is refused here in one line."""
    from zarr.core.sync import sync

    store_path = node.store_path
    prefix = store_path.path.strip("/")

    async def _keys() -> list[str]:
        return [k async for k in store_path.store.list_prefix(prefix)]

    present = {
        k[len(prefix) + 1 :] if prefix and k.startswith(prefix + "/") else k
        for k in sync(_keys())
    }
    grid = [int(g) for g in node._shard_grid_shape]
    total = math.prod(grid)
    encode = node.metadata.encode_chunk_key
    # the first absent index in C order: at most len(present) + 1 steps (each index
    # before it is present), never a walk over the claimed grid
    first = None
    for flat in range(min(total, len(present) + 1)):
        idx, rest = [], flat
        for g in reversed(grid):
            rest, i = divmod(rest, g)
            idx.append(i)
        idx = tuple(reversed(idx))
        if encode(idx) not in present:
            first = idx
            break
    if first is None:
        return 0
    held = sum(1 for k in present if k.rsplit("/", 1)[-1] not in _METADATA)
    n_missing = max(1, total - held)
    if cfg.missing_chunks == "error" and total <= MAX_FILL_CHUNKS:
        return n_missing  # small enough to list exactly (the caller's message)
    if cfg.missing_chunks == "fill" and n_missing <= MAX_FILL_CHUNKS:
        return n_missing
    step = (node.shards or node.chunks)[0]
    lo = first[0] * step
    raise InputError(
        f"{cfg.path}: its zarr.json claims shape {tuple(node.shape)} in {total} chunks but "
        f"the store holds {held} chunk object{'s' if held != 1 else ''}: at least "
        f"{n_missing} are missing (the first: {encode(first)!r}, rows "
        f"{lo}-{min(lo + step, node.shape[0]) - 1}); the metadata are damaged or the "
        "chunks lost. Restore the store from a good copy (or fix the shape in zarr.json)."
    )


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
    n_missing = _refuse_implausible_grid(cfg, node)
    if cfg.missing_chunks == "error":
        missing = missing_zarr_chunks(node) if n_missing else []
        if missing:
            raise InputError(
                f"{cfg.path}: {describe_missing_chunks(node, missing)}; zarr would read them "
                "as zeros. Restore the store from a good copy, or set input.missing_chunks: "
                "fill if those chunks are meant to hold the fill value."
            )
    elif n_missing:
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
