"""Waiting is bounded: a service that is not a Dask scheduler on ``cluster.address``, and a
kernel that overflows during the Nyström landmark search."""

from __future__ import annotations

import socket
import threading
import time

import dask.array as da
import numpy as np
import pytest

from kpca_dask import KernelPCA
from kpca_dask.exceptions import InvalidInputError
from pipeline.config import ClusterConfig
from pipeline.runtime.cluster import ClusterError, dask_client


@pytest.fixture
def silent_server():
    """Accepts connections and never says a word (the worst case for a handshake)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    held, stop = [], threading.Event()

    def serve():
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(s.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield s.getsockname()[1]
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    s.close()


def test_silent_service_on_the_scheduler_address_fails_within_the_timeout(silent_server):
    cfg = ClusterConfig(address=f"tcp://127.0.0.1:{silent_server}", connect_timeout=1.5)
    t0 = time.perf_counter()
    with pytest.raises(ClusterError, match="did not complete a Dask handshake within 1.5 s"):
        with dask_client(cfg):
            pass
    assert time.perf_counter() - t0 < 1.5 + 5


def test_a_real_scheduler_passes_the_probe(dask_cluster):
    cfg = ClusterConfig(
        address=dask_cluster.scheduler_address, connect_timeout=10, paused_timeout=None
    )
    with dask_client(cfg) as client:
        assert client.submit(lambda: 41 + 1).result() == 42


@pytest.mark.parametrize("method", ["rpcholesky", "kmeans++", "uniform"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_overflowing_kernel_ends_the_landmark_search_in_one_line(method, dtype):
    X = 1e300 * (1.0 + np.random.default_rng(0).random((2000, 3)))
    t0 = time.perf_counter()
    with pytest.raises(
        InvalidInputError, match="kernel returned NaN or infinity.*scale the data"
    ):
        KernelPCA(
            2,
            kernel="rbf",
            gamma=0.1,
            eigen_solver="nystroem",
            landmark_method=method,
            dtype=dtype,
        ).fit(da.from_array(X, chunks=(500, -1)))
    assert time.perf_counter() - t0 < 60
