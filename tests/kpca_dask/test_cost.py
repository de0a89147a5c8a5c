"""The cost model (kpca_dask.cost) against what a real LocalCluster does, the block rule,
and the execution rule (small fits on the client's threads when a cluster would not pay)."""

import json
import math
import time
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, get_task_stream

from kpca_dask import KernelPCA
from kpca_dask.cost import (
    EXECUTION_CONFIG,
    Cluster,
    Machine,
    calibrate,
    choose_execution,
    estimate,
    exact_waves,
    load_machine,
)
from kpca_dask.gram import BlockKernelMatrix
from kpca_dask.kernels import make_kernel
from kpca_dask.plan import MAX_TASKS_PER_PASS, TASKS_PER_PASS, auto_block_rows

pytestmark = pytest.mark.distributed


def _lazy(n, d):
    return da.zeros((n, d), chunks=(min(n, 100_000), d))


# ----------------------------------------------------------------- block rule
def test_block_tasks_per_pass_at_a_million_rows():
    plan = KernelPCA(16, kernel="rbf", eigen_solver="randomized").plan(
        _lazy(1_000_000, 64), kernel=False
    )
    nb = math.ceil(1_000_000 / plan.block_rows)
    assert nb * (nb + 1) // 2 <= TASKS_PER_PASS  # "low thousands" (was 119 805)
    est = plan.estimate(Cluster(workers=128, threads=1), passes=10)
    assert est.block_tasks_per_pass == nb * (nb + 1) // 2 <= 20_000
    # a huge cluster gets three tasks per thread, never more than the hard cap
    r = auto_block_rows(1_000_000, threads=5000)
    nb = math.ceil(1_000_000 / r)
    assert TASKS_PER_PASS < nb * (nb + 1) // 2 <= MAX_TASKS_PER_PASS


def test_block_rule_sizes():
    assert auto_block_rows(20_000) == 2000  # ~2048 below 50 000 rows
    assert auto_block_rows(100_000) == 4000  # ~4096 from 50 000 rows on (measured win)
    # stored (kernel store) blocks stay within the workers' 32 MiB mmap threshold
    for item in (4, 8):
        r = auto_block_rows(100_000, stored_itemsize=item)
        assert r * r * item <= 32 << 20
    # Nyström: ~8192 rows, at most TASKS_PER_PASS blocks
    assert auto_block_rows(60_000, "nystroem") == 7500
    assert math.ceil(10**8 / auto_block_rows(10**8, "nystroem")) <= TASKS_PER_PASS


def test_pipeline_uses_the_estimators_rule(tmp_path):
    from pipeline.config import load_config
    from pipeline.model.fitspec import auto_rows as _auto_rows

    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(
        f"input: {{path: {tmp_path / 'x.npy'}}}\noutput: {{path: {tmp_path / 'out'}}}\n"
        "solver: {n_components: 8, eigen_solver: randomized}\n"
    )
    cfg = load_config(str(cfg_path))
    n, d = 120_000, 16
    plan = KernelPCA(8, kernel="rbf", eigen_solver="randomized").plan(_lazy(n, d), kernel=False)
    assert _auto_rows(cfg, n, d) == plan.block_rows


# ------------------------------------------------------- the issue's figures
def test_model_prices_the_issue_figures_of_the_old_blocks():
    """Issue 28, modelled from the code: n = 1M on 128 threads with 2 045-row blocks is
    119 805 block tasks and 308 waves a pass (16 + 16 columns); with the waves' sums added
    on the workers, n x l x 8 bytes come to the client whatever the waves (the issue's
    52 GB was the driver that gathered every wave's partial sums)."""
    plan = KernelPCA(16, kernel="rbf", eigen_solver="randomized", chunk_size=2045).plan(
        _lazy(1_000_000, 64), kernel=False
    )
    est = plan.estimate(Cluster(workers=128, threads=1), n_oversamples=16)
    assert est.block_tasks_per_pass == 119_805
    assert est.waves_per_pass == 308
    assert est.bytes_to_client_per_pass == 1_000_000 * 32 * 8
    new = KernelPCA(16, kernel="rbf", eigen_solver="randomized").plan(
        _lazy(1_000_000, 64), kernel=False
    )
    est2 = new.estimate(Cluster(workers=128, threads=1), n_oversamples=16)
    assert est2.tasks_per_pass < est.tasks_per_pass / 20
    scheduler = [e.stages[-1].parts["scheduler"] for e in (est, est2)]
    assert scheduler[1] < scheduler[0] / 20


