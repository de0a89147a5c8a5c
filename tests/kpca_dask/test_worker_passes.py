"""The per-worker pass driver of the exact solve (kpca_dask.worker_passes, issue 38): a pass
is one task per worker and a tree of sums on the workers, whatever ``n``; its products and
fits equal the waves driver's and scipy's to rounding; the resident rows and kept blocks
are released after the fit."""

from __future__ import annotations

import logging
import time

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.linalg
from sklearn.datasets import make_blobs

from kpca_dask import KernelPCA
from kpca_dask.cost.price_workers import BASIS_ROUND_TRIPS
from kpca_dask.gram import BlockKernelMatrix
from kpca_dask.kernels import make_kernel
from kpca_dask.worker_passes import (
    DRIVER_CONFIG,
    REDUCE_FAN_IN,
    assign_pairs,
    basis_pass_tasks,
    pass_tasks,
    reduction_tasks,
    share_product,
    sum_shares,
)
from tests.clusters import local_cluster

WORKERS = {DRIVER_CONFIG: "workers"}


# ------------------------------------------------------------------ no cluster
@pytest.mark.parametrize("nb, w", [(1, 4), (3, 16), (10, 2), (25, 16), (40, 5), (88, 32)])
def test_shares_cover_every_upper_pair_once_and_are_balanced(nb, w):
    chunks = [100] * (nb - 1) + [37]
    shares = assign_pairs(chunks, w)
    got = sorted(p for s in shares for p in s)
    assert got == [(i, j) for i in range(nb) for j in range(i, nb)]
    pairs = nb * (nb + 1) // 2
    assert len(shares) == min(w, pairs) if pairs <= 2 * w else len(shares) == w
    if pairs >= 8 * w:  # many pairs a share: near-equal areas
        area = [sum(chunks[i] * chunks[j] for i, j in s) for s in shares]
        assert max(area) <= 1.25 * np.mean(area)


def test_a_share_reads_a_fraction_of_the_rows():
    """Tiles keep a share's row blocks few: 88 row blocks on 32 workers, each share reads
    at most half of them (a run of the upper triangle's rows reads nearly all)."""
    shares = assign_pairs([1000] * 88, 32)
    assert max(len({b for p in s for b in p}) for s in shares) <= 88 // 2


def test_pass_tasks_grow_with_workers_not_blocks():
    assert reduction_tasks(1) == 0 and reduction_tasks(2) == 1
    assert reduction_tasks(16) == 4 + 1 and reduction_tasks(32) == 8 + 2 + 1
    for w in (2, 16, 32, 128):
        counts = {pass_tasks(w, nb) for nb in (40, 88, 500)}
        assert counts == {w + reduction_tasks(w)}
        assert w + reduction_tasks(w) <= 4 * w + reduction_tasks(w, REDUCE_FAN_IN)


