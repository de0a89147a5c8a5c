"""Missing data is never read as zeros, and intermediate stores are reused only when intact.

zarr reads an absent chunk file as the array's fill value (zeros), silently. Every reader of
inputs (the pipeline's zarr input, ``KernelPCA.fit/transform`` on a zarr array) and of our own
``work/ingest.zarr`` checks that each chunk exists; our stores are also compared with the
chunk digests recorded when they were written before they are reused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from kpca_dask import KernelPCA
from kpca_dask.exceptions import InvalidInputError
from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks
from pipeline.config import ChunkConfig, InputConfig
from pipeline.data.ingest import InputError, ingest, load_ingested
from pipeline.output.store import Location

X = np.random.default_rng(0).standard_normal((200, 4)) + 1.0


def _zarr(path: Path, data=X, chunks=(50, 4), **kw) -> zarr.Array:
    z = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype="f8", **kw)
    z[...] = data
    return z


def test_missing_chunks_listed_for_every_layout(tmp_path):
    plain = _zarr(tmp_path / "a.zarr")
    v2 = _zarr(tmp_path / "v2.zarr", zarr_format=2)
    sharded = _zarr(tmp_path / "s.zarr", chunks=(10, 4), shards=(50, 4))
    assert missing_zarr_chunks(plain) == missing_zarr_chunks(v2) == []
    assert missing_zarr_chunks(sharded) == []
    os.remove(tmp_path / "a.zarr" / "c" / "2" / "0")
    os.remove(tmp_path / "v2.zarr" / "3.0")
    os.remove(tmp_path / "s.zarr" / "c" / "1" / "0")
    assert missing_zarr_chunks(plain) == [(2, 0)]
    assert missing_zarr_chunks(v2) == [(3, 0)]
    assert missing_zarr_chunks(sharded) == [(1, 0)]
    assert describe_missing_chunks(plain, [(2, 0)]) == (
        "1 of 4 chunks is missing (the first: 'c/2/0', rows 100-149)"
    )
    # inside a group: the array's own prefix is listed
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    a = g.create_array("X", shape=(100, 3), chunks=(30, 3), dtype="f4")
    a[...] = 1.0
    os.remove(tmp_path / "g.zarr" / "X" / "c" / "0" / "0")
    assert missing_zarr_chunks(zarr.open_group(str(tmp_path / "g.zarr"))["X"]) == [(0, 0)]


def test_estimator_refuses_a_zarr_array_with_a_missing_chunk(tmp_path):
    z = _zarr(tmp_path / "x.zarr")
    model = KernelPCA(2, kernel="rbf", gamma=0.5).fit(z)  # intact: fine
    os.remove(tmp_path / "x.zarr" / "c" / "1" / "0")
    with pytest.raises(
        InvalidInputError,
        match=r"lacks chunks: 1 of 4 chunks is missing .*"
        r"'c/1/0', rows 50-99.*from_zarr",
    ):
        KernelPCA(2, kernel="rbf", gamma=0.5).fit(z)
    with pytest.raises(InvalidInputError, match="lacks chunks"):
        model.transform(z)


def _cfg(path, **kw) -> InputConfig:
    return InputConfig(path=str(path), **kw)


def test_zarr_input_with_a_missing_chunk_is_refused_unless_fill(tmp_path):
    _zarr(tmp_path / "x.zarr")
    os.remove(tmp_path / "x.zarr" / "c" / "3" / "0")
    store = Location(str(tmp_path / "work" / "ingest.zarr"))
    with pytest.raises(
        InputError,
        match=r"1 of 4 chunks is missing .*rows 150-199.*"
        r"input.missing_chunks: fill",
    ):
        ingest(_cfg(tmp_path / "x.zarr"), ChunkConfig(target_chunk_mb=0.002), store)
    assert not store.exists()  # nothing written
    res = ingest(
        _cfg(tmp_path / "x.zarr", missing_chunks="fill"),
        ChunkConfig(target_chunk_mb=0.002),
        store,
    )
    got = load_ingested(res).X.compute()
    np.testing.assert_array_equal(got[:150], X[:150])
    assert not got[150:].any()  # deliberately the fill value


def _npy_ingest(tmp_path, out="A"):
    if not (tmp_path / "x.npy").exists():
        np.save(tmp_path / "x.npy", X)
    store = Location(str(tmp_path / out / "work" / "ingest.zarr"))
    return ingest(_cfg(tmp_path / "x.npy"), ChunkConfig(target_chunk_mb=0.002), store), store


def test_damaged_ingest_store_is_rebuilt_not_reused(tmp_path):
    first, store = _npy_ingest(tmp_path)
    again, _ = _npy_ingest(tmp_path)
    assert again.reused and again.fingerprint == first.fingerprint
    chunk = store.local_path / "X" / "c" / "1" / "0"
    chunk.unlink()
    # read directly: refused, not zeros
    with pytest.raises(InputError, match=r"ingest store .* is damaged: array 'X'.*re-run"):
        load_ingested(first).X.compute()
    rebuilt, _ = _npy_ingest(tmp_path)
    assert not rebuilt.reused and chunk.exists()
    np.testing.assert_array_equal(load_ingested(rebuilt).X.compute(), X)
    # a chunk whose values changed (a valid chunk, other numbers): also rebuilt
    zarr.open_group(str(store.local_path), mode="r+")["X"][60, 1] = 1e6
    rebuilt, _ = _npy_ingest(tmp_path)
    assert not rebuilt.reused
    np.testing.assert_array_equal(load_ingested(rebuilt).X.compute(), X)


def test_zero_chunks_of_our_store_are_written(tmp_path):
    """zarr skips chunks equal to the fill value unless told: ours are all written, so a
    missing file is always damage."""
    data = X.copy()
    data[:100] = 0.0
    np.save(tmp_path / "z.npy", data)
    store = Location(str(tmp_path / "work" / "ingest.zarr"))
    res = ingest(_cfg(tmp_path / "z.npy"), ChunkConfig(target_chunk_mb=0.002), store)
    assert missing_zarr_chunks(zarr.open_group(str(store.local_path))["X"]) == []
    np.testing.assert_array_equal(load_ingested(res).X.compute(), data)


def test_copied_run_folder_uses_its_own_ingest_store(tmp_path):
    """`cp -a A B`: B's run reuses B's copy (intact, same source), never A's store."""
    first, _ = _npy_ingest(tmp_path, "A")
    shutil.copytree(tmp_path / "A", tmp_path / "B", symlinks=True)
    shutil.rmtree(tmp_path / "A")  # A gone: B must not depend on it
    res, store = _npy_ingest(tmp_path, "B")
    assert res.reused and Path(res.path) == store.local_path
    np.testing.assert_array_equal(load_ingested(res).X.compute(), X)


