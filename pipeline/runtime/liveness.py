"""Workers that stop answering: named in one line within a timeout, never a silent hang.

A Dask worker that is stopped (SIGSTOP, a frozen VM, a node cut off by the network)
keeps its connection to the scheduler open, so distributed never calls it lost (its
``worker-ttl`` is unset by default): every task the scheduler gave it, and every
``Client.run`` that asks it something, waits for ever. Two guards here:

- :func:`run_on_workers`: ``Client.run`` with a timeout, one request per worker, so a
  worker that does not answer in time is *named* (the visibility probe and the
  between-stage housekeeping use it).
- :class:`WorkerWatch`: a thread beside every run's client (started by
  :func:`pipeline.runtime.cluster.dask_client`) that reads the scheduler's view of the workers
  once a second. Each worker heartbeats the scheduler every 0.5-5 s whatever its tasks
  do (the heartbeat runs on the worker's event loop, not in a task), so a worker whose
  ``last_seen`` has not moved for ``worker_timeout`` seconds has stopped answering.
  While a run is inside an :func:`activity` (the probe, a stage, a transform), the watch
  then logs one line naming the worker and the activity, cancels the client's pending
  work and :func:`pipeline.runtime.cluster.dask_client` raises :class:`WorkerTimeoutError`
  (exit 1).
  It also logs one line when a worker pauses at its memory limit (distributed pauses a
  worker at 80 % of ``--memory-limit`` until its memory drops) and when it resumes.

Why heartbeats rather than a wall-clock timeout per stage: a stage's legitimate
duration grows with the data (minutes to hours), so any fixed stage timeout either kills
large runs or waits hours on a small one. A missing heartbeat says exactly "this worker
stopped answering", after the same delay for any data size, and names the worker.
The clock used is the client's own monotonic clock (the time ``last_seen`` last
*changed*), so clock skew between the client and the scheduler does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from pipeline.errors import TransientError

__all__ = [
    "DEFAULT_WORKER_TIMEOUT",
    "WorkerTimeoutError",
    "WorkerWatch",
    "activity",
    "check_not_tripped",
    "current_activity",
    "current_timeout",
    "run_on_workers",
    "watching",
]

logger = logging.getLogger("pipeline")

#: seconds a worker may go without answering (heartbeat, probe) before the run stops;
#: see docs/cluster.md ("Workers that stop answering") for why this value
DEFAULT_WORKER_TIMEOUT = 120.0
#: seconds between two looks at the scheduler's worker table
POLL_INTERVAL = 1.0
#: seconds the clean-up after a probe waits for the workers that did answer
CLEANUP_TIMEOUT = 10.0
#: seconds after tripping the watch logs its line itself, if the run has not ended on it
LOG_AFTER = 30.0


class WorkerTimeoutError(TransientError, TimeoutError):
    """A Dask worker stopped answering (no heartbeat, no reply) within the timeout.

    An environment failure (exit 1): re-running once the worker is back, restarted or
    removed resumes. Not retried by a flow's task (``retry = False``): the same worker
    would be waited for again.
    """

    retry = False


# ------------------------------------------------------------------ what the run does
_STATE: dict[str, Any] = {"watch": None}
#: The activities in progress, oldest first, each under its own token: threads (two
#: transforms at once, a stage's helpers) enter and leave in any order, and each leaves
#: only its own entry (restoring "the one before" left a finished label behind).
_ACTIVE: list[tuple[object, str]] = []
_LOCK = threading.Lock()


def current_activity() -> str | None:
    """What the run is doing now (``visibility probe``, ``stage 'solve'``...; the newest
    when several threads are inside one), or None."""
    with _LOCK:
        return _ACTIVE[-1][1] if _ACTIVE else None


def current_timeout() -> float | None:
    """The worker timeout of the watch in force (None: wait for ever), or the default
    when no watch runs (a client made outside :func:`pipeline.runtime.cluster.dask_client`)."""
    watch = _STATE["watch"]
    return watch.timeout if watch is not None else DEFAULT_WORKER_TIMEOUT


def check_not_tripped() -> None:
    """Raise :class:`WorkerTimeoutError` when the watch in force has found a worker that
    stopped answering (so that nothing more is submitted to it)."""
    watch = _STATE["watch"]
    if watch is not None and watch.tripped:
        raise WorkerTimeoutError(watch.tripped)


@contextlib.contextmanager
def activity(what: str) -> Iterator[None]:
    """Mark the block as ``what`` (named in the line about a worker that stopped
    answering or paused); refuses to start it once the watch has tripped."""
    check_not_tripped()
    entry = (object(), what)
    with _LOCK:
        _ACTIVE.append(entry)
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE.remove(entry)


# ------------------------------------------------------------------ Client.run, bounded
def run_on_workers(
    client, function, *args, timeout: float | None, workers: list[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """``client.run(function, *args)`` on each worker, waiting at most ``timeout`` s
    (None: for ever); returns ``(answers by address, addresses that did not answer)``.

    One request per worker, so one stopped worker neither blocks the others' answers
    nor stays anonymous. A worker's exception is its answer (as ``on_error="return"``).
    """
    if workers is None:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])

    async def each() -> tuple[dict[str, Any], list[str]]:
        tasks = {
            a: asyncio.ensure_future(
                client._run(function, *args, workers=[a], on_error="return")
            )
            for a in workers
        }
        if not tasks:
            return {}, []
        done, pending = await asyncio.wait(tasks.values(), timeout=timeout)
        for t in pending:
            t.cancel()
        answers: dict[str, Any] = {}
        for a, t in tasks.items():
            if t not in done:
                continue
            try:
                answers.update(t.result())
            except Exception as exc:  # noqa: BLE001 - the worker's answer, reported
                answers[a] = exc
        return answers, sorted(a for a, t in tasks.items() if t not in done)

    return client.sync(each)


def silent_message(addresses: list[str], what: str, timeout: float | None) -> str:
    """The one line about workers that did not answer ``what`` in ``timeout`` s."""
    who = ", ".join(addresses)
    n = "worker" if len(addresses) == 1 else f"{len(addresses)} workers"
    return (
        f"Dask {n} {who} did not answer within {timeout:g} s during the {what}: stopped, "
        "hung or cut off from this machine; nothing was written or published. Restart or "
        "remove that worker (or raise cluster.worker_timeout / --worker-timeout), then "
        "re-run the same command."
    )


# ------------------------------------------------------------------ the watch
class WorkerWatch(threading.Thread):
    """Watch the workers' heartbeats and pauses through the scheduler (module doc)."""

    def __init__(
        self,
        client,
        timeout: float | None,
        interval: float = POLL_INTERVAL,
        local: bool = False,
    ):
        super().__init__(daemon=True, name="kpca-worker-watch")
        self.client, self.timeout, self.interval = client, timeout, interval
        #: the workers are processes of this machine that the run started (their
        #: threads' stacks are kept when they stop answering: pipeline/runtime/stacks.py)
        self.local = local
        self._pids: dict[str, int | None] = {}
        self.tripped: str | None = None
        self._seen: dict[str, tuple[Any, float]] = {}  # address -> (last_seen, changed at)
        self._paused: set[str] = set()
        self._tripped_at = 0.0
        self._logged = False
        self._done = threading.Event()

    def _workers(self) -> dict[str, dict]:
        return self.client.scheduler_info(n_workers=-1)["workers"]

    def poll(self, now: float | None = None) -> list[str]:
        """One look: log pauses and resumptions; the workers silent for too long."""
        from dask.utils import format_bytes

        now = time.monotonic() if now is None else now
        workers = self._workers()
        doing = current_activity()
        if self.local:
            self._ask_pids([a for a in workers if a not in self._pids])
        for addr, w in workers.items():
            seen = w.get("last_seen")
            prev = self._seen.get(addr)
            if prev is None or prev[0] != seen:
                self._seen[addr] = (seen, now)
            paused = w.get("status") == "paused"
            if paused and addr not in self._paused:
                self._paused.add(addr)
                limit = w.get("memory_limit")
                logger.warning(
                    "Dask worker %s paused at its memory limit (%s; distributed pauses a "
                    "worker at 80 %% of it)%s: it runs no tasks until its memory drops; "
                    "if it stays paused, give the workers more memory "
                    "(cluster.memory_limit) or use smaller chunks",
                    addr,
                    format_bytes(limit) if limit else "?",
                    f" during the {doing}" if doing else "",
                )
            elif not paused and addr in self._paused:
                self._paused.discard(addr)
                logger.info("Dask worker %s resumed (no longer paused)", addr)
        for gone in set(self._seen) - set(workers):  # left or removed: not ours to wait on
            self._seen.pop(gone, None)
            self._paused.discard(gone)
        if self.timeout is None:
            return []
        return sorted(a for a, (_, t) in self._seen.items() if now - t > self.timeout)

    def trip(self, silent: list[str], doing: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        ages = ", ".join(f"{a} ({now - self._seen[a][1]:.0f} s)" for a in silent)
        n = "worker" if len(silent) == 1 else f"{len(silent)} workers"
        self.tripped = (
            f"Dask {n} {ages} stopped answering the scheduler (no heartbeat for more than "
            f"{self.timeout:g} s) during the {doing}: stopped, hung or cut off; "
            "the run was stopped and nothing new was published. Restart or remove that "
            "worker (or raise cluster.worker_timeout / --worker-timeout), then re-run the "
            "same command to resume."
        )
        self._tripped_at = now
        # the run raises it as its one line (dask_client); logged only if it does not
        logger.debug("%s", self.tripped)
        if self.local:
            self._keep_stacks(silent)

    def _ask_pids(self, new: list[str]) -> None:
        """The process ids of workers not seen before (asked once each; a worker that does
        not answer within 5 s stays without one)."""
        if not new:
            return
        answers, _ = run_on_workers(self.client, os.getpid, timeout=5, workers=new)
        for addr in new:
            pid = answers.get(addr)
            self._pids[addr] = pid if isinstance(pid, int) else None

    def _keep_stacks(self, silent: list[str]) -> None:
        from .stacks import dump_stacks

        for addr in silent:
            pid = self._pids.get(addr)
            kept = dump_stacks(pid) if pid else None
            if kept:
                logger.warning(
                    "Dask worker %s stopped answering: its threads' stacks are in %s",
                    addr,
                    kept,
                )

    def cancel_pending(self) -> None:
        from distributed import Future

        keys = [k for k, st in list(self.client.futures.items()) if st.status == "pending"]
        if keys:
            with contextlib.suppress(Exception):
                self.client.cancel(
                    [Future(k, self.client) for k in keys],
                    reason="kpca-worker-watch",
                    msg=self.tripped,
                )

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                if self.tripped:  # keep the run from waiting on anything submitted since
                    self.cancel_pending()
                    if not self._logged and time.monotonic() - self._tripped_at > LOG_AFTER:
                        self._logged = True  # the run did not end: say why, at least
                        logger.error("%s", self.tripped)
                    continue
                silent = self.poll()
                doing = current_activity()
                if silent and doing is not None:
                    self.trip(silent, doing)
                    self.cancel_pending()
            except Exception as exc:  # noqa: BLE001 - the client closing: not our call
                logger.debug("worker watch: %s", exc)

    def stop(self) -> None:
        self._done.set()


@contextlib.contextmanager
def watching(client, timeout: float | None, local: bool = False) -> Iterator[WorkerWatch]:
    """Run a :class:`WorkerWatch` on ``client`` for the block; an error raised in the
    block after the watch tripped becomes :class:`WorkerTimeoutError` (its one line)."""
    watch = WorkerWatch(client, timeout, local=local)
    if local:  # while every worker answers: asked later, a silent one would stay unknown
        with contextlib.suppress(Exception):
            watch._ask_pids(sorted(watch._workers()))
    with _LOCK:
        old, _STATE["watch"] = _STATE["watch"], watch
    watch.start()
    try:
        yield watch
    except BaseException as exc:
        if watch.tripped and not isinstance(exc, WorkerTimeoutError | KeyboardInterrupt):
            raise WorkerTimeoutError(watch.tripped) from exc
        raise
    finally:
        watch.stop()
        with _LOCK:
            _STATE["watch"] = old
        if local:  # a worker killed at the cluster's close leaves its file behind
            from .stacks import forget

            forget(p for p in watch._pids.values() if p)
