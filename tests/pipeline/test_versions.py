"""The publishing transaction itself (pipeline/output/versions.py) on local disk: the guarded
commit, retention, reading an earlier version, the pointer checked against the version,
and the clean-up of versions left by dead writers (only ours)."""

from __future__ import annotations

import json
import os

import pytest

from pipeline.errors import RunCorruptError, RunIncompleteError
from pipeline.output.lock import RunLock
from pipeline.output.store import Location, atomic_write_json
from pipeline.output.versions import (
    ConcurrentPublishError,
    Transaction,
    resolve,
    version_ids,
)


def publish(root: Location, n: int, keep: int = 7, grace: float | None = None) -> str:
    """One writer: a version holding ``data.json`` = n, published; its id."""
    from pipeline.output.publish import _mark_output

    with RunLock(root) as lock:
        _mark_output(root)
        txn = Transaction(root, lock, keep=keep, grace=grace)
        txn.begin()
        loc = txn.start()
        atomic_write_json(loc.child("data.json"), {"n": n})
        txn.commit({"status": "complete", "n": n})
        return txn.vid


def test_each_writer_publishes_a_new_version_and_readers_follow_the_pointer(tmp_path):
    root = Location(str(tmp_path / "out"))
    a = publish(root, 1)
    b = publish(root, 2)
    assert a < b  # ids sort by time
    pub = resolve(root)
    assert pub.version == b and pub.manifest == {"status": "complete", "n": 2}
    assert json.loads((pub.location.local_path / "data.json").read_text()) == {"n": 2}
    pointer = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert pointer["version_path"] == f"versions/{b}"
    assert [h["version"] for h in pointer["history"]] == [a]
    old = resolve(root, version=a)  # the series as of the first night
    assert json.loads((old.location.local_path / "data.json").read_text()) == {"n": 1}


def test_retention_keeps_the_last_n_and_forgets_older_ones(tmp_path):
    """With no grace period the versions beyond ``keep`` are deleted at once (the default
    grace period: tests/integrity/test_lifecycle_retention.py)."""
    root = Location(str(tmp_path / "out"))
    ids = [publish(root, i, keep=2, grace=0) for i in range(4)]
    assert version_ids(root) == ids[-2:]
    assert [h["version"] for h in resolve(root).pointer["history"]] == [ids[-2]]
    with pytest.raises(RunIncompleteError, match="no published version"):
        resolve(root, version=ids[0])


def test_commit_refuses_when_another_writer_published_meanwhile(tmp_path):
    root = Location(str(tmp_path / "out"))
    first = publish(root, 1)
    with RunLock(root) as lock:
        txn = Transaction(root, lock)
        txn.begin()
        txn.start()
        # another writer published while this one wrote (its lock was broken by hand)
        pointer = json.loads((tmp_path / "out" / "manifest.json").read_text())
        other = {**pointer, "version": "20990101T000000000000Z-aaaaaa", "n": 99}
        atomic_write_json(root.child("manifest.json"), other)
        before = (tmp_path / "out" / "manifest.json").read_bytes()
        with pytest.raises(ConcurrentPublishError, match="published by another writer"):
            txn.commit({"status": "complete", "n": 2})
        assert (tmp_path / "out" / "manifest.json").read_bytes() == before
    assert first in version_ids(root)


def test_commit_refuses_when_the_lock_is_no_longer_ours(tmp_path):
    root = Location(str(tmp_path / "out"))
    publish(root, 1)
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    with RunLock(root) as lock:
        txn = Transaction(root, lock)
        txn.begin()
        txn.start()
        record = json.loads((tmp_path / "out" / ".kpca-run.lock").read_text())
        (tmp_path / "out" / ".kpca-run.lock").write_text(
            json.dumps({**record, "token": "someone-else"})
        )
        with pytest.raises(ConcurrentPublishError, match="lock was broken or taken"):
            txn.commit({"status": "complete", "n": 2})
    assert (tmp_path / "out" / "manifest.json").read_bytes() == before


def test_the_pointer_and_the_versions_manifest_must_agree(tmp_path):
    root = Location(str(tmp_path / "out"))
    vid = publish(root, 1)
    m = tmp_path / "out" / "versions" / vid / "manifest.json"
    m.write_text(json.dumps({"status": "complete", "n": 5}))
    with pytest.raises(RunCorruptError, match="differ"):
        resolve(root)
    m.unlink()  # the pointer names a version that is gone: nothing to recover it from
    with pytest.raises(RunIncompleteError, match=f"names version {vid}, whose folder has no"):
        resolve(root)


def test_a_dead_writers_version_is_removed_by_the_next_writer_but_never_a_foreign_one(
    tmp_path,
):
    root = Location(str(tmp_path / "out"))
    vid = publish(root, 1)
    # a writer killed after creating its version (marked) and writing into it, an hour
    # ago (longer than a writer's lease: a younger one is left alone, test_lifecycle_*)
    dead = Transaction(root)
    dead.begin()
    dead.vid = "20200101T000000000000Z-dead00"
    dead_loc = dead.start().local_path
    (dead_loc / "half.bin").write_bytes(b"x" * 100)
    # a folder of the user's under versions/: no marker of ours
    theirs = tmp_path / "out" / "versions" / "notes"
    theirs.mkdir()
    (theirs / "mine.txt").write_text("mine")
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    assert resolve(root).version == vid  # nothing points to the dead version
    new = publish(root, 2)
    assert not dead_loc.exists()
    assert (theirs / "mine.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path / "out" / "versions")) == sorted([vid, new, "notes"])
    assert (tmp_path / "out" / "manifest.json").read_bytes() != before


def test_a_failed_writer_publishes_nothing_and_leaves_no_version(tmp_path):
    root = Location(str(tmp_path / "out"))
    vid = publish(root, 1)
    before = {
        str(p.relative_to(tmp_path)): p.read_bytes()
        for p in (tmp_path / "out").rglob("*")
        if p.is_file() and p.name != ".kpca-run.lock"
    }
    from pipeline.output.publish import publish_output

    def write(v):
        atomic_write_json(v.child("data.json"), {"n": 2})
        raise OSError("the store failed mid-write")

    with pytest.raises(OSError, match="mid-write"):
        publish_output(
            str(tmp_path / "out"),
            write=write,
            verify=lambda v: None,
            recheck=lambda: None,
            record={"kind": "kpca-dask-transform"},
        )
    after = {
        str(p.relative_to(tmp_path)): p.read_bytes()
        for p in (tmp_path / "out").rglob("*")
        if p.is_file() and p.name != ".kpca-run.lock"
    }
    assert after == before
    assert version_ids(root) == [vid]