def test_share_products_sum_to_k_z_in_threads():
    """Every share's partial, summed, is K Z, with a share split over 3 threads or not."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(700, 4))
    kern = make_kernel("rbf", gamma=0.4)
    chunks = [100] * 7
    Z = rng.normal(size=(700, 5))
    panel_of = {b: (0, 100 * b, 100 * b + 100) for b in range(7)}
    rows = {b: X[100 * b : 100 * b + 100] for b in range(7)}
    K = kern(X, X, dtype=np.float64)
    for threads in (1, 3):
        parts = [
            share_product(kern, rows, None, s, panel_of, "float64", [Z], threads=threads)
            for s in assign_pairs(chunks, 4)
        ]
        total = sum_shares(*parts)
        Y = np.concatenate([total[b] for b in range(7)])
        np.testing.assert_allclose(Y, K @ Z, rtol=1e-12, atol=1e-10)


def test_an_unknown_driver_is_refused():
    from kpca_dask.exceptions import InvalidInputError

    K = BlockKernelMatrix(da.ones((10, 2), chunks=(5, 2)), make_kernel("linear"), np.float64)
    with dask.config.set({DRIVER_CONFIG: "tiles"}):
        with pytest.raises(InvalidInputError, match="exact-driver"):
            K.product(np.ones((10, 1)))


# ------------------------------------------------------------------ on a cluster
@pytest.fixture(scope="module")
def five_workers():
    """A LocalCluster of 5 one-thread worker processes: two levels of the sum tree."""
    from distributed import Client

    with (
        local_cluster(5) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(5, timeout=60)
        yield client


def _matrix(n, rows, d=3, seed=0, dtype=np.float64):
    X = np.random.default_rng(seed).normal(size=(n, d))
    return X, BlockKernelMatrix(
        da.from_array(X, chunks=(rows, d)), make_kernel("rbf", gamma=0.3), dtype
    )


def _transitions(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


def _settle(client, timeout=20.0) -> None:
    """Wait until the scheduler is idle: the releases of earlier keys (the client sends
    them when its futures are dropped, asynchronously) have landed and its transition
    counter no longer moves."""
    deadline = time.monotonic() + timeout
    last = _transitions(client)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _transitions(client)
        if now == last:
            return
        last = now


def _counted(client, fn):
    """(tasks run, scheduler transitions) of ``fn``, from an idle scheduler to an idle
    scheduler: the window holds all of the pass's transitions (its keys released too)
    and none of an earlier call's (the first pass's X blocks, ``nb`` of them, are
    released asynchronously after it: counted in whichever window they landed in, they
    made the transitions grow with n by timing alone)."""
    from distributed import get_task_stream

    _settle(client)
    before = _transitions(client)
    with get_task_stream(client) as ts:
        fn()
    _settle(client)
    return len(ts.data), _transitions(client) - before


def _resident_keys(client) -> list[str]:
    held = client.run(
        lambda dask_worker: [
            str(k) for k in dask_worker.data if str(k).startswith(("kpca-wrows", "kpca-wcache"))
        ]
    )
    return [k for keys in held.values() for k in keys]


def _released(client, timeout=10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        held = _resident_keys(client)
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


@pytest.mark.cluster
def test_a_pass_is_a_task_per_worker_and_a_tree_flat_in_n(five_workers):
    """5 workers: a later pass runs 5 share tasks and 2 + 1 sums, at 10 and at 40 row
    blocks (the waves driver: 55 and 820 block tasks), and its scheduler transitions do not
    grow with n either; the products equal the waves driver's (the threaded scheduler runs
    the same sums in the same order) to rounding."""
    client = five_workers
    w = 5
    counts = {}
    for n in (1000, 4000):
        X, K = _matrix(n, 100)
        Z = np.random.default_rng(1).normal(size=(n, 4))
        with dask.config.set(scheduler="threads"):
            ref = K.product(Z)
        got = []

        def product(K=K, Z=Z, got=got):
            got.append(K.product(Z))

        with dask.config.set(WORKERS):
            first, _ = _counted(client, product)
            tasks, trans = _counted(client, product)
        K.release_cache()
        np.testing.assert_allclose(got[-1], ref, rtol=1e-12, atol=1e-10)
        assert tasks == pass_tasks(w, K.n_blocks) == w + 3
        assert tasks <= 4 * w + reduction_tasks(w)
        assert first <= K.n_blocks + 2 * w + tasks  # X persisted once, rows placed once
        counts[n] = (tasks, trans)
    assert counts[1000][0] == counts[4000][0]
    assert counts[4000][1] <= 1.2 * counts[1000][1]
    assert _released(client) == []


@pytest.mark.cluster
def test_kept_blocks_stay_on_the_workers_and_are_released(five_workers):
    """The memory tier: each worker's kept blocks are one resident key, spread over the
    workers, the later passes evaluate nothing (the rows are dropped) and equal the first;
    release frees them. The partial tier keeps the rows for the blocks it evaluates."""
    client = five_workers
    X, K = _matrix(1500, 150, dtype=np.float32)
    Z = np.random.default_rng(2).normal(size=(1500, 3))
    ref = K.product(Z)
    with dask.config.set(WORKERS), K.kernel_cache("memory"):
        Y1 = K.product(Z)
        Y2 = K.product(Z)
        held = _resident_keys(client)
        per_worker = client.run(
            lambda dask_worker: sum("kpca-wcache" in str(k) for k in dask_worker.data)
        )
    assert sorted(held) == sorted(k for k in held if "kpca-wcache" in k) and len(held) == 5
    assert all(v >= 1 for v in per_worker.values())  # spread over every worker
    np.testing.assert_array_equal(Y1, Y2)
    np.testing.assert_allclose(Y1, ref, atol=1e-5 * np.abs(ref).max())
    assert _released(client) == []

    with dask.config.set(WORKERS), dask.config.set({"kpca.kernel-cache-budget": 400_000}):
        with K.kernel_cache("auto") as info:
            Y3 = K.product(Z)
            held = _resident_keys(client)
    assert info["tier"] == "partial"
    assert any("kpca-wrows" in k for k in held) and any("kpca-wcache" in k for k in held)
    np.testing.assert_allclose(Y3, ref, atol=1e-5 * np.abs(ref).max())
    assert _released(client) == []


@pytest.mark.cluster
@pytest.mark.slow  # 85 s at load 17 on 2 cores (5 workers)
@pytest.mark.parametrize("kernel_cache", ["memory", "recompute"])
def test_a_fit_equals_scipy_and_the_waves_driver(five_workers, kernel_cache):
    """A randomized fit with the per-worker driver: the waves driver's eigenvalues to
    rounding and scipy.linalg.eigh's on the centred kernel to the certificate's level."""
    from distributed import get_task_stream

    X, _ = make_blobs(1200, n_features=5, centers=6, random_state=3)
    kw = dict(
        kernel="rbf",
        gamma=0.05,
        eigen_solver="randomized",
        random_state=0,
        chunk_size=150,
        kernel_cache=kernel_cache,
    )
    with dask.config.set(scheduler="threads"):  # the waves driver's sums, in this process
        waves = KernelPCA(5, **kw).fit(X)
    with dask.config.set({"kpca.execution": "cluster", **WORKERS}):
        with get_task_stream(five_workers) as ts:
            mine = KernelPCA(5, **kw).fit(X)
    assert any("kpca-kz-part-w" in str(t["key"]) for t in ts.data)
    assert not any(str(t["key"]).startswith("('kpca-kz-part-") for t in ts.data)
    np.testing.assert_allclose(mine.eigenvalues_, waves.eigenvalues_, rtol=1e-10)
    K = make_kernel("rbf", gamma=0.05)(X, X, dtype=np.float64)
    H = np.eye(len(X)) - 1.0 / len(X)
    ref = scipy.linalg.eigh(H @ K @ H, eigvals_only=True)[::-1][:5]
    np.testing.assert_allclose(mine.eigenvalues_, ref, rtol=1e-8)
    assert _released(five_workers) == []


# ------------------------------------------------------------------ the basis on the workers
def _fit(X, n_components=5, **kw):
    kw = {
        "kernel": "rbf",
        "gamma": 0.05,
        "eigen_solver": "randomized",
        "random_state": 0,
        "chunk_size": 150,
        **kw,
    }
    with dask.config.set(scheduler="threads"):  # the caller's basis, in this process
        ref = KernelPCA(n_components, **kw).fit(X)
    with dask.config.set({"kpca.execution": "cluster", **WORKERS}):
        mine = KernelPCA(n_components, **kw).fit(X)
    return ref, mine


def _dense(X, kernel, **kp):
    K = make_kernel(kernel, **kp)(X, X, dtype=np.float64)
    H = np.eye(len(X)) - 1.0 / len(X)
    w, V = scipy.linalg.eigh(H @ K @ H)
    return w[::-1], V[:, ::-1]


@pytest.mark.cluster
def test_the_basis_on_the_workers_equals_the_callers_scipy_and_sklearn(five_workers):
    """The per-worker driver's fit keeps the basis on the workers: its eigenvalues and
    vectors (to sign) are the caller-side basis's to rounding, scipy's eigh of the centred
    kernel's and scikit-learn's KernelPCA's to the certificate's level."""
    from sklearn.decomposition import KernelPCA as SkKernelPCA

    X, _ = make_blobs(900, n_features=5, centers=6, random_state=3)
    ref, mine = _fit(X)
    assert mine.solver_info_["basis"] == "workers" and "basis" not in ref.solver_info_
    assert mine.solver_info_["certificate"]["ok"]
    np.testing.assert_allclose(mine.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(mine.eigenvectors_, ref.eigenvectors_, atol=1e-8)
    w, V = _dense(X, "rbf", gamma=0.05)
    np.testing.assert_allclose(mine.eigenvalues_, w[:5], rtol=1e-8)
    dots = np.abs(np.sum(mine.eigenvectors_ * V[:, :5], axis=0))
    np.testing.assert_allclose(dots, 1.0, atol=1e-6)
    sk = SkKernelPCA(5, kernel="rbf", gamma=0.05, eigen_solver="dense").fit(X)
    np.testing.assert_allclose(mine.eigenvalues_, sk.eigenvalues_, rtol=1e-8)
    emb, sk_emb = mine.transform(X[:50]), sk.transform(X[:50])
    np.testing.assert_allclose(np.abs(emb), np.abs(sk_emb), atol=1e-6 * np.abs(sk_emb).max())
    assert _released(five_workers) == []
    from kpca_dask import worker_basis

    left = five_workers.run(lambda: len(worker_basis._STORE))
    assert set(left.values()) == {0}  # the panels are dropped after the solve


@pytest.mark.cluster
def test_a_worker_lost_with_its_basis_panel_stops_the_fit_naming_it(monkeypatch):
    """A worker SIGKILLed between two of the basis's round trips takes its panel with it:
    the fit raises one BasisLostError naming the worker and its rows (an OSError: the
    pipeline's environment failure, re-run to resume), never a basis with a hole in it."""
    import os
    import signal

    from distributed import Client

    from kpca_dask.exceptions import BasisLostError
    from kpca_dask.worker_basis import PanelBasis

    X, _ = make_blobs(3000, n_features=5, centers=6, random_state=3)
    run, calls, victim = PanelBasis.run, [], {}

    def killing(self, program):
        calls.append(program)
        if len(calls) == 4:  # past the first block: the panels hold the basis
            victim["addr"] = self.workers[0]
            os.kill(pids[victim["addr"]], signal.SIGKILL)
        return run(self, program)

    monkeypatch.setattr(PanelBasis, "run", killing)
    with (
        # the in-process scheduler's broadcast gives up on the dead worker after 5 s, not 30
        dask.config.set({"distributed.comm.timeouts.connect": "5s"}),
        local_cluster(3, silence_logs=logging.CRITICAL) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        with pytest.raises(BasisLostError) as err:
            with dask.config.set({"kpca.execution": "cluster", **WORKERS}):
                KernelPCA(5, kernel="rbf", gamma=0.05, chunk_size=500, random_state=0).fit(X)
    msg = str(err.value)
    assert isinstance(err.value, OSError)
    assert f"{victim['addr']} (rows 0-" in msg and "Krylov basis" in msg
    assert "kpca.worker-basis: false" in msg and "\n" not in msg
    assert len(calls) == 4  # nothing ran on the broken basis after the loss


@pytest.mark.cluster
@pytest.mark.parametrize("kernel, kp", [("linear", {}), ("rbf", {"gamma": 0.02})])
def test_a_rank_deficient_kernel_gives_its_pairs_not_a_wrong_answer(
    five_workers, kernel, kp, monkeypatch
):
    """Three tight clusters: the linear kernel has rank 2 (centred, d = 2), the rbf kernel
    numerical rank about 3 x a few. The Krylov blocks lose columns to deflation (their Gram
    matrices are singular: plain CholQR breaks down on them); the worker basis takes the
    TSQR path there and returns the existing pairs with the dense eigh's values, the rest
    zero, as the caller-side basis does."""
    from kpca_dask.worker_basis import PanelBasis

    ops: list[str] = []
    run = PanelBasis.run

    def recording(self, program):
        ops.extend(op[0] for op in program)
        return run(self, program)

    monkeypatch.setattr(PanelBasis, "run", recording)
    X, _ = make_blobs(600, n_features=2, centers=3, cluster_std=0.01, random_state=1)
    ref, mine = _fit(X, n_components=6, kernel=kernel, gamma=kp.get("gamma"))
    assert mine.solver_info_["basis"] == "workers"
    assert "qr_r" in ops  # a block was deflated by TSQR on the panels, not by CholQR
    w, V = _dense(X, kernel, **kp)
    lam = mine.eigenvalues_
    np.testing.assert_allclose(lam, ref.eigenvalues_, rtol=1e-8, atol=1e-9 * w[0])
    big = w[:6] > 1e-6 * w[0]
    np.testing.assert_allclose(lam[big], w[:6][big], rtol=1e-7)
    assert np.all(np.abs(lam[~big]) <= 1e-6 * w[0])
    dots = np.abs(np.sum(mine.eigenvectors_[:, big] * V[:, :6][:, big], axis=0))
    lonely = np.r_[True, np.diff(w[:6][big]) < -1e-3 * w[0]]  # isolated: vectors defined
    np.testing.assert_allclose(dots[lonely], 1.0, atol=1e-5)


@pytest.mark.cluster
def test_panel_cholqr_breaks_down_and_the_fallbacks_do_not(five_workers):
    """On row panels of an ill-conditioned block (condition number 1e12: CholQR2's Gram
    matrix is singular to rounding), plain CholQR2 fails or is not orthonormal; orth's
    shifted CholQR3 / TSQR fallback returns an orthonormal basis holding A to rounding. A
    rank-deficient block (two equal columns) gives an orthonormal basis holding it (the
    TSQR fallback drops the copy; shifted CholQR3 may keep an orthonormal direction of
    rounding: a larger orthonormal basis, which Rayleigh-Ritz takes as it is)."""
    from kpca_dask.worker_basis import PanelBasis

    n = 1500
    X, K = _matrix(n, 150)
    rng = np.random.default_rng(4)
    U, _ = np.linalg.qr(rng.normal(size=(n, 6)))
    A = U @ np.diag(np.logspace(0, -12, 6)) @ np.linalg.qr(rng.normal(size=(6, 6)))[0]
    B = np.hstack([A[:, :3], A[:, :1]])
    with dask.config.set(WORKERS):
        pb = PanelBasis(K)
        starts = np.concatenate([[0], np.cumsum(pb.rows)])
        try:
            for name, M in (("A", A), ("B", B)):
                pb.put_rows(name, lambda p, r, M=M: M[starts[p] : starts[p] + r])
                pb.cols[name] = M.shape[1]
            pb.put_rows("A0", lambda p, r: A[starts[p] : starts[p] + r])
            pb.cols["A0"] = 6
            with pytest.raises(np.linalg.LinAlgError):
                pb.orth("A0", shift_ok=False)
            assert pb.orth("A") == 6
            Q = pb.gather("A")
            np.testing.assert_allclose(Q.T @ Q, np.eye(6), atol=1e-10)
            np.testing.assert_allclose(
                Q @ (Q.T @ A), A, atol=1e-14
            )  # A in its span (to eps ||A||)
            c = pb.orth("B")
            assert c in (3, 4)  # TSQR drops the copy; shifted CholQR3 keeps a direction
            Q = pb.gather("B")
            np.testing.assert_allclose(Q.T @ Q, np.eye(c), atol=1e-10)
            np.testing.assert_allclose(Q @ (Q.T @ B), B, atol=1e-10)
        finally:
            pb.close()
            K.release_cache()


# moved out of the default run (its 20-minute budget; 2026-11-28, second cut): ~13 s; the per-
# worker pass's count test stays
@pytest.mark.slow
@pytest.mark.cluster
def test_a_solver_pass_with_the_worker_basis_is_flat_in_n(five_workers):
    """A whole block Krylov pass with the basis on the workers: at most 4 tasks a worker
    plus the reductions, the same count at 10 and 40 row blocks, and the caller receives
    O(L^2) numbers (the round trips' outputs), not O(n L)."""
    from kpca_dask.centering import CentredKernel  # noqa: F401  (the caller-side op)
    from kpca_dask.worker_basis import panel_krylov_eigh

    client = five_workers
    w = 5
    counts = {}
    for n in (1000, 4000):
        X, K = _matrix(n, 100)
        got = {}

        def solve(passes, K=K, got=got):
            res, *_ = panel_krylov_eigh(
                K, 3, n_oversamples=3, n_power_iter=passes - 1, random_state=0, warn=False
            )
            got[passes] = res

        with dask.config.set(WORKERS):
            solve(2)  # X persisted and the rows placed (kept until release_cache)
            t2, _ = _counted(client, lambda: solve(2))
            t3, _ = _counted(client, lambda: solve(3))
        K.release_cache()
        per_pass = t3 - t2  # one more Krylov pass (the rows' placement cancels)
        assert per_pass <= 4 * w + reduction_tasks(w)
        # the count the cost model prices (kpca plan --driver workers)
        assert per_pass == basis_pass_tasks(K.row_chunks, w)
        trips = got[3].info["basis_round_trips"] - got[2].info["basis_round_trips"]
        assert trips == BASIS_ROUND_TRIPS  # and the round trips it prices
        counts[n] = per_pass
    assert counts[1000] == counts[4000]
