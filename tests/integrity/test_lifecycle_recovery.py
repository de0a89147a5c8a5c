"""An output's whole life at the level of its publishing transaction
(pipeline/output/versions.py),
on local disk and on an S3-protocol server (moto, a process on 127.0.0.1): readers of
every kept version across retention, retention's grace period and holds, a lost or
damaged pointer recovered by readers (read-only) and by the next writer (which keeps every
version), and the clean-up of only the versions proven unpublished.

Each night here is a real transform-like output written and published by
:func:`pipeline.output.publish.publish_output` (the lock, the transaction, a zarr group of a
dense ``embedding`` whose values are the night's number + 1: zeros are never right).
"""

from __future__ import annotations

import json
import logging
import uuid

import numpy as np
import pytest

from pipeline.errors import RunIncompleteError
from pipeline.output.completeness import DENSE
from pipeline.output.store import Location, atomic_write_json
from pipeline.output.versions import (
    EXPIRED,
    Transaction,
    VersionRemovedError,
    held_versions,
    new_version_id,
    read_pointer,
    resolve,
    version_ids,
)
from tests.objectstore.conftest import (  # noqa: F401
    az_proxy,
    az_store,
    azurite,
    gcs_emulator,
    gcs_proxy,
    gcs_store,
    s3_bucket,
    s3_env,
    s3_server,
    tls_cert,
)

ROWS, COLS, CHUNK = 40, 3, 10


#: the S3 cases take 5-20 s each (a lock and a publish per night on the server): `-m slow`,
#: but for the reader of a removed version, the promise the issue is about
S3 = pytest.param("s3", marks=[pytest.mark.cluster, pytest.mark.slow])
S3_FAST = pytest.param("s3", marks=pytest.mark.cluster)
#: gs and az (the emulators behind the fault proxy): where the store matters -- how a
#: missing object of a removed version is reported to the guard (gcsfs and adlfs each
#: their own way)
GS = pytest.param("gs", marks=pytest.mark.cluster)
AZ = pytest.param("az", marks=pytest.mark.cluster)


@pytest.fixture(params=["local", S3])
def out(request, tmp_path) -> Location:
    """The output of the nights: a local folder, or a prefix of a new bucket on the
    S3-protocol server."""
    if request.param == "local":
        return Location(str(tmp_path / "out.zarr"))
    if request.param in ("gs", "az"):
        store = request.getfixturevalue({"gs": "gcs_store", "az": "az_store"}[request.param])
        url = store.url(uuid.uuid4().hex[:6], "out.zarr")
        # in this process: straight to the emulator (the proxy's TLS, which adlfs needs,
        # is for the commands a test starts)
        return Location.at(url, store.direct)
    server = request.getfixturevalue("s3_server")
    request.getfixturevalue("s3_env")
    bucket = request.getfixturevalue("s3_bucket")
    return Location.at(f"s3://{bucket}/{uuid.uuid4().hex[:6]}/out.zarr", server.storage_options)


def night(out: Location, n: int, *, keep: int = 7, grace: float | None = None) -> str:
    """Publish night ``n``: a version holding ``embedding`` = n + 1; its version id."""
    from pipeline.output.publish import publish_output

    def write(version: Location) -> None:
        g = version.open_group("a")
        z = g.create_array(
            "embedding", shape=(ROWS, COLS), chunks=(CHUNK, COLS), dtype="f8", config=DENSE
        )
        z[...] = np.full((ROWS, COLS), n + 1.0)
        g.attrs["status"] = "complete"

    pointer = publish_output(
        out.url,
        write=write,
        verify=lambda v: None,
        recheck=lambda: None,
        record={"kind": "kpca-dask-transform", "format": "zarr", "data": ".", "rows": ROWS},
        storage_options=out.storage_options,
        keep=keep,
        grace=grace,
    )
    return pointer["version"]


def expect(n: int) -> np.ndarray:
    return np.full((ROWS, COLS), n + 1.0)


def pointer_of(out: Location) -> dict:
    p = read_pointer(out)
    assert p is not None
    return p


