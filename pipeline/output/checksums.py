"""Content digests of arrays: a BLAKE2b digest per chunk (pipeline/output/verify.py's
``chunk_digest``) and the checksum of an array (pipeline/output/store.py's
``fingerprint_arrays`` hashes several)."""

from __future__ import annotations

import hashlib

import dask
import dask.array as da
import numpy as np
import zarr

from .verify import checked_array
from .verify import chunk_digest as _chunk_digest

__all__ = ["array_checksum", "digest_blocks"]


def digest_blocks(arr: da.Array) -> da.Array:
    """One 16-byte digest per chunk, in chunk order (computed in parallel)."""
    chunks = tuple((1,) * len(c) for c in arr.chunks) + ((16,),)
    return arr.map_blocks(_chunk_digest, chunks=chunks, new_axis=arr.ndim, dtype=np.uint8)


def array_checksum(arr: zarr.Array | da.Array, *, fix: str = "") -> str:
    """SHA-256 over per-chunk digests of an array's values (order-stable).

    A zarr array is read chunk by chunk through :func:`pipeline.output.verify.checked_array`: a
    chunk that cannot be decoded is a CorruptObjectError naming it (``fix``: what the
    message tells the reader to do), a store failure a StoreError."""
    if isinstance(arr, da.Array):
        d = arr
    else:
        d = checked_array(arr, fix=fix)
    (digests,) = dask.compute(digest_blocks(d))
    h = hashlib.sha256(f"{d.shape}:{d.dtype.str}".encode())
    h.update(np.ascontiguousarray(digests).tobytes())
    return "sha256:" + h.hexdigest()
