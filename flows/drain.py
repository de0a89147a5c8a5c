"""Stop a Prefect worker without killing the flow run it is running: drain its pool.

A process worker that receives SIGTERM stops within seconds and takes its flow-run
processes with it: the night in flight is killed mid-stage and its run stays
``Running`` on the server (seen with Prefect 3.8.8; the next night resumes it from
its finished stages, but tonight's result is late). A second signal kills at once.
Draining is the safe order:

1. pause the work pool: the server hands no new flow run to any worker of the pool
   (scheduled nights that come due meanwhile wait, ``Late``, and start once the pool
   is resumed -- nothing is skipped);
2. wait until no flow run of the pool is ``Pending`` or ``Running`` (and stays so for
   a settle period longer than the workers' polling interval, so a run a worker
   picked up just before the pause is seen);
3. stop the worker (SIGTERM to the pid given, or by the caller: systemd, Kubernetes);
4. later, ``kpca drain --resume POOL`` (or ``prefect work-pool resume POOL``).

``kpca drain`` does 1-3 (:func:`drain_pool`); deploy/README.md shows it as a
systemd ``ExecStop`` and a Kubernetes ``preStop`` hook.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.errors import UserError

__all__ = ["DrainError", "DrainResult", "drain_pool", "in_flight", "resume_pool"]

#: states of a flow run a worker has taken and not finished
IN_FLIGHT = ("PENDING", "RUNNING", "CANCELLING")


class DrainError(UserError, RuntimeError):
    """The pool cannot be drained as asked (unknown pool, runs still in flight at the
    timeout, a worker that does not stop)."""


@dataclass
class DrainResult:
    """What a drain did: the pool, the runs it waited for, and how long it took."""

    pool: str
    waited_for: list[str] = field(default_factory=list)
    seconds: float = 0.0
    worker_stopped: bool | None = None


def _set_paused(pool: str, paused: bool) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.update_work_pool(
                work_pool_name=pool, work_pool=WorkPoolUpdate(is_paused=paused)
            )
        except ObjectNotFound:
            raise DrainError(
                f"work pool {pool!r} does not exist on the Prefect API "
                "(`prefect work-pool ls` lists them); check the name and PREFECT_API_URL."
            ) from None


def in_flight(pool: str) -> list[str]:
    """Names of the flow runs of ``pool`` that a worker has taken and not finished."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType(s) for s in IN_FLIGHT])
                )
            ),
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])),
            limit=100,
        )
    return sorted(r.name for r in runs)


def _stop_worker(pid: int, timeout: float) -> bool:
    """SIGTERM ``pid`` and wait up to ``timeout`` s for it to end; whether it ended."""
    import psutil

    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # ended: gone, or a zombie its parent (a shell, systemd, a test) has not reaped
            # yet -- psutil's wait() on another's child counts a zombie as running
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def drain_pool(
    pool: str,
    *,
    timeout: float = 6 * 3600,
    settle: float = 15.0,
    poll: float = 2.0,
    worker_pid: int | None = None,
    say: Callable[[str], None] = print,
) -> DrainResult:
    """Pause ``pool``, wait for its flow runs in flight to finish, then (``worker_pid``)
    stop that worker with SIGTERM. Raises :class:`DrainError` (the pool stays paused,
    nothing is killed) when runs are still in flight after ``timeout`` seconds.

    ``settle`` is how long the pool must stay idle before it counts as drained: longer
    than the workers' polling interval (``PREFECT_WORKER_QUERY_SECONDS``, 10 s by
    default), so a run a worker took just before the pause is waited for too.
    """
    if worker_pid is not None and worker_pid == os.getpid():
        raise DrainError("--worker-pid names this process; give the worker's pid.")
    t0 = time.monotonic()
    _set_paused(pool, True)
    say(f"kpca: paused work pool {pool!r}: no new flow run starts on its workers")
    result = DrainResult(pool)
    idle_since: float | None = None
    last_said = ""
    while True:
        now = time.monotonic()
        runs = in_flight(pool)
        for name in runs:
            if name not in result.waited_for:
                result.waited_for.append(name)
        if runs:
            idle_since = None
            line = ", ".join(runs)
            if line != last_said:
                say(f"kpca: waiting for {len(runs)} flow run(s) of {pool!r} to finish: {line}")
                last_said = line
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= settle:
            break
        if now - t0 > timeout:
            raise DrainError(
                f"work pool {pool!r}: {len(runs)} flow run(s) still in flight after "
                f"{timeout:.0f} s ({', '.join(runs)}); the pool stays paused and nothing was "
                "stopped: wait longer (--timeout) or cancel them in the Prefect UI."
            )
        time.sleep(poll)
    result.seconds = time.monotonic() - t0
    say(f"kpca: work pool {pool!r} drained: no flow run in flight ({result.seconds:.0f} s)")
    if worker_pid is not None:
        result.worker_stopped = _stop_worker(worker_pid, 120.0)
        if not result.worker_stopped:
            raise DrainError(
                f"the worker (pid {worker_pid}) did not stop within 120 s of SIGTERM; no flow "
                "run was in flight, so stopping it harder loses nothing."
            )
        say(f"kpca: worker pid {worker_pid} stopped")
    say(f"kpca: resume with `kpca drain --resume {pool}` once a worker runs again")
    return result


def resume_pool(pool: str, say: Callable[[str], None] = print) -> None:
    """Unpause ``pool``: waiting (late) flow runs start on its workers."""
    _set_paused(pool, False)
    say(f"kpca: resumed work pool {pool!r}: waiting flow runs start on its workers")
