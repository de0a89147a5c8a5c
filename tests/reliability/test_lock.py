"""Concurrent runs to one output are refused: the run lock ``<out>/.kpca-run.lock``
records the holder's host, pid and start time; a dead holder's lock is broken
automatically on its host, another host's once its lease lapses (test_lock_lease.py) or by
``kpca unlock``."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest

from pipeline.output.lock import LOCK_NAME, LockHolder, OutputLockedError, RunLock, lock_status
from pipeline.output.store import Location

from .helpers import (
    ROOT,
    artifacts,
    done_blocks,
    env,
    read_json,
    run_command,
    start_job,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.cluster  # its tests start processes


def cli(*args) -> tuple[int, str, str]:
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


# moved out of the default run (its 20-minute budget, 2026-11-28): ~50 s; a live holder refusing
# a contender is tests/reliability/test_lock_lease.py's
@pytest.mark.slow
@pytest.mark.distributed
def test_second_run_to_the_same_output_is_refused(tmp_path, e2e_data, reference_run):
    """While one run works on an output (frozen by SIGSTOP in its kernel build, so that it
    is certainly still running whatever the machine's load), a second run of the same
    command exits 2 naming the holder (host, pid, start time); the first, resumed by
    SIGCONT, finishes undisturbed."""
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "run.yaml", e2e_data, out)
    first = start_job(run_command(cfg), tmp_path / "first.log")
    try:
        assert wait_until(lambda: done_blocks(out) >= 1, 120, proc=first)
        os.killpg(first.pid, signal.SIGSTOP)  # the first job and its cluster, mid-stage
        try:
            holder = read_json(out / LOCK_NAME)
            second = subprocess.run(
                run_command(cfg),
                cwd=ROOT,
                env=env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert first.poll() is None
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        rc = first.wait(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stderr[-3000:]
    line = [ln for ln in second.stderr.splitlines() if "error:" in ln]
    assert len(line) == 1 and "Traceback" not in second.stderr
    assert (
        f"is locked by a running job (host {socket.gethostname()}, pid {first.pid}, "
        f"started {holder['started']}"
    ) in line[0]
    assert "choose another output.path" in line[0]
    assert rc == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert not (out / LOCK_NAME).exists()  # released when the run finished
    assert artifacts(out) == reference_run


def _hold_lock_in_a_process(out, *, die: bool) -> subprocess.Popen:
    """A real process that takes the lock, then either dies by SIGKILL or waits on stdin."""
    end = "os.kill(os.getpid(), signal.SIGKILL)" if die else "sys.stdin.read()"
    script = (
        f"import os, signal, sys\nfrom pipeline.output.lock import RunLock\n"
        f"from pipeline.output.store import Location\n"
        f"lock = RunLock(Location({str(out)!r})).acquire()\nprint('held', flush=True)\n"
        f"{end}\nlock.release()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env(),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert p.stdout.readline().strip() == "held" or die
    return p


def test_dead_holders_lock_is_broken_with_a_warning(tmp_path, caplog):
    out = tmp_path / "out"
    p = _hold_lock_in_a_process(out, die=True)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    assert read_json(out / LOCK_NAME)["pid"] == p.pid
    assert lock_status(Location(str(out)))[0] == "stale"
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        with RunLock(Location(str(out))) as lock:
            assert read_json(out / LOCK_NAME)["pid"] == os.getpid()
            assert lock.holder.pid == os.getpid()
    assert (
        f"breaking the stale lock of {out}: its holder (host {socket.gethostname()}, "
        f"pid {p.pid}" in caplog.text
    )
    assert not (out / LOCK_NAME).exists()


def test_live_holder_blocks_runs_and_unlock(tmp_path):
    """A live holder (another process on this host): both a run and ``kpca unlock`` are
    refused; the lock goes when the holder ends normally."""
    out = tmp_path / "out"
    p = _hold_lock_in_a_process(out, die=False)
    try:
        with pytest.raises(OutputLockedError, match=f"pid {p.pid}, started"):
            RunLock(Location(str(out))).acquire()
        rc, _, err = cli("unlock", out)
        assert (
            rc == 2
            and f"locked by a live process (host {socket.gethostname()}, pid {p.pid}" in err
        )
        assert (out / LOCK_NAME).exists()
    finally:
        p.communicate("", timeout=30)
    assert p.returncode == 0 and not (out / LOCK_NAME).exists()


def test_fresh_lock_from_another_host_is_refused_until_kpca_unlock(tmp_path):
    """A lock recorded by another host and renewed within its lease cannot be checked from
    here: refused, the message saying when it expires and how to break it now; ``kpca
    unlock`` breaks it, then the output is free. (Expired ones: test_lock_lease.py.)"""
    import datetime

    out = tmp_path / "out"
    out.mkdir()
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    record = {
        "host": "node-17",
        "pid": 4242,
        "started": "2026-11-20T23:00:00+00:00",
        "process_started": 1.0,
        "boot_id": "other-boot",
        "user": "etl",
        "token": "t",
        "renewed": now,
        "lease": 600,
    }
    (out / LOCK_NAME).write_text(json.dumps(record))
    with pytest.raises(OutputLockedError) as err:
        RunLock(Location(str(out))).acquire()
    message = str(err.value)
    assert message.startswith(
        f"output {out} is locked by a run on another host (host node-17, pid 4242, started "
        f"2026-11-20T23:00:00+00:00 by etl; it expires at "
    )
    assert message.endswith(f"to break it now, `kpca unlock {out}`.")
    assert " unless renewed); a run that is no longer running stops renewing it" in message
    assert json.loads((out / LOCK_NAME).read_text()) == record  # left as it was
    rc, stdout, _ = cli("unlock", out)
    assert rc == 0 and "removed the lock" in stdout and "node-17" in stdout
    assert not (out / LOCK_NAME).exists()
    with RunLock(Location(str(out))):
        pass


def test_pid_reuse_and_reboot_make_a_record_stale():
    """Where flock cannot tell (object stores, filesystems without it), the record decides:
    a live pid that is another process (other start time), or a record from before the last
    reboot, is not a live holder."""
    me = LockHolder.me()
    assert me.alive() is True
    assert (
        LockHolder(**{**me.__dict__, "process_started": me.process_started - 1000}).alive()
        is False
    )
    assert LockHolder(**{**me.__dict__, "boot_id": "a-previous-boot"}).alive() is False
    assert LockHolder(**{**me.__dict__, "host": "elsewhere"}).alive() is None


def test_lock_refuses_an_output_path_that_is_a_file(tmp_path):
    f = tmp_path / "out"
    f.write_text("not a folder")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        RunLock(Location(str(f))).acquire()
    assert f.read_text() == "not a folder"
