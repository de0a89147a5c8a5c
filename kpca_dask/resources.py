"""What the active Dask scheduler offers: its threads, its kind and the memory the
cached kernel blocks may take (the budget :meth:`BlockKernelMatrix.plan_cache` uses)."""

from __future__ import annotations

from typing import Any


def _cluster_threads() -> int:
    """Threads of the active distributed cluster, else this machine's cores."""
    try:
        from distributed import default_client

        return max(1, sum(default_client().nthreads().values()))
    except (ImportError, ValueError):
        from .threads import cpu_count

        return cpu_count()


#: Share of the memory the cached upper blocks may take: of each worker's
#: ``memory_limit`` (less what the worker already uses) on a distributed
#: cluster, of the available RAM on the threaded scheduler. Dask starts spilling
#: a worker's data to disk at 60 % of its limit; the half leaves room for the
#: tasks' own working memory (two row blocks, one strip, the partial products).
CACHE_MEMORY_FRACTION = 0.5

#: dask config key overriding the budget (bytes, or a string such as "2GiB").
CACHE_BUDGET_CONFIG = "kpca.kernel-cache-budget"


def _scheduler_kind() -> tuple[str, Any]:
    """("local", None) (threaded or synchronous: data stays in this process),
    ("distributed", client) or ("other", None) (e.g. the multiprocessing
    scheduler, which keeps nothing between computations)."""
    import dask.local
    import dask.threaded
    from dask.base import get_scheduler

    scheduler = get_scheduler()
    if scheduler is None or scheduler is dask.threaded.get or scheduler is dask.local.get_sync:
        return "local", None
    owner = getattr(scheduler, "__self__", None)  # the client whose get() runs the graphs
    if type(owner).__name__ == "Client" and type(owner).__module__.startswith("distributed"):
        return "distributed", owner
    return "other", None


def kernel_cache_budget() -> tuple[int, str]:
    """Bytes the cached kernel blocks may take on the active scheduler, and why.

    Distributed: ``CACHE_MEMORY_FRACTION`` of each worker's ``memory_limit``
    less the memory the worker process already uses, times the number of
    workers, taking the worker with the least room (the blocks spread evenly
    over the workers). Threaded scheduler: ``CACHE_MEMORY_FRACTION`` of this
    machine's available memory. The dask config key ``kpca.kernel-cache-budget``
    overrides both.
    """
    import dask
    from dask.utils import format_bytes, parse_bytes

    override = dask.config.get(CACHE_BUDGET_CONFIG, None)
    if override is not None:
        return int(parse_bytes(override)), f"dask config {CACHE_BUDGET_CONFIG}"
    import psutil

    kind, client = _scheduler_kind()
    if kind == "distributed":
        workers = client.scheduler_info(n_workers=-1)["workers"]
        room = []
        for w in workers.values():
            metrics = w.get("metrics") or {}
            limit = w.get("memory_limit") or metrics.get("host_total") or 0
            room.append(
                max(0, int(CACHE_MEMORY_FRACTION * limit) - int(metrics.get("memory", 0)))
            )
        if not room:
            return 0, "no workers"
        return len(room) * min(room), (
            f"{CACHE_MEMORY_FRACTION:g} of the memory limit of {len(room)} workers less what "
            f"they use (least room: {format_bytes(min(room))})"
        )
    if kind == "local":
        avail = int(psutil.virtual_memory().available)
        return int(CACHE_MEMORY_FRACTION * avail), (
            f"{CACHE_MEMORY_FRACTION:g} of this machine's available memory"
        )
    return 0, "the scheduler keeps no data between computations"