def test_source_edited_in_place_with_same_size_and_mtime_is_reingested(tmp_path):
    first, store = _npy_ingest(tmp_path)
    st = os.stat(tmp_path / "x.npy")
    other = X.copy()
    other[7, 2] += 1.0
    np.save(tmp_path / "x.npy", other)
    os.utime(tmp_path / "x.npy", ns=(st.st_atime_ns, st.st_mtime_ns))  # metadata unchanged
    assert os.stat(tmp_path / "x.npy").st_size == st.st_size
    res = ingest(_cfg(tmp_path / "x.npy"), ChunkConfig(target_chunk_mb=0.002), store)
    assert not res.reused and res.fingerprint != first.fingerprint
    np.testing.assert_array_equal(load_ingested(res).X.compute(), other)


def test_stale_ingest_says_why_a_store_cannot_be_reused(tmp_path):
    """The check the flows' cache applies to a cached ingest result (its key holds only the
    source's file metadata)."""
    from pipeline.data.ingest import stale_ingest

    _, store = _npy_ingest(tmp_path)
    cfg, chunks = _cfg(tmp_path / "x.npy"), ChunkConfig(target_chunk_mb=0.002)
    assert stale_ingest(cfg, chunks, store) is None
    assert "changed since it was ingested" in stale_ingest(
        cfg, ChunkConfig(target_chunk_mb=0.004), store
    )
    (store.local_path / "X" / "c" / "0" / "0").unlink()
    assert "damaged: array 'X': 1 of" in stale_ingest(cfg, chunks, store)
    assert "cannot be opened" in stale_ingest(cfg, chunks, Location(str(tmp_path / "none")))
