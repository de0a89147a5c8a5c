"""Shared fixtures: data sets and a real multi-process Dask cluster on 127.0.0.1."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sklearn.datasets import make_blobs, make_circles, make_moons


def _datasets(n: int = 300, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "blobs": make_blobs(n, n_features=4, centers=4, random_state=seed)[0],
        "moons": make_moons(n, noise=0.05, random_state=seed)[0],
        "circles": make_circles(n, noise=0.05, factor=0.4, random_state=seed)[0],
        "random": rng.standard_normal((n, 6)),
    }


DATASETS = _datasets()


@pytest.fixture(params=sorted(DATASETS))
def dataset(request) -> tuple[str, np.ndarray]:
    return request.param, DATASETS[request.param]


@pytest.fixture(scope="session")
def dask_cluster():
    """A LocalCluster of 2 worker processes (1 thread each) bound to 127.0.0.1."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        memory_limit="2GiB",
        silence_logs=logging.ERROR,
    ) as cluster:
        yield cluster


@pytest.fixture
def dask_client(dask_cluster):
    """A client of ``dask_cluster``; the estimator runs every fit on the cluster (its
    execution rule would run these small fits on local threads: tests/kpca_dask/
    test_cost.py tests the rule itself)."""
    import dask
    from distributed import Client

    with Client(dask_cluster) as client, dask.config.set({"kpca.execution": "cluster"}):
        yield client


def align_signs(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Flip the columns of A to best match B (embeddings agree up to sign)."""
    s = np.sign(np.sum(A * B, axis=0))
    s[s == 0] = 1
    return A * s
