"""Keep (dask threads) x (BLAS threads) within the cores this process can get.

OpenBLAS and MKL start one thread per online CPU by default, whatever the
affinity mask or the container's CPU quota, and inside every task that calls
them. With two dask threads on two cores that is four busy threads fighting
over two cores; OpenBLAS's threads spin while they wait, so oversubscription
costs far more than the share of cores, above all with one core busy with
another process (docs/tuning.md).

Every path that calls BLAS is covered:

* the threaded scheduler (tasks in this process): while a computation runs,
  :func:`blas_threads_for_dask` caps BLAS at ``cores // dask_threads`` (at
  least 1);
* the synchronous scheduler: ``cores``;
* a ``distributed`` cluster: each worker process caps BLAS at ``cores //
  (threads of the workers in that process)`` (:class:`BlasLimitPlugin`,
  registered once per client; distributed's nannies already start workers
  with ``OPENBLAS_NUM_THREADS=1``, the plugin also covers workers started
  without a nanny). Workers inside this process (``LocalCluster(processes=
  False)``) share its BLAS: the cap is applied here while a computation runs;
* the driver's own linear algebra between passes (QR, small eigh, n x L
  GEMMs in the solvers): :func:`blas_threads_for_driver`, one thread.

``cores`` is :func:`cpu_count`: the CPUs in this process's affinity mask,
further capped by a cgroup CPU quota (``cpu.max`` in cgroup v2,
``cpu.cfs_quota_us`` in v1) when one is set, at least 1.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import dask
import dask.local
import dask.threaded
from dask.base import get_scheduler
from threadpoolctl import ThreadpoolController, threadpool_info, threadpool_limits

__all__ = [
    "blas_threads",
    "blas_threads_for_dask",
    "blas_threads_for_driver",
    "cpu_count",
]

_CGROUP = Path("/sys/fs/cgroup")

logger = logging.getLogger("kpca_dask")


def _cgroup_quota(root: Path = _CGROUP) -> float | None:
    """CPUs allowed by the cgroup CPU quota of this process (None: no quota)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def cpu_count() -> int:
    """Cores this process may use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def blas_threads() -> int:
    """The largest thread count of the BLAS libraries loaded in this process."""
    return max(
        (int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"), default=1
    )


_CONTROLLER: tuple[int, ThreadpoolController] | None = None


def _blas_limits(limit: int):
    """``threadpool_limits(limits=limit, user_api="blas")`` without its cost per call:
    each one searches the process's loaded libraries (5 ms; a grid search's small fits
    made 5 such calls each). The controller is kept until a module is imported (which
    may load another BLAS)."""
    import sys

    global _CONTROLLER
    key = len(sys.modules)
    if _CONTROLLER is None or _CONTROLLER[0] != key:
        _CONTROLLER = (key, ThreadpoolController())
    return _CONTROLLER[1].limit(limits=limit, user_api="blas")


#: BLAS threads for the driver's algebra between passes (see blas_threads_for_driver).
DRIVER_BLAS_THREADS = 1


@contextlib.contextmanager
def blas_threads_for_driver() -> Iterator[None]:
    """One BLAS thread for the driver's own linear algebra between passes.

    The solvers' driver-side algebra is tall-skinny (n x L GEMMs, CholQR, small
    eigh): it gains little from threads and loses a lot when a core is busy
    (OpenBLAS's threads spin-wait for each other; docs/tuning.md). The passes over
    the kernel blocks, the dominant cost, run inside :func:`blas_threads_for_dask`,
    which sets their own budget.
    """
    with _blas_limits(min(DRIVER_BLAS_THREADS, cpu_count())):
        yield


def _threads_in_this_process() -> int:
    """Threads of the ``distributed`` workers running inside this process (0: none)."""
    try:
        from distributed import Worker
    except ImportError:  # pragma: no cover - distributed is a dependency
        return 0
    return sum(
        int(w.state.nthreads)
        for w in list(Worker._instances)
        if getattr(w, "status", None) is not None and w.status.name == "running"
    )


class _BlasLimit:
    """Worker plugin: cap BLAS at ``cores // threads`` in each worker process.

    ``threads`` counts every worker thread in that process (several workers may
    share one). The cap only ever lowers the current limit. Exposed as
    :class:`BlasLimitPlugin` (a ``distributed.WorkerPlugin``), built on first use
    so that importing kpca_dask does not import distributed.
    """

    name = "kpca-dask-blas-limit"
    idempotent = True

    def __init__(self) -> None:
        self.driver_pid = os.getpid()

    def setup(self, worker) -> None:
        if os.getpid() == self.driver_pid:
            # workers inside the driver's process share its BLAS: capped only while a
            # computation runs (blas_threads_for_dask), not for the whole process
            return
        threads = _threads_in_this_process() or int(worker.state.nthreads)
        limit = max(1, cpu_count() // max(1, threads))
        if blas_threads() > limit:
            threadpool_limits(limits=limit, user_api="blas")


@functools.cache
def _plugin_class() -> type:
    from distributed import WorkerPlugin

    cls = type("BlasLimitPlugin", (_BlasLimit, WorkerPlugin), {"__module__": __name__})
    cls.__qualname__ = "BlasLimitPlugin"
    return cls


def __getattr__(name: str):  # PEP 562: workers unpickle the plugin class by name
    if name == "BlasLimitPlugin":
        return _plugin_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REGISTERED: weakref.WeakSet = weakref.WeakSet()


def _distributed_client():
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def _register(client) -> None:
    """Register :class:`BlasLimitPlugin` once per client (workers joining later get it too)."""
    if client in _REGISTERED:
        return
    try:
        client.register_plugin(_plugin_class()(), name=_BlasLimit.name)
    except Exception as exc:  # noqa: BLE001 - a cap we could not install is not an error
        logger.debug("could not install the BLAS thread limit on the workers: %s", exc)
    _REGISTERED.add(client)


@contextlib.contextmanager
def blas_threads_for_dask() -> Iterator[None]:
    """Cap BLAS threads while a dask computation runs (see the module docstring)."""
    scheduler = get_scheduler()
    cores = cpu_count()
    if scheduler is None or scheduler is dask.threaded.get:
        # None: no scheduler configured, dask arrays default to the threaded one.
        workers = dask.config.get("num_workers", None) or cores
        limit = max(1, cores // int(workers))
    elif scheduler is dask.local.get_sync:
        limit = cores
    else:
        client = _distributed_client()
        if client is not None:
            _register(client)
        local = _threads_in_this_process()
        if not local:
            # tasks run in worker processes, capped by the plugin
            yield
            return
        limit = max(1, cores // local)
    with _blas_limits(limit):
        yield