def write_text(loc: Location, text: str) -> None:
    if loc.is_local:
        loc.local_path.parent.mkdir(parents=True, exist_ok=True)
        loc.local_path.write_text(text)
    else:
        with loc.fs.open(loc.fs_path, "w") as f:
            f.write(text)
        loc.refresh()


def remove_pointer(out: Location) -> None:
    m = out.child("manifest.json")
    if m.is_local:
        m.local_path.unlink()
    else:
        m.fs.rm(m.fs_path)
        m.refresh()


# ------------------------------------------------------------------ readers and retention
def test_readers_of_every_kept_version_read_it_whole_across_retention(out):
    """Default keep (7) and grace (24 h): readers holding each of the 7 kept versions read
    every row after 3 more nights expired the 3 oldest; once those are deleted (a writer
    with no grace period), their readers fail in one line naming the output, the version
    and the fix -- never zeros -- and the kept ones still read whole."""
    ids = [night(out, n) for n in range(7)]
    readers = {n: resolve(out, version=v) for n, v in enumerate(ids)}
    arrays = {n: pub.location.open_group("r")["embedding"] for n, pub in readers.items()}
    later = [night(out, n) for n in range(7, 10)]
    assert set(ids + later) == set(version_ids(out))  # expired, still on the store
    p = pointer_of(out)
    assert [h["version"] for h in p["history"] if EXPIRED not in h] == (ids + later)[-7:-1][
        ::-1
    ]
    assert {h["version"] for h in p["history"] if EXPIRED in h} == set(ids[:3])
    for n, z in arrays.items():  # the array objects opened before retention
        np.testing.assert_array_equal(z[...], expect(n))
    # the grace period over (a writer with none): the 3 expired versions are deleted
    night(out, 10, grace=0)  # also expires (and so deletes) the 4th oldest
    assert not set(ids[:4]) & set(version_ids(out))
    for n, z in arrays.items():
        if n < 4:
            with pytest.raises(VersionRemovedError) as err:
                z[...]
            msg = str(err.value)
            assert "\n" not in msg and ids[n] in msg and str(out) in msg, msg
            assert "removed by retention" in msg and "open the output again" in msg
            with pytest.raises(VersionRemovedError, match="removed by retention"):
                readers[n].location.open_group("r")  # opened again from the stale handle
        else:
            np.testing.assert_array_equal(z[...], expect(n))


@pytest.mark.parametrize("out", ["local", S3_FAST, GS, AZ], indirect=True)
def test_keep_one_a_reader_of_the_previous_night_reads_it_whole_then_one_line(out):
    """keep_versions 1: the next night expires the version a reader holds; with the
    default grace period it still reads whole; once deleted it fails in one line."""
    first = night(out, 0, keep=1)
    reader = resolve(out)
    z = reader.location.open_group("r")["embedding"]
    night(out, 1, keep=1)
    assert first in version_ids(out)
    np.testing.assert_array_equal(z[...], expect(0))
    with pytest.raises(RunIncompleteError, match="no published version"):
        resolve(out, version="20200101T000000000000Z-000000")
    night(out, 2, keep=1, grace=0)
    assert version_ids(out) == [resolve(out).version]
    with pytest.raises(VersionRemovedError, match=f"version {first} was removed by retention"):
        z[5:15]
    np.testing.assert_array_equal(
        resolve(out).location.open_group("r")["embedding"][...], expect(2)
    )


