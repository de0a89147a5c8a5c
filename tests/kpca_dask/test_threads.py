"""BLAS threads x dask threads never exceed the cores (issue 17), seen where BLAS runs.

The BLAS limit is read with threadpoolctl *inside* the kernel-evaluation tasks of
real fits (a block kernel callable records it) on the threaded scheduler, on an
in-process LocalCluster and on the multi-process LocalCluster fixture, and on the
driver while the randomized solver runs (its per-pass log record).
"""

from __future__ import annotations

import logging
from pathlib import Path

import dask
import numpy as np
import pytest
from sklearn.datasets import make_blobs

from kpca_dask import KernelPCA
from kpca_dask.threads import (
    DRIVER_BLAS_THREADS,
    _cgroup_quota,
    blas_threads,
    blas_threads_for_dask,
    cpu_count,
)

X = make_blobs(600, n_features=8, centers=5, random_state=0)[0]


def probe_kernel(path: Path, gamma: float = 0.1):
    """An rbf block kernel that appends the BLAS thread limit it runs under to ``path``."""

    def kernel(A, B):
        from threadpoolctl import threadpool_info

        n = max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
        with open(path, "a") as f:
            f.write(f"{n}\n")
        d = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T
        return np.exp(-gamma * np.maximum(d, 0.0))

    return kernel


class _DriverProbe(logging.Handler):
    """Reads the driver's BLAS limit whenever the randomized solver logs a pass."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.seen: list[int] = []

    def emit(self, record):
        if record.getMessage().startswith("randomized solver: pass"):
            self.seen.append(blas_threads())


@pytest.fixture
def driver_probe():
    log = logging.getLogger("kpca_dask")
    probe, level = _DriverProbe(), log.level
    log.addHandler(probe)
    log.setLevel(logging.INFO)
    try:
        yield probe
    finally:
        log.removeHandler(probe)
        log.setLevel(level)


def _fit(path: Path) -> KernelPCA:
    m = KernelPCA(
        6, kernel=probe_kernel(path), eigen_solver="randomized", chunk_size=150, random_state=0
    )
    return m.fit(X)


def _seen(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def test_blas_limit_inside_tasks_on_the_threaded_scheduler(tmp_path, driver_probe):
    path = tmp_path / "blas.txt"
    with dask.config.set(scheduler="threads", num_workers=2):
        _fit(path)
    seen = _seen(path)
    assert len(seen) >= 10  # every block evaluation reported
    assert max(seen) <= max(1, cpu_count() // 2), seen
    assert driver_probe.seen and max(driver_probe.seen) <= DRIVER_BLAS_THREADS


def test_blas_limit_inside_tasks_on_an_in_process_local_cluster(tmp_path, driver_probe):
    """Workers in this process share its BLAS: 2 worker threads on this machine's
    cores get ``cores // 2`` BLAS threads each (OpenBLAS's default is one per core)."""
    from distributed import Client, LocalCluster

    path = tmp_path / "blas.txt"
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster),
    ):
        _fit(path)
    seen = _seen(path)
    assert seen and max(seen) <= max(1, cpu_count() // 2), seen
    assert driver_probe.seen and max(driver_probe.seen) <= DRIVER_BLAS_THREADS


def test_blas_limit_inside_tasks_on_local_cluster_worker_processes(tmp_path, dask_client):
    """The multi-process LocalCluster fixture (1 thread per worker): tasks run under
    ``worker cores // worker threads`` BLAS threads, and the plugin is installed."""
    path = tmp_path / "blas.txt"
    _fit(path)
    seen = _seen(path)
    limits = dask_client.run(lambda: (blas_threads(), cpu_count()))
    assert seen and all(b <= c for b, c in limits.values()), limits
    assert max(seen) <= max(c for _, c in limits.values())
    plugins = dask_client.run(lambda dask_worker: sorted(dask_worker.plugins))
    assert all("kpca-dask-blas-limit" in p for p in plugins.values()), plugins


def test_the_driver_limit_is_restored_after_the_solve(tmp_path):
    before = blas_threads()
    with dask.config.set(scheduler="threads"):
        _fit(tmp_path / "blas.txt")
    assert blas_threads() == before
    with dask.config.set(scheduler="threads", num_workers=cpu_count()), blas_threads_for_dask():
        assert blas_threads() == 1


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cgroup_cpu_quota(tmp_path, files, expected):
    """cgroup v2 ``cpu.max`` and v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, as the
    kernel writes them (a real folder laid out like /sys/fs/cgroup)."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cgroup_quota(tmp_path) == expected


def test_cpu_count_within_affinity_and_quota():
    import math
    import os

    cores = cpu_count()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    quota = _cgroup_quota()
    if quota is not None:
        assert cores <= max(1, math.floor(quota))
