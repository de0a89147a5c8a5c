"""The cost model's I/O prices (kpca_dask.cost.io) and its per-worker drivers
(kpca_dask.cost.price_workers): unit arithmetic on given rates, no machine's digits."""

import math

import dask.array as da
import pytest

from kpca_dask import KernelPCA
from kpca_dask.cost import Cluster, Machine
from kpca_dask.cost.io import Transfer, price_transfers, store_rates
from kpca_dask.cost.price_workers import WORKER_TASKS, worker_pass_tasks
from kpca_dask.cost.pricing import _row_chunks
from kpca_dask.worker_passes import basis_pass_tasks, reduction_tasks

STORE = {"latency": 0.5, "read": 1e6, "write": 2e6, "read_aggregate": 3e6}
STORE |= {"write_aggregate": 4e6}
M = Machine(object_stores={"s3": STORE}, storage=1e7, disk_latency=0.0)


def test_store_rates_by_scheme_with_the_built_in_entry_for_others():
    assert store_rates(M, "s3://b/x", write=False) == {
        "latency": 0.5,
        "stream": 1e6,
        "aggregate": 3e6,
    }
    assert store_rates(M, "s3://b/x", write=True)["stream"] == 2e6
    assert store_rates(M, "/tmp/x", write=True) == {
        "latency": 0.0,
        "stream": 1e7,
        "aggregate": 1e7,
    }
    other = store_rates(M, "gs://b/x", write=False)  # not calibrated: the given entry
    assert other["latency"] == Machine().object_stores["*"]["latency"]


def test_chunks_run_in_waves_on_the_cores_and_pay_latency_and_bytes_each():
    # 10 chunks of 1 MB read from s3 on 2 cores: 5 waves of (0.5 s + 1 s)
    t = [Transfer("source", "s3://b/x", 10e6, 10, write=False)]
    p = price_transfers(t, M, chunks=10, cores=2, nodes=1)
    assert p["io"] == pytest.approx(5 * 1.5)
    # the streams a node runs at once share its aggregate (3 MB/s): 10 cores get 0.3 MB/s
    # each, one wave of (0.5 s + 1 MB at 0.3 MB/s), above the aggregate's floor
    p = price_transfers(t, M, chunks=10, cores=10, nodes=1)
    assert p["io"] == pytest.approx(0.5 + 1e6 / 0.3e6) and p["store"] == pytest.approx(
        10e6 / 3e6
    )
    assert p["seconds"] == p["io"]
    # spread over 5 nodes: 2 streams a node, each at its own 1 MB/s again
    p = price_transfers(t, M, chunks=10, cores=10, nodes=5)
    assert p["io"] == pytest.approx(1.5)
    # two nodes: twice the aggregate
    assert price_transfers(t, M, chunks=10, cores=10, nodes=2)["store"] == pytest.approx(
        10e6 / 6e6
    )
    # a format cost a core and compute add to each chunk's task
    t2 = [Transfer("parquet", "/tmp/o", 4e6, 2, write=True, format_rate=1e6)]
    p = price_transfers(t2, M, chunks=2, cores=2, nodes=1, compute=6.0)
    # (the local disk's one stream shared by the two tasks: 5 MB/s each)
    assert p["io"] == pytest.approx(2e6 / 5e6 + 2e6 / 1e6 + 3.0)


def _plan(n, solver="randomized", d=32):
    X = da.zeros((n, d), chunks=(min(n, 100_000), d))
    return KernelPCA(16, kernel="rbf", eigen_solver=solver).plan(X, kernel=False)


@pytest.mark.parametrize("solver", ["randomized", "nystroem"])
def test_the_per_worker_driver_has_tasks_that_grow_with_the_cluster_not_n(solver):
    cl = Cluster(workers=32, threads=16, memory=64e9)
    from kpca_dask.worker_passes import pass_tasks

    work, reduce = worker_pass_tasks(32)
    # the model's counts are the driver's: one share task a worker, the tree of sums
    assert work + reduce == pass_tasks(32, n_blocks=500) == 32 * WORKER_TASKS + 8 + 2 + 1
    counts = {}
    for n in (40_000, 160_000, 1_000_000):
        w = _plan(n, solver).estimate(cl, passes=6, driver="workers")
        b = _plan(n, solver).estimate(cl, passes=6)
        assert w.driver == "workers" and b.driver == "blocks"
        if solver == "nystroem":  # the driver's count: min(W, nb) shares and their tree
            from kpca_dask.solvers.nystroem.worker_passes import pass_tasks as nys_tasks

            nb = len(_row_chunks(n, int(_plan(n, solver).block_rows)))
            assert w.tasks_per_pass == nys_tasks(32, nb) <= work + reduce
            shares = min(32, nb)
            assert nys_tasks(32, nb) == shares + reduction_tasks(shares)
        else:  # the basis's row panels too: the count the driver runs
            chunks = _row_chunks(n, int(_plan(n, solver).block_rows))
            assert w.tasks_per_pass == basis_pass_tasks(chunks, 32)
            assert w.tasks_per_pass <= 4 * 32 + reduce + math.ceil(32 / 4)
        counts[n] = b.tasks_per_pass
        # the same arithmetic a pass
        assert w.flops_per_pass == pytest.approx(b.flops_per_pass)
    assert counts[1_000_000] > counts[40_000]  # the block drivers' grow with n


def test_the_per_worker_driver_keeps_the_client_flat_in_n():
    cl = Cluster(workers=32, threads=16, memory=64e9)
    small = _plan(100_000).estimate(cl, passes=10, driver="workers")
    large = _plan(1_000_000).estimate(cl, passes=10, driver="workers")
    assert large.memory_client == small.memory_client < 300e6
    assert large.bytes_to_client_per_pass == small.bytes_to_client_per_pass
    client = [s.parts.get("client", 0) for s in large.stages if s.name == "passes"]
    blocks = _plan(1_000_000).estimate(cl, passes=10)
    assert blocks.memory_client > 10 * large.memory_client
    assert client and client[0] < sum(
        s.parts.get("client", 0) for s in blocks.stages if s.name == "passes"
    )


def test_an_unknown_driver_is_refused():
    with pytest.raises(ValueError, match="'blocks' or 'workers'"):
        _plan(10_000).estimate(Cluster(), driver="nodes")


def test_the_solves_read_of_the_rows_is_priced_at_the_stores_rates():
    plan = _plan(1_000_000, "nystroem")
    cl = Cluster(workers=4, threads=2, memory=64e9)
    slow = {k: v / 100 for k, v in STORE.items()} | {"latency": 1.0}
    m = Machine(object_stores={"s3": slow})

    def read(store):
        est = plan.estimate(cl, m, input_in_memory=False, persist=True, store=store)
        return est.stages[0].parts["storage"]

    local = read("/data/run")
    assert read(None) == local
    # 8 chunks of rows from a store of 1 s a request and 10-40 kB/s: far slower
    assert read("s3://bucket/run") > 100 * local
