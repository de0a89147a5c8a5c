"""What the active Dask scheduler offers: its threads, its kind and the memory the
cached kernel blocks may take (the budget :meth:`BlockKernelMatrix.plan_cache` uses)."""

from __future__ import annotations

from typing import Any


def _cluster_threads() -> int:
    """Threads of the active distributed cluster, else this machine's cores."""
    import sys

    if "distributed" not in sys.modules:  # no client can exist: do not import it
        from .threads import cpu_count

        return cpu_count()
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

#: :func:`kernel_cache_budget`'s reason when the budget is the user's (that config key):
#: only then does ``kernel_cache="auto"`` keep part of the blocks (the partial tier).
BUDGET_SET = f"dask config {CACHE_BUDGET_CONFIG}"


def user_cache_budget() -> int | None:
    """The budget the user set (dask config :data:`CACHE_BUDGET_CONFIG`) in bytes, or None."""
    import dask
    from dask.utils import parse_bytes

    value = dask.config.get(CACHE_BUDGET_CONFIG, None)
    return None if value is None else int(parse_bytes(value))


def _scheduler_kind() -> tuple[str, Any]:
    """("local", None) (threaded or synchronous: data stays in this process),
    ("distributed", client) or ("other", None) (e.g. the multiprocessing
    scheduler, which keeps nothing between computations).

    Without ``distributed`` imported there is no distributed client, and the
    scheduler is told from dask's config as ``dask.base.get_scheduler`` would,
    without importing ``distributed`` (0.2-0.4 s and ~40 MB, which
    ``get_scheduler`` pays whenever it is called)."""
    import dask.local
    import dask.threaded

    scheduler = _scheduler_without_distributed()
    if scheduler is _UNDECIDED:
        from dask.base import get_scheduler

        scheduler = get_scheduler()
    if scheduler is None or scheduler is dask.threaded.get or scheduler is dask.local.get_sync:
        return "local", None
    owner = getattr(scheduler, "__self__", None)  # the client whose get() runs the graphs
    if type(owner).__name__ == "Client" and type(owner).__module__.startswith("distributed"):
        return "distributed", owner
    return "other", None


_UNDECIDED = object()


def _scheduler_without_distributed() -> Any:
    """What ``dask.base.get_scheduler()`` returns when ``distributed`` is not imported
    and the answer does not need it (no ``scheduler`` in dask's config: None, as
    there is no client; a callable; a named scheduler), else ``_UNDECIDED``
    (``get_scheduler`` decides, raising as it does for "distributed" without a
    client or a bad name)."""
    import sys

    import dask
    from dask.base import named_schedulers

    if "distributed" in sys.modules or dask.config.get("get", None):
        return _UNDECIDED
    name = dask.config.get("scheduler", None)
    if not name:
        return None
    if callable(name):
        return name
    if isinstance(name, str) and name.lower() in named_schedulers:
        return named_schedulers[name.lower()]
    return _UNDECIDED


def kernel_cache_budget() -> tuple[int, str]:
    """Bytes the cached kernel blocks may take on the active scheduler, and why.

    Distributed: ``CACHE_MEMORY_FRACTION`` of each worker's ``memory_limit``
    less the memory the worker process already uses, times the number of
    workers, taking the worker with the least room (the blocks spread evenly
    over the workers). Threaded scheduler: ``CACHE_MEMORY_FRACTION`` of this
    machine's available memory. The dask config key ``kpca.kernel-cache-budget``
    overrides both.
    """
    from dask.utils import format_bytes

    override = user_cache_budget()
    if override is not None:
        return override, BUDGET_SET
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
