"""Where a local worker that stopped answering was: its threads' stacks, kept in a file.

A worker whose event loop is blocked (a deadlock, a call holding the GIL) sends no
heartbeat and cannot answer a ``Client.run``, so asking it through Dask is no use. For the
local clusters a run starts, each worker registers :mod:`faulthandler` on ``SIGUSR1``
(:class:`StacksOnSignal`): the C-level handler writes every thread's stack without the
GIL or the event loop. When the worker watch (pipeline/runtime/liveness.py) names a silent
local worker, :func:`dump_stacks` signals it and copies what it wrote to a file that
outlives the run; the log names that file. Remote workers are left alone (their
processes are not ours to signal).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import tempfile
import time

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["StacksOnSignal", "dump_stacks", "forget"]

_SIGNAL = signal.SIGUSR1


def _live_path(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"kpca-worker-{pid}.stacks")


class StacksOnSignal(WorkerPlugin):
    """Worker plugin: every thread's stack to a file of its own on ``SIGUSR1``."""

    name = "kpca-stacks-on-signal"

    def setup(self, worker) -> None:
        self._file = open(_live_path(os.getpid()), "w")  # noqa: SIM115 - open while it lives
        faulthandler.register(_SIGNAL, file=self._file, all_threads=True)

    def teardown(self, worker) -> None:
        faulthandler.unregister(_SIGNAL)
        self._file.close()
        with contextlib.suppress(OSError):
            os.remove(self._file.name)


def dump_stacks(pid: int, wait: float = 2.0) -> str | None:
    """Signal the local worker ``pid`` and copy the stacks it writes to a file that
    outlives the run: its path, or None (no such worker of ours, or no answer within
    ``wait`` seconds: a stopped process answers only once it is continued)."""
    live = _live_path(pid)
    if not os.path.exists(live):
        return None
    before = os.path.getsize(live)
    try:
        os.kill(pid, _SIGNAL)
    except OSError:
        return None
    deadline, size = time.monotonic() + wait, before
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = os.path.getsize(live) if os.path.exists(live) else before
        if now > before and now == size:  # written, and no longer growing
            break
        size = now
    if size <= before:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S")
    kept = os.path.join(tempfile.gettempdir(), f"kpca-silent-worker-{pid}-{stamp}.txt")
    with open(live, "rb") as src, open(kept, "wb") as dst:
        src.seek(before)  # this dump only
        dst.write(src.read())
    return kept


def forget(pids) -> None:
    """Remove the stack files of the workers ``pids`` (the watch has ended: a worker
    killed as its cluster closes never runs the plugin's teardown)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.remove(_live_path(pid))
