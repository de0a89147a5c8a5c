"""``K @ Z`` on a distributed cluster: the waves' partial sums are added on the workers,
so the bytes that reach the caller per product do not grow with the number of waves, and
the result has the same bits as the same product on the threaded scheduler."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest

from kpca_dask.gram import BlockKernelMatrix
from kpca_dask.kernels import make_kernel

pytestmark = pytest.mark.distributed


def _matrix(n=2400, d=5, rows=200, seed=0, block_reader=None):
    X = np.random.default_rng(seed).normal(size=(n, d))
    K = BlockKernelMatrix(
        da.from_array(X, chunks=(rows, d)), make_kernel("rbf", gamma=0.3), np.float64
    )
    return K


def _outgoing(client, since: float) -> list[dict]:
    """Every worker's record of the data it sent since ``since`` (distributed's own log:
    who asked, how many bytes; filtered by time, as the log is bounded and a session's
    cluster fills it)."""

    def log(dask_worker, since=since):
        log = dask_worker.transfer_outgoing_log
        return [{"who": e["who"], "total": e["total"]} for e in log if e["start"] >= since]

    return [e for entries in client.run(log).values() for e in entries]


def _bytes_to_caller(client, fn) -> tuple[int, int]:
    """(bytes the workers sent to a non-worker, bytes sent between workers) while ``fn``
    ran."""
    workers = set(client.scheduler_info()["workers"])
    time.sleep(0.2)  # the log's clock: nothing earlier falls after t0
    t0 = time.time()
    fn()
    new = _outgoing(client, t0)
    to_caller = sum(e["total"] for e in new if e["who"] not in workers)
    between = sum(e["total"] for e in new if e["who"] in workers)
    return to_caller, between


@pytest.mark.parametrize("wave_tasks", [None, 15, 40])
def test_same_bits_as_threads_for_any_wave_size(dask_client, wave_tasks):
    K = _matrix()
    Z = np.random.default_rng(1).normal(size=(K.n, 7))
    with dask.config.set(scheduler="threads"):
        ref = K.product(Z, wave_tasks=wave_tasks)
    got = K.product(Z, wave_tasks=wave_tasks)  # the client is the default scheduler
    np.testing.assert_array_equal(got, ref)
    dense = K.to_numpy() @ Z
    np.testing.assert_allclose(got, dense, rtol=1e-12, atol=1e-10)


def test_waves_run_backwards_as_for_a_stored_kernel(dask_client):
    """A stored kernel alternates the waves' direction every pass: then no row block is
    final before the last wave, and every row block must still get all its sums."""
    K = _matrix(n=1800, rows=150)
    Z = np.random.default_rng(2).normal(size=(K.n, 4))
    nb = K.n_blocks
    offsets = np.concatenate([[0], np.cumsum(K.row_chunks)])
    waves = [(s, min(s + 2, nb)) for s in range(0, nb, 2)][::-1]
    Y = np.full((K.n, 4), np.nan)
    K._product_on_cluster(dask_client, Z, waves, "backwards-test", offsets, Y)
    np.testing.assert_allclose(Y, K.to_numpy() @ Z, rtol=1e-12, atol=1e-10)


def test_bytes_into_the_caller_do_not_grow_with_the_waves(dask_client):
    """Measured with distributed's own log of what each worker sent
    to whom: with 12 row blocks and waves of one block row (12 waves), the caller
    receives about n x l x 8 bytes, not the sum of every wave's partial sums (about
    6.5 x n x l x 8 before)."""
    K = _matrix(n=6000, d=4, rows=500)
    l = 32
    Z = np.random.default_rng(3).normal(size=(K.n, l))
    K.product(Z, wave_tasks=1)  # warm: workers import, first graph
    nbytes = K.n * l * 8
    read, _ = _bytes_to_caller(dask_client, lambda: K.product(Z, wave_tasks=1))
    assert read <= 1.5 * nbytes, f"{read / nbytes:.2f} x n l 8 bytes into the caller"
    assert read >= 0.9 * nbytes  # the counter does see the result arrive


def _counted_rows(block, folder):
    """The identity, leaving one file per call in ``folder`` (a worker process's
    counter the test can read)."""
    import os
    import uuid

    if block.size:  # not dask's call on an empty array to infer the meta
        open(os.path.join(folder, uuid.uuid4().hex), "w").close()
    return block


def test_the_rows_are_read_once_per_pass_not_once_per_wave(dask_client, tmp_path):
    """Two waves are on the cluster at a time. When each wave's graph carried the
    rows' own tasks again, the scheduler was handed keys it was releasing from the
    wave before: in a full run it lost a worker (distributed's "'<' not supported
    between NoneType" in _add_to_memory) and the fit died with a KeyError for a row
    block. The rows are persisted for the pass instead: each row block's task runs
    once per product, whatever the number of waves."""
    n, rows = 2400, 200
    X0 = np.random.default_rng(4).normal(size=(n, 5))
    X = da.from_array(X0, chunks=(rows, 5)).map_blocks(
        _counted_rows, str(tmp_path), dtype=X0.dtype, name="counted-rows"
    )
    K = BlockKernelMatrix(X, make_kernel("rbf", gamma=0.3), np.float64)
    Z = np.random.default_rng(5).normal(size=(n, 3))
    got = K.product(Z, wave_tasks=15)  # 12 row blocks: several waves
    assert len(list(tmp_path.iterdir())) == K.n_blocks
    dense = BlockKernelMatrix(
        da.from_array(X0, chunks=(rows, 5)), make_kernel("rbf", gamma=0.3), np.float64
    ).to_numpy()
    np.testing.assert_allclose(got, dense @ Z, rtol=1e-12, atol=1e-10)