def test_holds_keep_what_a_lineage_names_and_a_garbage_hold_keeps_everything(out, caplog):
    """A version named by a hold (``<out>/holds/*.json``) is never deleted and stays
    readable by ``version=``; a hold that cannot be read holds every version (one WARNING
    line); once the hold is gone the version is deleted."""
    a = night(out, 0, keep=1, grace=0)
    hold = out.child("holds", "series.json")
    write_text(
        hold,
        json.dumps(
            {
                "written_by": "kpca-dask",
                "kind": "hold",
                "holder": "s3://elsewhere/series/night-2",
                "versions": [a],
                "updated": "2026-11-28T00:00:00+00:00",
            }
        ),
    )
    assert held_versions(out) == {a}
    b = night(out, 1, keep=1, grace=0)
    c = night(out, 2, keep=1, grace=0)
    assert a in version_ids(out) and b not in version_ids(out)  # b expired, held by nothing
    np.testing.assert_array_equal(
        resolve(out, version=a).location.open_group("r")["embedding"][...], expect(0)
    )
    garbage = out.child("holds", "broken.json")
    write_text(garbage, '{"written_by": "kpca-dask", "kind": "ho')
    caplog.set_level(logging.WARNING, logger="pipeline")
    caplog.clear()
    held = held_versions(out)
    assert c in held and "anything" in held  # holds everything
    lines = [r.getMessage() for r in caplog.records if "broken.json" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    d = night(out, 3, keep=1, grace=0)
    assert {a, c, d} <= set(version_ids(out))  # nothing deleted on doubt
    for loc in (garbage, hold):
        if loc.is_local:
            loc.local_path.unlink()
        else:
            loc.fs.rm(loc.fs_path)
            loc.refresh()
    e = night(out, 4, keep=1, grace=0)
    assert version_ids(out) == [e]


# ------------------------------------------------------------------ a lost or damaged pointer
def test_a_lost_pointer_costs_no_version_readers_recover_and_the_next_writer_rebuilds(
    out, caplog
):
    ids = [night(out, n) for n in range(3)]
    remove_pointer(out)
    caplog.set_level(logging.WARNING, logger="pipeline")
    caplog.clear()
    pub = resolve(out)  # a reader: the newest verified version, nothing written
    assert pub.version == ids[-1]
    assert [h["version"] for h in pub.history] == ids[::-1]
    np.testing.assert_array_equal(pub.data.open_group("r")["embedding"][...], expect(2))
    warn = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warn) == 1 and "read-only" in warn[0] and ids[-1] in warn[0], warn
    assert read_pointer(out) is None
    new = night(out, 3)  # the next writer keeps every published version
    assert set(version_ids(out)) == set(ids) | {new}
    p = pointer_of(out)
    assert p["version"] == new
    assert [h["version"] for h in p["history"]] == ids[::-1]
    for n, v in enumerate(ids):
        got = resolve(out, version=v).location.open_group("r")["embedding"][...]
        np.testing.assert_array_equal(got, expect(n))