# ------------------------------------------- counts against a real cluster
def _outgoing(client, since: float):
    """Each worker's (who asked, bytes) of the data it sent since ``since`` (same host's
    clock; by time, not by position: the log is bounded and a session's cluster fills it)."""

    def log(dask_worker, since=since):
        return [
            (e["who"], e["total"])
            for e in dask_worker.transfer_outgoing_log
            if e["start"] >= since
        ]

    return client.run(log)


def test_exact_pass_tasks_and_client_bytes_match_the_cluster(dask_cluster):
    n, r, c = 6000, 250, 9
    rng = np.random.default_rng(0)
    Xn = rng.normal(size=(n, 4))
    with Client(dask_cluster) as client:
        plan = KernelPCA(
            c - 2, kernel="rbf", gamma=0.5, eigen_solver="randomized", chunk_size=r
        ).plan(Xn)
        est = estimate(plan, Cluster.from_client(client), n_components=c - 2, n_oversamples=2)
        X = da.from_array(Xn, chunks=(r, 4)).persist()
        K = BlockKernelMatrix(X, make_kernel("rbf", gamma=0.5), np.float32)
        Z = rng.normal(size=(n, c))
        t0 = time.time()
        with get_task_stream(client) as ts:
            Y = K.product(Z)
        after = _outgoing(client, t0)
        workers = set(after)
        new = [e for w in after for e in after[w]]
        to_client = sum(t for who, t in new if who not in workers)
    assert Y.shape == (n, c)
    assert est.columns == c
    assert len(exact_waves([r] * (n // r), 128)) == est.waves_per_pass > 1
    assert abs(len(ts.data) - est.tasks_per_pass) <= 0.1 * est.tasks_per_pass
    assert abs(to_client - est.bytes_to_client_per_pass) <= 0.1 * est.bytes_to_client_per_pass


def test_fit_block_tasks_per_pass_match_the_plan(dask_cluster):
    X = np.random.default_rng(1).normal(size=(1500, 5))
    kw = dict(kernel="rbf", gamma=0.2, eigen_solver="randomized", n_power_iter=1)
    with Client(dask_cluster) as client, dask.config.set({EXECUTION_CONFIG: "cluster"}):
        est = KernelPCA(4, chunk_size=250, **kw)
        plan = est.plan(X)
        with get_task_stream(client) as ts, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one power iteration: not certified
            est.fit(X)
        model = plan.estimate(Cluster.from_client(client))
    parts = sum("kpca-kz-part" in str(t["key"]) for t in ts.data)
    assert parts == model.block_tasks_per_pass * est.n_passes_
    assert est.solver_info_["executed"].startswith("cluster (forced")


def test_nystroem_pass_tasks_match_the_model(dask_cluster):
    X = np.random.default_rng(2).normal(size=(4000, 5))
    kw = dict(
        kernel="rbf",
        gamma=0.2,
        eigen_solver="nystroem",
        n_landmarks=64,
        nystroem_method="covariance",
        chunk_size=250,
        landmark_method="uniform",
    )
    with Client(dask_cluster) as client, dask.config.set({EXECUTION_CONFIG: "cluster"}):
        est = KernelPCA(4, **kw)
        plan = est.plan(X)
        est.fit(X)  # landmarks and warm-up
        with get_task_stream(client) as ts:
            est.fit(X)
        model = plan.estimate(Cluster.from_client(client))
    nys = [t for t in ts.data if "kpca-nys-" in str(t["key"])]
    blocks = [t for t in nys if "kpca-nys-block" in str(t["key"])]
    assert len(blocks) == model.block_tasks_per_pass * est.n_passes_
    sums = len([t for t in nys if "-sum" in str(t["key"])])
    assert sums + len(blocks) == pytest.approx(model.tasks_per_pass * est.n_passes_, rel=0.1)


# ------------------------------------------------------------ execution rule
def test_small_fit_runs_on_local_threads_and_matches_the_cluster(dask_cluster):
    X = np.random.default_rng(3).normal(size=(400, 6))
    kw = dict(kernel="rbf", gamma=0.1, eigen_solver="dense")
    with Client(dask_cluster) as client:
        with get_task_stream(client) as ts:
            m = KernelPCA(5, **kw).fit(X)
            emb = m.transform(X[:50])
        assert m.solver_info_["executed"].startswith("local threads (n=400")
        ran = [t for t in ts.data if "kpca" in str(t["key"]) and "ping" not in str(t["key"])]
        assert not ran, "ran on the cluster"
        with dask.config.set({EXECUTION_CONFIG: "cluster"}), get_task_stream(client) as ts2:
            ref = KernelPCA(5, **kw).fit(X)
            ref_emb = ref.transform(X[:50])
        assert {t["worker"] for t in ts2.data}, "the forced fit did not use the cluster"
        assert ref.solver_info_["executed"].startswith("cluster")
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(m.eigenvectors_, ref.eigenvectors_, atol=1e-10)
    np.testing.assert_allclose(emb, ref_emb, atol=1e-10)


@pytest.mark.cluster  # a fresh Python process
def test_large_fit_on_a_wider_cluster_uses_it():
    """A fit whose compute dwarfs the cluster's overhead goes to the cluster: n = 400 000
    Nyström on a cluster of 2 x 4 threads (the decision only; nothing is fitted)."""
    from distributed import LocalCluster

    est = KernelPCA(16, kernel="rbf", gamma=0.1)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=4,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        ) as cluster,
        Client(cluster),
    ):
        plan = est.plan(_lazy(400_000, 32), kernel=False)
        where = choose_execution(plan, est.get_params())
    assert where.where == "cluster", where.reason


def test_no_client_says_so():
    m = KernelPCA(3, kernel="rbf", gamma=0.5).fit(np.random.default_rng(0).normal(size=(60, 3)))
    assert "no distributed client" in m.solver_info_["executed"]


# --------------------------------------------------------------- calibration
def test_calibration_is_measured_and_read_back(dask_cluster, tmp_path, monkeypatch):
    with Client(dask_cluster) as client:
        m = calibrate(client, quick=True)
    assert m.gemm("float64") > 1e8 and m.gemm("float32") > 1e8
    assert m.exp("float64") > 1e6 and m.mem_bandwidth > 1e8
    assert 0 < m.task_seconds < 1 and 0 < m.roundtrip_seconds < 30
    assert m.source.startswith("kpca calibrate")
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(m.to_dict()))
    monkeypatch.setenv("KPCA_CALIBRATION", str(path))
    assert load_machine() == m
    # twice the GEMM rate: a compute-bound prediction halves (the constants are used)
    plan = KernelPCA(8, kernel="linear", eigen_solver="randomized").plan(
        _lazy(100_000, 512), kernel=False
    )
    fast = Machine(**{**m.to_dict(), "gemm_flops": {k: 2 * v for k, v in m.gemm_flops.items()}})
    cl = Cluster(workers=64, threads=16, distributed=False)
    a = plan.estimate(cl, m, passes=5).stages[-1].parts["compute"]
    b = plan.estimate(cl, fast, passes=5).stages[-1].parts["compute"]
    assert b == pytest.approx(a / 2, rel=1e-6)
    # the block factors: measured on every worker thread at once, both dtypes, and used
    kinds = {"recompute", "fill", "fill_large", "stored"}
    for dt in ("float32", "float64"):
        assert set(m.block_factors[dt]) == kinds
        assert all(0 < v < 100 and math.isfinite(v) for v in m.block_factors[dt].values())
    slow = Machine(
        **{
            **m.to_dict(),
            "block_factors": {
                dt: {**f, "recompute": 2 * f["recompute"]} for dt, f in m.block_factors.items()
            },
        }
    )
    c = plan.estimate(cl, slow, passes=5, kernel_cache="recompute").stages[-1].parts["compute"]
    a = plan.estimate(cl, m, passes=5, kernel_cache="recompute").stages[-1].parts["compute"]
    assert c == pytest.approx(2 * a, rel=1e-6)
    # new pages: measured (every core at once), and read back above
    assert 1e7 < m.page_touch < 1e12 and math.isfinite(m.page_touch)


