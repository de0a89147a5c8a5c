"""The tests' local Dask clusters: one-thread worker processes on 127.0.0.1, no dashboard."""

from __future__ import annotations

import logging


def local_cluster(n_workers: int, memory_limit: str = "1GiB", **kw):
    """A ``distributed.LocalCluster`` of ``n_workers`` one-thread worker processes bound
    to 127.0.0.1, its logs at ERROR (a context manager, as LocalCluster is)."""
    from distributed import LocalCluster

    return LocalCluster(
        **{
            "n_workers": n_workers,
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            "dashboard_address": None,
            "memory_limit": memory_limit,
            "silence_logs": logging.ERROR,
            **kw,
        }
    )
