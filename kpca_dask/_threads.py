"""Keep (dask threads) x (BLAS threads) within the machine's cores.

Dask's nanny already pins BLAS to one thread in ``distributed`` worker
processes. The threaded scheduler runs tasks in this process, where OpenBLAS or
MKL would otherwise start one thread per core inside every task: with two dask
threads on two cores that is four busy threads fighting over two cores. While a
computation runs on the local threaded scheduler we therefore cap BLAS at
``cores // dask_threads`` (at least 1) with threadpoolctl.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import dask
import dask.local
import dask.threaded
from dask.base import get_scheduler
from threadpoolctl import threadpool_limits

__all__ = ["blas_threads_for_dask", "cpu_count"]


def cpu_count() -> int:
    """Cores this process may use (respects affinity masks)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def blas_threads_for_dask() -> Iterator[None]:
    """Cap BLAS threads while a dask computation runs in this process."""
    scheduler = get_scheduler()
    cores = cpu_count()
    if scheduler is None or scheduler is dask.threaded.get:
        # None: no scheduler configured, dask arrays default to the threaded one.
        workers = dask.config.get("num_workers", None) or cores
        limit = max(1, cores // int(workers))
    elif scheduler is dask.local.get_sync:
        limit = cores
    else:
        # distributed (or another) scheduler: tasks run in worker processes
        # whose BLAS threads the nanny controls.
        yield
        return
    with threadpool_limits(limits=limit, user_api="blas"):
        yield