def test_new_pages_are_measured_held_and_given_back():
    """``page_touch`` is measured on mappings held until the end (the kept blocks are
    held: a VM hands back pages freed a moment ago faster, docs/scaling.md): the
    process's resident memory, sampled while it measures, grows by all of them at once;
    and every mapping is released afterwards."""
    import threading

    import psutil

    from kpca_dask.cost.calibration import _page_touch_rate

    proc = psutil.Process()
    before = proc.memory_info().rss
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(proc.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rate = _page_touch_rate(256 << 20, 32 << 20)
    finally:
        done.set()
        sampler.join()
    assert 1e7 < rate < 1e12 and math.isfinite(rate)
    assert max(peak) - before >= 200 << 20  # more than a few 32 MiB mappings at once
    assert proc.memory_info().rss - before < 64 << 20


# ------------------------------------------------------------- kernel cache tier
def test_auto_cache_tier_is_the_one_the_fit_takes(dask_cluster):
    """estimate(kernel_cache="auto") prices the tier the estimator's rule picks: the
    blocks kept when they fit half of the workers' memory (here: they do), recomputed
    when they do not or the memory is unknown."""
    X = np.random.default_rng(3).normal(size=(3000, 4))
    kw = dict(kernel="rbf", gamma=0.5, eigen_solver="randomized", chunk_size=500)
    with Client(dask_cluster) as client, dask.config.set({EXECUTION_CONFIG: "cluster"}):
        est = KernelPCA(4, **kw).fit(X)
        cl = Cluster.from_client(client)
    assert est.solver_info_["kernel_cache"]["tier"] == "memory"
    plan = KernelPCA(4, **kw).plan(X)
    kept = plan.estimate(cl, passes=int(est.n_passes_))
    assert kept.kernel_cache == "memory"
    again = plan.estimate(cl, kernel_cache="recompute")
    assert kept.memory_per_worker > again.memory_per_worker
    tight = Cluster(workers=cl.workers, threads=cl.threads, memory=1e6)
    unknown = Cluster(workers=cl.workers, threads=cl.threads)
    for other in (tight, unknown):
        assert plan.estimate(other, passes=int(est.n_passes_)).kernel_cache == "recompute"


def test_memory_tier_prices_the_fill_then_kept_blocks():
    """The cache's first pass evaluates every block into fresh memory and multiplies the
    kept blocks; every later pass only multiplies them."""
    plan = KernelPCA(16, kernel="rbf", eigen_solver="randomized").plan(
        _lazy(50_000, 32), kernel=False
    )
    cl = Cluster(workers=2, threads=1, memory=64 * 2**30)
    m = Machine()
    kept = plan.estimate(cl, m, passes=6, kernel_cache="memory")
    again = plan.estimate(cl, m, passes=6, kernel_cache="recompute")
    first, later = (s.parts["compute"] for s in kept.stages[1:3])
    assert later / 5 < first  # the fill on top of the products
    assert later / 5 < again.stages[2].parts["compute"] / 5  # kept blocks: no evaluation
    # the kept blocks land on new pages: their bytes at Machine.page_touch, on each core,
    # in the first pass only
    slow_pages = Machine(page_touch=m.page_touch / 2)
    paged = plan.estimate(cl, slow_pages, passes=6, kernel_cache="memory")
    first_paged, later_paged = (s.parts["compute"] for s in paged.stages[1:3])
    assert later_paged == pytest.approx(later, rel=1e-12)
    kept_bytes = kept.kernel_cache_bytes
    assert kept_bytes >= 50_000 * 50_000 // 2 * 4  # the upper blocks, float32 at least
    cores = cl.cores
    assert first_paged - first >= 0.99 * kept_bytes / m.page_touch / cores
    assert first_paged - first <= 1.2 * kept_bytes / m.page_touch / cores  # imbalance
    # compute and the scheduler add (a worker waits for its next task); the client after
    s = kept.stages[2]
    assert s.seconds == pytest.approx(
        max(s.parts["compute"] + s.parts["scheduler"], s.parts["network"]) + s.parts["client"]
    )


def test_mixed_precision_is_priced_as_it_runs():
    """A float64 fit on float32 blocks (block_dtype='auto' at n = 20 000, rbf): the cache
    holds float32 blocks (half the float64 fit's bytes) and one float64 pass certifies;
    block_dtype='float64' has no such pass."""
    X = np.zeros((20_000, 64))
    cl = Cluster(workers=1, threads=2, memory=16 << 30, distributed=False)
    mixed = KernelPCA(16, kernel="rbf", gamma=1 / 64).plan(X)
    blocks64 = KernelPCA(16, kernel="rbf", gamma=1 / 64, block_dtype="float64").plan(X)
    assert mixed.mixed and not blocks64.mixed
    a = mixed.estimate(cl, passes=13, kernel_cache="memory")
    b = blocks64.estimate(cl, passes=13, kernel_cache="memory")
    assert [s.name for s in a.stages][-1] == "certifying pass (float64)"
    assert "certifying pass (float64)" not in [s.name for s in b.stages]
    cache = a.kernel_evaluations_per_pass * 4
    assert b.memory_per_worker - a.memory_per_worker >= 0.9 * cache
