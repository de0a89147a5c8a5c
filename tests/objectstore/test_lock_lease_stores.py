"""Locks are leases on object stores (issue 36): the renewal is a conditional write on
each store (S3 ``If-Match``, GCS ``ifGenerationMatch``, Azure ``If-Match``), so it never
overwrites another writer's lock; on s3 (moto behind the fault proxy) an expired lock of
another host is broken with one line, a fresh one refused, a live holder in another
process keeps its lock over several leases, a holder whose renewals fail past its lease
publishes nothing, and a lock object that is not ours names the command that removes it.
The local-disk side: tests/reliability/test_lock_lease.py."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
import uuid

import pytest

from pipeline.output.lock import LOCK_NAME, LockHolder, OutputLockedError, RunLock, lock_status
from pipeline.output.store import Location
from tests.reliability.helpers import ROOT, env, kpca, wait_until
from tests.reliability.test_lock_lease import LEASE, dead_record

pytestmark = pytest.mark.cluster  # emulator and holder processes


def _out(store, options=None) -> Location:
    return Location.at(store.url(uuid.uuid4().hex[:8], "out"), options or store.storage_options)


def _record(store, out: Location) -> dict:
    fs = store.filesystem()
    return json.loads(fs.cat_file(out.child(LOCK_NAME).fs_path))


def _start_holder(out: Location, host: str, prelude: str = "") -> subprocess.Popen:
    """A real process holding ``out``'s lock as host ``host`` (no flock on an object
    store: only the lease speaks for it) with a LEASE-second lease, until its stdin ends."""
    script = prelude + (
        f"import socket, sys\nsocket.gethostname = lambda: {host!r}\n"
        "from pipeline.output.lock import RunLock\nfrom pipeline.output.store import Location\n"
        f"lock = RunLock(Location({out.url!r}, {out.storage_options!r})).acquire()\n"
        "print('held', flush=True)\nsys.stdin.readline()\nlock.release()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env(DASK_KPCA__LOCK_LEASE=str(LEASE)),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if p.stdout.readline().strip() != "held":
        p.kill()
        raise AssertionError(p.stderr.read()[-3000:])
    return p


def _put(store, out: Location, data: bytes) -> None:
    store.filesystem().pipe_file(out.child(LOCK_NAME).fs_path, data)


@pytest.mark.parametrize("object_store", ["s3", "gs", "az"], indirect=True)
def test_renewal_is_conditional_and_never_overwrites_another_writers_lock(object_store):
    """The holder renews (``renewed`` moves) through the store's conditional write; once
    another writer has replaced the lock object, the next renewal leaves that object as it
    is and the holder knows it lost the lock (its token no longer matches: it publishes
    nothing); releasing does not remove the other writer's lock."""
    out = _out(object_store, object_store.direct)  # in this process: straight to the server
    lock = RunLock(out, lease=6).acquire()  # roomy: renewals slow down on a busy machine
    try:
        first = _record(object_store, out)
        assert wait_until(lambda: _record(object_store, out)["renewed"] != first["renewed"], 20)
        assert lock.lost is None
        theirs = {**first, "host": "node-b", "pid": 7, "token": "theirs"}
        # written between two renewals (not inside one: the GCS emulator ignores
        # ifGenerationMatch, so only the check before the write guards it there; the
        # write's own condition: the next test)
        with lock._io:
            _put(object_store, out, json.dumps(theirs).encode())
        assert wait_until(lambda: lock.lost is not None, 20)
        assert "taken by another writer: host node-b, pid 7" in lock.lost
        time.sleep(4.5)  # two more renewal periods: nothing is written any more
        assert _record(object_store, out) == theirs
        assert lock.holder.token not in ("theirs", first["token"])
    finally:
        lock.release()
    assert _record(object_store, out) == theirs


@pytest.mark.parametrize("object_store", ["s3", "az"], indirect=True)
def test_the_stores_conditional_write_refuses_a_stale_version(object_store):
    """Between the holder's check of its lock and its write, another writer may replace
    it: the write itself is conditional (S3 ``If-Match``, Azure ``If-Match``), refused
    by the server for a version that is no longer the object's, which stays as it is.
    (The GCS emulator ignores ``ifGenerationMatch``: there the check before the write is
    what the test above shows.)"""
    from pipeline.output.lock_objects import _conditional_put, _object_version

    out = _out(object_store, object_store.direct)
    loc = out.child(LOCK_NAME)
    _put(object_store, out, b'{"host": "a", "pid": 1}')
    mine = _object_version(loc)
    assert _conditional_put(loc, b'{"host": "a", "pid": 2}', mine)
    stale, now = mine, _object_version(loc)
    assert stale != now
    assert not _conditional_put(loc, b'{"host": "a", "pid": 3}', stale)
    assert json.loads(object_store.filesystem().cat_file(loc.fs_path))["pid"] == 2


@pytest.mark.parametrize(
    "record",
    [
        dead_record(renewed_ago=30, started_ago=3600, lease=2),
        dead_record(renewed_ago=None, started_ago=8 * 86400),
    ],
    ids=["lease-lapsed", "eight-days-old"],
)
def test_expired_lock_of_another_host_is_broken_on_s3(s3_store, caplog, record):
    out = _out(s3_store)
    _put(s3_store, out, json.dumps(record).encode())
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        with RunLock(out) as lock:
            assert _record(s3_store, out)["token"] == lock.holder.token
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"lock: breaking the expired lock of {out}: its holder (host node-17, pid 4242, "
        f"started {record['started']} by etl, "
    )
    assert not s3_store.filesystem().exists(out.child(LOCK_NAME).fs_path)


