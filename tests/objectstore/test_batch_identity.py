"""A batch's listed identity on each store (issue 37): a night compares the files it
lists with the merged batches by path, size and ETag / object version (locally, the
modification time) before it reads any bytes. That is only safe if the store changes the
mark when the bytes change: checked here against the real servers, s3 (moto), gs
(gcp-storage-emulator) and az (azurite), and local disk. In this process, straight to the
servers (``Store.direct``: the az proxy's TLS is trusted by the commands a test starts,
not by an aiohttp already imported here)."""

from __future__ import annotations

import os

import pytest

from pipeline.series.batches import _listed_key, batch_identity, quick_key


def _same_size_other_bytes(data: bytes) -> bytes:
    return bytes(255 - b for b in data)


@pytest.mark.parametrize("object_store", ["s3", "gs", "az"], indirect=True)
def test_a_rewritten_object_is_a_new_batch_without_reading_it(object_store):
    store = object_store
    fs, opts = store.filesystem(), store.direct
    url = store.url("in", "2026-11-28", "a.parquet")
    data = os.urandom(4096)
    fs.pipe_file(store.path("in", "2026-11-28", "a.parquet"), data)
    ident = batch_identity(url, opts)
    key = quick_key(ident)
    assert key is not None, ident  # the store gives a mark: ETag or object version
    assert _listed_key(url, opts) == key
    # the same bytes under the same name again (a re-sent upload): may keep or change the
    # mark; other bytes of the same size under the same name must change it
    fs.pipe_file(store.path("in", "2026-11-28", "a.parquet"), _same_size_other_bytes(data))
    assert _listed_key(url, opts) != key
    again = batch_identity(url, opts)
    assert again["sha256"] != ident["sha256"] and again["size"] == ident["size"]


def test_a_local_file_rewritten_in_place_is_a_new_batch(tmp_path):
    path = tmp_path / "a.parquet"
    data = os.urandom(4096)
    path.write_bytes(data)
    ident = batch_identity(str(path))
    key = quick_key(ident)
    assert key is not None and ident["mtime"]
    assert _listed_key(str(path)) == key
    st = path.stat()
    path.write_bytes(_same_size_other_bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000))  # even a microsecond later
    assert _listed_key(str(path)) != key