@pytest.mark.parametrize("damage", ["truncated", "not json", "a version's manifest"])
def test_a_damaged_pointer_is_rebuilt_from_the_newest_verified_version(out, damage, caplog):
    ids = [night(out, n) for n in range(3)]
    m = out.child("manifest.json")
    text = json.dumps(pointer_of(out), indent=2)
    if damage == "truncated":
        write_text(m, text[: len(text) // 2])
    elif damage == "not json":
        write_text(m, "<?xml version='1.0'?><Error>garbage</Error>")
    else:
        vm = out.child("versions", ids[0], "manifest.json")
        write_text(m, json.dumps(json.loads(vm.fs.cat(vm.fs_path))))
    caplog.set_level(logging.WARNING, logger="pipeline")
    pub = resolve(out)
    assert pub.version == ids[-1]
    np.testing.assert_array_equal(pub.data.open_group("r")["embedding"][...], expect(2))
    assert any("recovery" in r.getMessage() for r in caplog.records)
    new = night(out, 3)
    assert set(version_ids(out)) == set(ids) | {new}
    p = pointer_of(out)
    assert p["version"] == new and [h["version"] for h in p["history"]] == ids[::-1]


def test_a_pointer_naming_a_removed_version_is_recovered_not_refused(out, caplog):
    """The published version's folder is deleted (by hand, a lifecycle rule): the pointer
    names a version that is not there. Readers read the newest version that verifies
    (one WARNING line, read-only); the next writer rewrites the pointer and keeps every
    other version. Before: every reader and night refused with "version ... named by its
    manifest is missing"."""
    ids = [night(out, n) for n in range(3)]
    gone = out.child("versions", ids[-1])
    gone.fs.rm(gone.fs_path, recursive=True)
    gone.refresh()
    caplog.set_level(logging.WARNING, logger="pipeline")
    caplog.clear()
    pub = resolve(out)
    assert pub.version == ids[1]
    np.testing.assert_array_equal(pub.data.open_group("r")["embedding"][...], expect(1))
    warn = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warn) == 1 and ids[-1] in warn[0] and "read-only" in warn[0], warn
    assert pointer_of(out)["version"] == ids[-1]  # a reader writes nothing
    new = night(out, 3)
    assert set(version_ids(out)) == set(ids[:2]) | {new}
    p = pointer_of(out)
    assert p["version"] == new and [h["version"] for h in p["history"]] == ids[1::-1]


def test_rebuild_skips_a_newest_version_that_does_not_verify(out):
    """The newest complete version lacks a chunk: the pointer is rebuilt from the one
    before it (a damaged version is never published by recovery)."""
    ids = [night(out, n) for n in range(2)]
    chunk = out.child("versions", ids[-1], "embedding", "c", "1", "0")
    chunk.fs.rm(chunk.fs_path)
    chunk.refresh()
    remove_pointer(out)
    assert resolve(out).version == ids[0]
    new = night(out, 2)
    assert set(version_ids(out)) == set(ids) | {new}
    assert pointer_of(out)["history"][0]["version"] == ids[0]


# ------------------------------------------------------------------ dead writers
def dead_writer(out: Location, vid: str, *, complete: bool) -> None:
    """A writer killed after it began version ``vid`` (marked, a chunk written), its
    manifest written or not."""
    txn = Transaction(out)
    txn.vid = vid
    loc = txn.start()
    write_text(loc.child("half.bin"), "x" * 100)
    if complete:
        atomic_write_json(loc.child("manifest.json"), {"status": "complete", "n": -1})


def test_only_versions_proven_unpublished_are_removed(out, caplog):
    """Versions no pointer names: an incomplete one begun longer ago than a writer's lease
    is removed (one WARNING line), a young incomplete one is left for a later writer, a
    complete one is never removed by the next writer: it is expired and deleted only after
    the grace period."""
    first = night(out, 0)
    old = "20200101T000000000000Z-dead01"
    young = new_version_id()  # begun now: within a writer's lease
    complete = "20200101T000000000000Z-done01"
    dead_writer(out, old, complete=False)
    dead_writer(out, young, complete=False)
    dead_writer(out, complete, complete=True)
    caplog.set_level(logging.WARNING, logger="pipeline")
    caplog.clear()
    second = night(out, 1)
    on_store = set(version_ids(out))
    assert old not in on_store
    assert {young, complete, first, second} <= on_store
    lines = [r.getMessage() for r in caplog.records if old in r.getMessage()]
    assert len(lines) == 1 and "did not finish" in lines[0], lines
    assert not [
        r for r in caplog.records if young in r.getMessage() or complete in r.getMessage()
    ]
    p = pointer_of(out)
    assert [h["version"] for h in p["history"] if EXPIRED in h] == [complete]
    night(out, 2, grace=0)
    assert complete not in version_ids(out) and young in version_ids(out)
    assert first in version_ids(out) and second in version_ids(out)


def test_a_transform_output_with_a_damaged_pointer_is_still_the_transforms_to_replace(
    tmp_path,
):
    """``kpca transform --overwrite`` to an output whose pointer was cut short: judged by
    the pointer its versions rebuild (a transform output), not refused as "not written by
    kpca transform" every night."""
    from pipeline.output.publish import check_transform_output

    out = Location(str(tmp_path / "emb.zarr"))
    night(out, 0)
    m = out.local_path / "manifest.json"
    m.write_text(m.read_text()[:40])
    got = check_transform_output(
        out.url, model_path=str(tmp_path / "model-run"), inputs=[], overwrite=True
    )
    assert got.url == out.url
    night(out, 1)
    assert len(version_ids(out)) == 2