def test_fresh_lock_of_another_host_is_refused_on_s3(s3_store):
    out = _out(s3_store)
    record = dead_record(renewed_ago=1, started_ago=3600, lease=600)
    _put(s3_store, out, json.dumps(record).encode())
    with pytest.raises(OutputLockedError, match="locked by a run on another host"):
        RunLock(out).acquire()
    assert _record(s3_store, out) == record


@pytest.mark.slow  # several lease periods of a real holder process
def test_live_holder_of_another_host_keeps_its_lock_on_s3(s3_store):
    """A real process holding the lock as another host (its own host name; no flock on an
    object store: only the lease speaks for it) with a 3 s lease: refused to a
    contender over three lease periods; killed, its lock is broken once the lease lapses."""
    out = _out(s3_store)
    p = _start_holder(out, "node-a")
    try:
        seen = set()
        t_end = time.monotonic() + 3 * LEASE
        while time.monotonic() < t_end:
            status, holder = lock_status(out)
            assert status == "foreign" and holder.host == "node-a"
            seen.add(holder.renewed)
            with pytest.raises(OutputLockedError, match="locked by a run on another host"):
                RunLock(out).acquire()
            time.sleep(0.2)
        assert len(seen) >= 4  # renewed every LEASE / 3
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert wait_until(lambda: lock_status(out)[0] == "expired", 3 * LEASE)
    with RunLock(out) as lock:
        assert lock.holder.host != "node-a"


@pytest.mark.slow  # several lease periods of a real holder process
def test_holder_whose_renewals_fail_past_its_lease_publishes_nothing(s3_store):
    """Every write of the lock object answered 500 for longer than the lease: the holder
    cannot know whether another host broke its lock, so it publishes nothing (its commit
    is refused in one line) and the published version stays."""
    from pipeline.output.versions import ConcurrentPublishError, Transaction, read_pointer
    from tests.pipeline.test_versions import publish

    out = _out(s3_store)
    publish(out, 1)
    before = read_pointer(out)
    lock = RunLock(out, lease=1.0).acquire()
    try:
        txn = Transaction(out, lock)
        txn.begin()
        txn.start()
        s3_store.proxy.fault("error", methods=("PUT",), path_contains=LOCK_NAME)
        assert wait_until(lambda: lock.lost is not None, 30)
        s3_store.proxy.clear()
        assert (
            _record(s3_store, out)["token"]
            == LockHolder.from_dict(_record(s3_store, out)).token
        )  # the record is still the holder's own...
        with pytest.raises(ConcurrentPublishError, match="lock was broken or taken"):
            txn.commit({"status": "complete", "n": 2})  # ...yet nothing is published
        txn.discard()
    finally:
        s3_store.proxy.clear()
        lock.release()
    assert read_pointer(out) == before


def test_lock_object_that_is_not_ours_is_refused_with_the_command_on_s3(s3_store):
    out = _out(s3_store)
    _put(s3_store, out, b"\x00garbage")
    with pytest.raises(OutputLockedError) as err:
        RunLock(out).acquire()
    assert f"remove it with `kpca unlock --force {out}`" in str(err.value)
    res = kpca("unlock", out.url, "--storage-options", s3_store.options_json)
    assert res.returncode == 2 and "kpca unlock --force" in res.stderr
    res = kpca("unlock", "--force", out.url, "--storage-options", s3_store.options_json)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not s3_store.filesystem().exists(out.child(LOCK_NAME).fs_path)
    with RunLock(out):
        pass


def test_the_next_writer_removes_stale_probe_objects_on_s3(s3_store):
    """Probe objects a killed run left in the output and its work folder (20 minutes old,
    and one of an earlier format) go when the next writer takes the lock; a fresh one of
    a probe under way stays, and so does everything else."""
    from pipeline.runtime.probe_files import PROBE_PREFIX
    from tests.reliability.test_lock_lease import probe_names

    out = _out(s3_store)
    fs = s3_store.filesystem()
    stale = probe_names(1200) + [f"{PROBE_PREFIX}{'c0ffee' * 5}"]
    fresh = probe_names(30)
    for folder in (out, out.child("work")):
        for name in stale + fresh:
            fs.pipe_file(folder.child(name).fs_path, b"x")
    fs.pipe_file(out.child("work", "mine.txt").fs_path, b"kept")
    with RunLock(out):
        pass
    left = sorted(k.rsplit("/", 1)[-1] for k in fs.find(out.fs_path))
    assert left == sorted([*fresh, *fresh, "mine.txt"])


@pytest.mark.parametrize(
    "skew",
    [-7200, pytest.param(7200, marks=pytest.mark.slow)],
    ids=["behind-2h", "ahead-2h"],
)
def test_a_holder_whose_clock_is_hours_off_keeps_its_lock_until_it_dies_on_s3(s3_store, skew):
    """A live holder on a host whose clock is two hours behind (ahead) the store's: its
    record's times are kept in the store's clock, so a contender on a right clock refuses
    to break it while it renews (before: broken at once, "not renewed for 7200 s", and
    two writers published) and breaks it once its lease lapses after it died (before,
    ahead: not for two hours)."""
    from tests.reliability.test_lock_lease import _SKEWED_CLOCK

    out = _out(s3_store)
    p = _start_holder(out, "node-skew", prelude=_SKEWED_CLOCK.format(skew=skew))
    try:
        t_end = time.monotonic() + 2 * LEASE
        while time.monotonic() < t_end:
            status, holder = lock_status(out)
            assert status == "foreign" and holder.host == "node-skew", status
            with pytest.raises(OutputLockedError, match="locked by a run on another host"):
                RunLock(out).acquire()
            time.sleep(0.3)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert wait_until(lambda: lock_status(out)[0] == "expired", 4 * LEASE)
    with RunLock(out) as lock:
        assert lock.holder.host != "node-skew"
