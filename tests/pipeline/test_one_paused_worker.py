"""One paused worker ends the run in bounded time (issue 36: with 256 MiB workers one
worker paused at its memory limit hung the run -- a line every 3 minutes -- because the
pause watchdog waited for *every* worker to be paused, and the other one was not).

Real LocalCluster of two worker processes with a small memory limit; one of them is made
to hold memory of its own (not task data: nothing to spill), so distributed's own memory
monitor pauses it, and work is queued on it. The other worker stays active."""

from __future__ import annotations

import re
import time

import dask
import pytest

from pipeline.config import ClusterConfig
from pipeline.runtime.cluster import ClusterError, dask_client

LIMIT = 400 * 2**20


def _hog(fraction: float) -> int:
    """Hold memory in this worker process until its RSS is ``fraction`` of LIMIT."""
    import sys

    import numpy as np
    import psutil

    need = int(fraction * LIMIT) - psutil.Process().memory_info().rss
    sys._kpca_test_hog = np.ones(max(need, 0) // 8 + 1)  # touched: resident
    return psutil.Process().memory_info().rss


def _inc(x: int) -> int:
    return x + 1


@pytest.mark.cluster
def test_one_worker_paused_beyond_the_timeout_ends_the_run():
    cfg = ClusterConfig(
        n_workers=2,
        threads_per_worker=1,
        memory_limit="400MiB",
        dashboard_address=None,
        paused_timeout=3,
        worker_timeout=None,
    )
    with dask.config.set(
        {
            "distributed.worker.memory.terminate": False,
            "distributed.worker.memory.monitor-interval": "50ms",
        }
    ):
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as exc:
            with dask_client(cfg) as client:
                workers = sorted(client.scheduler_info()["workers"])
                paused, active = workers
                client.submit(_hog, 0.9, workers=[paused], pure=False).result(timeout=60)
                # the other worker keeps working: the old watchdog never fired
                assert client.submit(_inc, 1, workers=[active], pure=False).result(30) == 2
                fut = client.submit(_inc, 2, workers=[paused], pure=False)
                fut.result(timeout=90)
        elapsed = time.monotonic() - t0
    line = str(exc.value)
    assert "\n" not in line
    assert f"Dask worker {paused} has been paused at its memory limit (400.00 MiB)" in line
    assert "for 3 s with work pending" in line and "cluster.memory_limit" in line
    assert active not in line and not re.search(r"every worker", line)
    assert elapsed < 90
