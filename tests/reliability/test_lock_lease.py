"""Locks are leases (issue 36), on local disk: the holder renews its lock while it holds
it; a lock of another host not renewed within its lease -- a dead run's, whatever its age,
a record of the previous release included -- is broken by the next writer with one line
naming the dead holder; a fresh one is refused; a holder that could not renew within its
lease publishes nothing; a lock path that is not ours is refused with the command that
removes it. Short leases (1-3 s, ``DASK_KPCA__LOCK_LEASE``) keep the tests fast.
The object-store side: tests/objectstore/test_lock_lease_stores.py."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from pipeline.output.lock import (
    LOCK_NAME,
    LockHolder,
    OutputLockedError,
    RunLock,
    lease_seconds,
    lock_status,
)
from pipeline.output.store import Location

from .helpers import ROOT, env, wait_until

pytestmark = pytest.mark.cluster  # some of its tests start processes

LEASE = 3.0  # seconds: the lease the tests' holders take (short, with room for a busy machine)


def cli(*args) -> tuple[int, str, str]:
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def _ago(seconds: float) -> str:
    t = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    return t.isoformat(timespec="seconds")


def dead_record(*, renewed_ago: float | None, started_ago: float, lease=600) -> dict:
    """The lock record of a run on another host (``renewed_ago`` None: a record of the
    previous release, which had no ``renewed`` nor ``lease``)."""
    record = {
        "host": "node-17",
        "pid": 4242,
        "started": _ago(started_ago),
        "process_started": 1.0,
        "boot_id": "other-boot",
        "user": "etl",
        "token": "dead-run",
    }
    if renewed_ago is not None:
        record.update(renewed=_ago(renewed_ago), lease=lease)
    return record


def _holder_script(out, *, host: str | None, then: str = "sys.stdin.readline()") -> str:
    """A real process that takes the lock (as host ``host``: another machine's name),
    prints 'held', then runs ``then``."""
    fake_host = f"socket.gethostname = lambda: {host!r}\n" if host else ""
    return (
        "import os, signal, socket, sys, json\n"
        f"{fake_host}"
        "from pipeline.output.lock import RunLock\nfrom pipeline.output.store import Location\n"
        f"lock = RunLock(Location({str(out)!r})).acquire()\nprint('held', flush=True)\n"
        f"{then}\nlock.release()\n"
    )


def _start(script: str, lease: float = LEASE) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env(DASK_KPCA__LOCK_LEASE=str(lease)),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    line = p.stdout.readline().strip()
    assert line == "held", p.stderr.read()[-3000:] if p.poll() is not None else line
    return p


@pytest.mark.parametrize(
    "record",
    [
        dead_record(renewed_ago=30, started_ago=3600, lease=2),
        dead_record(renewed_ago=None, started_ago=8 * 86400),  # the previous release's
    ],
    ids=["lease-lapsed", "eight-days-old"],
)
def test_expired_lock_of_another_host_is_broken_with_one_line(tmp_path, caplog, record):
    """A lock of a dead run on another host (nightly jobs get a new host name each night):
    the next run breaks it once it is not renewed within its lease -- an 8-day-old record
    of the previous release counts from its start -- with one warning naming the holder
    (host, pid, start, last renewal), and takes the lock."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps(record))
    assert lock_status(Location(str(out)))[0] == "expired"
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        with RunLock(Location(str(out))) as lock:
            assert json.loads((out / LOCK_NAME).read_text())["token"] == lock.holder.token
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    last = (
        f"last renewed {record['renewed']}"
        if "renewed" in record
        else "never renewed (a lock of an earlier release)"
    )
    assert lines[0].startswith(
        f"lock: breaking the expired lock of {out}: its holder (host node-17, pid 4242, "
        f"started {record['started']} by etl, {last}, lease "
    ), lines[0]
    assert not (out / LOCK_NAME).exists()  # released


def test_live_holder_renews_across_lease_periods_then_its_death_frees_the_output(tmp_path):
    """A live holder in another process (as another host would: its own host name) with a
    3 s lease keeps its lock over three lease periods: it renews the record (``renewed``
    moves, never older than the lease) and a contender is refused all along. Killed, it
    stops renewing; the contender breaks the lock once the lease has lapsed."""
    out = tmp_path / "out"
    p = _start(_holder_script(out, host="node-a"))
    try:
        first = json.loads((out / LOCK_NAME).read_text())
        assert first["host"] == "node-a" and first["lease"] == LEASE
        seen = set()
        t_end = time.monotonic() + 3 * LEASE
        while time.monotonic() < t_end:
            rec = LockHolder.from_dict(json.loads((out / LOCK_NAME).read_text()))
            assert rec is not None and rec.token == first["token"]
            assert not rec.expired()
            seen.add(rec.renewed)
            with pytest.raises(OutputLockedError):
                RunLock(Location(str(out))).acquire()
            time.sleep(0.2)
        assert len(seen) >= 4  # renewed every LEASE / 3
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    # dead: its flock is gone, but it was another host's lock -- the lease decides
    with pytest.raises(OutputLockedError, match="locked by a run on another host"):
        RunLock(Location(str(out))).acquire()
    assert wait_until(lambda: lock_status(Location(str(out)))[0] == "expired", 3 * LEASE)
    with RunLock(Location(str(out))) as lock:
        assert lock.holder.host != "node-a"


def test_released_lock_is_no_longer_renewed(tmp_path):
    """Renewal stops on release: the record is removed and not written again."""
    out = tmp_path / "out"
    lock = RunLock(Location(str(out)), lease=0.6).acquire()
    t0 = json.loads((out / LOCK_NAME).read_text())["renewed"]
    assert wait_until(lambda: json.loads((out / LOCK_NAME).read_text())["renewed"] != t0, 3)
    lock.release()
    time.sleep(1.0)  # five renewal periods
    assert not (out / LOCK_NAME).exists()


def test_a_holder_frozen_past_its_lease_publishes_nothing(tmp_path):
    """A holder that could not renew within its lease (frozen by SIGSTOP for twice its
    lease: its renewals did not run) may have lost the lock to another host: resumed, it
    publishes nothing (one line), and the published version stays."""
    from tests.pipeline.test_versions import publish

    root = tmp_path / "out"
    publish(Location(str(root)), 1)
    before = (root / "manifest.json").read_bytes()
    then = (
        "from pipeline.output.versions import Transaction\n"
        "txn = Transaction(lock.out, lock); txn.begin(); txn.start()\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
        "try:\n    txn.commit({'status': 'complete', 'n': 2}); print('published', flush=True)\n"
        "except Exception as exc:\n    print('refused', exc, flush=True)\n"
    )
    p = _start(_holder_script(root, host=None, then=then), lease=1.0)
    try:
        assert p.stdout.readline().strip() == "ready"
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(2.5)
        os.kill(p.pid, signal.SIGCONT)
        out, err = p.communicate("go\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert out.startswith("refused"), (out, err[-2000:])
    assert "lock was broken or taken by another writer" in out
    assert "lock: lost the lock of" in err
    assert (root / "manifest.json").read_bytes() == before


def test_a_renewal_never_overwrites_another_writers_lock(tmp_path):
    """Another writer took the lock (its record replaced ours): the holder's renewal finds
    it, leaves that record as it is, and the holder's token no longer matches (it publishes
    nothing)."""
    out = tmp_path / "out"
    lock = RunLock(Location(str(out)), lease=2).acquire()
    try:
        record = json.loads((out / LOCK_NAME).read_text())
        theirs = {**record, "host": "node-b", "pid": 7, "token": "theirs"}
        (out / LOCK_NAME).write_text(json.dumps(theirs))
        assert wait_until(lambda: lock.lost is not None, 10)
        assert "taken by another writer: host node-b, pid 7" in lock.lost
        time.sleep(1.5)
        assert json.loads((out / LOCK_NAME).read_text()) == theirs
        assert lock.holder.token != "theirs" and lock.holder.token != record["token"]
    finally:
        lock.release()
    assert json.loads((out / LOCK_NAME).read_text()) == theirs  # not ours to remove


@pytest.mark.parametrize("what", ["garbage", "foreign-json", "folder"])
def test_a_lock_path_that_is_not_ours_names_the_command_that_removes_it(tmp_path, what):
    """Garbage, JSON of something else, or a folder at the lock's path: a run is refused in
    one line giving the exact command; ``kpca unlock`` alone refuses the same way, leaving
    it; ``kpca unlock --force`` removes it; then a run takes the lock."""
    out = tmp_path / "out"
    out.mkdir()
    lock_path = out / LOCK_NAME
    if what == "garbage":
        lock_path.write_bytes(b"\x00\x17not a lock\xff")
    elif what == "foreign-json":
        lock_path.write_text('{"owner": "airflow", "since": 3}')
    else:
        lock_path.mkdir()
        (lock_path / "note.txt").write_text("x")
    with pytest.raises(OutputLockedError) as err:
        RunLock(Location(str(out))).acquire()
    message = str(err.value)
    assert "\n" not in message and f"remove it with `kpca unlock --force {out}`" in message
    assert message.startswith(f"{lock_path} is not a lock written by kpca-dask (")
    assert lock_path.exists()
    rc, _, stderr = cli("unlock", out)
    assert rc == 2 and f"kpca unlock --force {out}" in stderr and lock_path.exists()
    rc, stdout, _ = cli("unlock", "--force", out)
    assert rc == 0 and f"removed {lock_path}" in stdout
    assert not lock_path.exists() and sorted(os.listdir(out)) == []
    with RunLock(Location(str(out))):
        pass


def test_the_lease_is_configured_by_dask_config(monkeypatch):
    """``kpca.lock-lease`` (env ``DASK_KPCA__LOCK_LEASE``): seconds or a duration; the
    default is 600 s; a value that is no positive duration is refused in one line."""
    import dask

    from pipeline.config.messages import ConfigError

    assert lease_seconds() == 600
    with dask.config.set({"kpca.lock-lease": "2 minutes"}):
        assert lease_seconds() == 120
        assert LockHolder.me().lease == 120
    with dask.config.set({"kpca.lock-lease": 0}):
        with pytest.raises(ConfigError, match="kpca.lock-lease = 0 is not a positive"):
            lease_seconds()


def probe_names(age: float) -> list[str]:
    """Names of visibility probe files written ``age`` seconds ago (client's, a worker's)."""
    from pipeline.runtime.probe_files import PROBE_PREFIX

    token = f"{int(time.time() - age)}-{uuid.uuid4().hex[:12]}"
    return [f"{PROBE_PREFIX}{token}.client", f"{PROBE_PREFIX}{token}.3f9c0a1b2c3d"]


def test_the_next_writer_removes_the_probe_files_a_dead_run_left(tmp_path):
    """Probe files a killed run (or a worker that answered after its probe had cleaned
    up) left in the output and its work folder go when the next writer takes the lock --
    with or without a cluster to probe -- once older than any probe lasts (20 minutes
    here; one of an earlier format without a time too); a fresh one, of a probe another
    run has under way, stays."""
    from pipeline.runtime.probe_files import PROBE_PREFIX

    out = tmp_path / "out"
    (out / "work").mkdir(parents=True)
    stale = probe_names(1200) + [f"{PROBE_PREFIX}{'c0ffee' * 5}"]
    fresh = probe_names(30)
    for folder in (out, out / "work"):
        for name in stale + fresh:
            (folder / name).write_text("x")
    (out / "work" / "mine.txt").write_text("kept")
    with RunLock(Location(str(out))):
        pass
    assert sorted(os.listdir(out)) == sorted([*fresh, "work"])
    assert sorted(os.listdir(out / "work")) == sorted([*fresh, "mine.txt"])


# ------------------------------------------------------------------ clocks that differ
#: a host whose clock is off by ``SKEW`` seconds: Python's clock in the holder process
#: (time.time and the lock module's datetime) moved, the file system's stamps not -- as
#: on a machine whose clock drifted while the store keeps its own
_SKEWED_CLOCK = """
import datetime as _dt, time as _time, types
_real = _time.time
_time.time = lambda: _real() + {skew}
class _DT(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(_time.time(), tz)
import pipeline.output.lock as _lock
_lock.datetime = types.SimpleNamespace(
    datetime=_DT, UTC=_dt.UTC, timedelta=_dt.timedelta, timezone=_dt.timezone
)
"""


@pytest.mark.parametrize("skew", [-7200, 7200], ids=["behind-2h", "ahead-2h"])
def test_a_holder_whose_clock_is_hours_off_is_judged_by_the_stores_clock(tmp_path, skew):
    """Lock times are kept and judged in the store's clock (the file system's stamps here):
    a holder on a host whose clock is two hours ahead is broken once its lease lapses
    after it died (by its own clock it renewed in the future: before, it held the output
    for two hours); one two hours behind is never taken for expired while alive (S3, where
    no flock speaks for it: tests/objectstore/test_lock_lease_stores.py)."""
    out = tmp_path / "out"
    p = _start(_SKEWED_CLOCK.format(skew=skew) + _holder_script(out, host="node-skew"))
    try:
        t_end = time.monotonic() + 2 * LEASE
        while time.monotonic() < t_end:  # alive and renewing: refused all along
            # (on local disk its flock speaks for it too; on object stores only the
            # lease does: tests/objectstore/test_lock_lease_stores.py)
            assert lock_status(Location(str(out)))[0] in ("held", "foreign")
            with pytest.raises(OutputLockedError):
                RunLock(Location(str(out))).acquire()
            time.sleep(0.3)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    # dead: broken once its lease has lapsed, by the store's clock (not two hours later)
    assert wait_until(lambda: lock_status(Location(str(out)))[0] == "expired", 4 * LEASE)
    with RunLock(Location(str(out))) as lock:
        assert lock.holder.host != "node-skew"
