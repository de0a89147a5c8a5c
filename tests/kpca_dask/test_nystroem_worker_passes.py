"""The per-worker pass driver of the Nyström solver (kpca_dask/solvers/nystroem/
worker_passes.py, issue 38): a pass is one task per worker and a tree of sums on the
workers, whatever ``n``; passes and fits equal the default driver's and a dense reference
to rounding; the resident rows are released at the end of the fit."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.decomposition import PCA

from kpca_dask import KernelPCA
from kpca_dask.kernels import make_kernel
from kpca_dask.solvers.nystroem import FeatureCovariance, nystroem_basis
from kpca_dask.solvers.nystroem.passes import _block_stats, _sum_stats
from kpca_dask.solvers.nystroem.worker_passes import (
    DRIVER_CONFIG,
    pass_tasks,
    share_stats,
    split_blocks,
)
from kpca_dask.worker_passes import REDUCE_FAN_IN, reduction_tasks
from tests.clusters import local_cluster

from ..conftest import align_signs

WORKERS = {DRIVER_CONFIG: "workers"}
W = 5  # two levels of the tree (5 partials: 2 + 1 sums)


# ------------------------------------------------------------------ no cluster
@pytest.mark.parametrize(
    "chunks, w",
    [
        ([100] * 10, 5),
        ([100] * 40, 5),
        ([100] * 39 + [37], 16),
        ([100] * 3, 8),  # fewer blocks than workers: a block a share
        ([100], 4),
        ([500, 10, 10, 10, 10, 500], 3),  # unequal blocks: balanced by rows
        ([7, 300, 12, 5, 280, 9, 300, 4], 3),
    ],
)
def test_shares_are_contiguous_cover_every_block_once_and_are_balanced(chunks, w):
    shares = split_blocks(chunks, w)
    nb = len(chunks)
    assert len(shares) == min(w, nb)
    assert all(e > a for a, e in shares)  # non-empty
    assert shares[0][0] == 0 and shares[-1][1] == nb
    assert all(shares[s][1] == shares[s + 1][0] for s in range(len(shares) - 1))  # contiguous
    assert sorted(b for a, e in shares for b in range(a, e)) == list(range(nb))
    rows = [sum(chunks[a:e]) for a, e in shares]
    # each cut at the block boundary nearest its equal-rows point: a share is within
    # one block on either side of n / W (two blocks' rows in all)
    assert max(rows) - min(rows) <= 2 * max(chunks)
    if len(set(chunks[:-1])) == 1:  # equal blocks (the last may be short)
        counts = [e - a for a, e in shares]
        assert max(counts) - min(counts) <= 1


def test_pass_tasks_grow_with_workers_not_blocks():
    for w in (2, 5, 16, 32, 128):
        counts = {pass_tasks(w, nb) for nb in (200, 880, 4000)}
        assert counts == {w + reduction_tasks(w, REDUCE_FAN_IN)}
    assert pass_tasks(5, 40) == 5 + 2 + 1
    assert pass_tasks(16, 3) == 3 + 1  # a share a block


@pytest.mark.parametrize("covariance", [False, True])
def test_share_statistics_in_threads_equal_the_blocks_summed(covariance):
    """A share's statistics, its blocks split over 1 or 3 threads, equal the default
    driver's per-block statistics summed (to rounding: another order of additions)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(700, 4))
    kern = make_kernel("rbf", gamma=0.4)
    basis = nystroem_basis(X[::20], kern, np.float64)
    Zp = basis.prepared()
    M = None if covariance else rng.normal(size=(basis.m, 6))
    method = "covariance" if covariance else "randomized"
    blocks = [X[100 * b : 100 * b + 100] for b in range(7)]
    consts = (Zp, M, basis.shift)
    ref = _sum_stats(_block_stats(xb, consts, method, True, kern, "float64") for xb in blocks)
    for threads in (1, 3):
        got = share_stats(blocks, Zp, basis.shift, M, True, kern, "float64", threads=threads)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-12)
        assert got[2] == pytest.approx(ref[2], rel=1e-12) and got[3] == ref[3] == 700


def test_an_unknown_driver_is_refused():
    from kpca_dask.exceptions import InvalidInputError

    X = da.from_array(np.random.default_rng(0).normal(size=(40, 2)), chunks=(10, 2))
    kern = make_kernel("rbf", gamma=0.5)
    op = FeatureCovariance(X, nystroem_basis(X[:8].compute(), kern, np.float64))
    with dask.config.set({DRIVER_CONFIG: "tiles"}):
        with pytest.raises(InvalidInputError, match="nystroem-driver"):
            op.covariance()


# ------------------------------------------------------------------ on a cluster
@pytest.fixture(scope="module")
def five_workers():
    """A LocalCluster of 5 one-thread worker processes, closed after the module."""
    from distributed import Client

    cluster = local_cluster(W)
    try:
        with Client(cluster) as client:
            client.wait_for_workers(W, timeout=60)
            yield client
    finally:
        cluster.close()


def _transitions(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


def _settle(client, timeout=20.0) -> None:
    """Wait until the scheduler's transition counter stops moving (earlier releases in)."""
    deadline = time.monotonic() + timeout
    last = _transitions(client)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _transitions(client)
        if now == last:
            return
        last = now


def _tasks(client, fn) -> list[str]:
    """The keys of the tasks ``fn`` ran (task stream), from an idle scheduler."""
    from distributed import get_task_stream

    _settle(client)
    with get_task_stream(client) as ts:
        fn()
    return [str(t["key"]) for t in ts.data]


def _held(client, prefix: str) -> tuple[dict, list]:
    """Keys starting with ``prefix``: per worker in its memory, and on the scheduler."""
    on_workers = client.run(
        lambda dask_worker, prefix=prefix: [
            str(k) for k in dask_worker.data if str(k).startswith(prefix)
        ]
    )
    on_scheduler = client.run_on_scheduler(
        lambda dask_scheduler, prefix=prefix: [
            str(k) for k in dask_scheduler.tasks if str(k).startswith(prefix)
        ]
    )
    return on_workers, on_scheduler


def _scheduler_keys(client) -> set[str]:
    return set(
        client.run_on_scheduler(lambda dask_scheduler: list(map(str, dask_scheduler.tasks)))
    )


def _new_keys(client, before: set[str], timeout=10.0) -> set[str]:
    """Keys on the scheduler that were not there before (the scattered landmarks and
    ``M`` included), after waiting up to ``timeout`` for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        left = _scheduler_keys(client) - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _released(client, prefix="kpca-nys-w", timeout=10.0) -> tuple[dict, list]:
    deadline = time.monotonic() + timeout
    while True:
        on_workers, on_scheduler = _held(client, prefix)
        left = any(on_workers.values()) or on_scheduler
        if not left or time.monotonic() > deadline:
            return {w: k for w, k in on_workers.items() if k}, on_scheduler
        time.sleep(0.1)


def _operator(n, rows=100, d=4, seed=0):
    X = np.random.default_rng(seed).normal(size=(n, d))
    kern = make_kernel("rbf", gamma=0.3)
    basis = nystroem_basis(X[:: n // 60], kern, np.float64)
    return FeatureCovariance(da.from_array(X, chunks=(rows, d)), basis)


def _passes_at(client, n):
    """(tasks of the first pass, of a later one, of a covariance pass, rows held per
    worker after two passes, the three results, the default driver's three)."""
    rng = np.random.default_rng(1)
    with dask.config.set(scheduler="threads"):
        ref_op = _operator(n)
        Y = rng.normal(size=(ref_op.n, 6))
        ref = [ref_op.matmul(Y), ref_op.matmul(2 * Y), ref_op.covariance()]
    op = _operator(n)
    got = []
    with dask.config.set(WORKERS):
        first = _tasks(client, lambda: got.append(op.matmul(Y)))
        later = _tasks(client, lambda: got.append(op.matmul(2 * Y)))
        rows_held, _ = _held(client, "kpca-nys-wrows")
        cov = _tasks(client, lambda: got.append(op.covariance()))
    op.release()
    return first, later, cov, rows_held, got, ref


@pytest.mark.cluster
def test_a_later_pass_is_a_task_per_worker_and_a_tree_flat_in_n(five_workers):
    """5 workers: a later pass runs 5 share tasks and 2 + 1 sums, at 10 and at 40 row
    blocks (the default driver: 10 + 2 and 40 + 6 tasks), at most 4 W + R(W); the rows
    are resident one key per worker between passes; the products and the covariance
    form equal the default driver's (threaded scheduler) to rounding, and a pass repeats
    its sums bit for bit; after release nothing of the driver is left on the workers or
    the scheduler."""
    client = five_workers
    expected = W + reduction_tasks(W)
    assert expected == 8
    for n in (1000, 4000):
        nb = n // 100
        _settle(client)
        before = _scheduler_keys(client)
        first, later, cov, rows_held, got, ref = _passes_at(client, n)
        assert sorted(len(k) for k in rows_held.values()) == [1] * W  # a share a worker
        assert len(later) == pass_tasks(W, nb) == expected <= 4 * W + reduction_tasks(W)
        assert len(cov) == expected
        assert sum(k.startswith("kpca-nys-wpart") for k in later) == W
        assert sum(k.startswith("kpca-nys-wsum") for k in later) == reduction_tasks(W)
        assert len(first) <= nb + W + expected  # X persisted and the rows placed, once
        for a, b in zip(got, ref):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max())
        # the same shares and tree every pass: 2 Y gives exactly twice Y's product
        np.testing.assert_array_equal(got[1], 2 * got[0])
        assert _released(client) == ({}, [])
        assert _new_keys(client, before) == set()  # the scattered keys too


def _explicit_nystroem(X, Z, kern, k):
    """Independent reference: explicit features k(X, Z) W^-1/2 and scikit-learn's PCA."""
    s, U = np.linalg.eigh(kern(Z, Z))
    keep = s > 1e-12 * s.max()
    W_isqrt = (U[:, keep] / np.sqrt(s[keep])) @ U[:, keep].T
    feats = lambda A: kern(A, Z) @ W_isqrt  # noqa: E731
    return PCA(k, svd_solver="full").fit(feats(X)), feats


@pytest.mark.cluster
@pytest.mark.parametrize("method", ["randomized", "covariance"])
def test_a_fit_equals_the_default_driver_and_a_dense_reference(five_workers, method):
    """A fit on the cluster with the per-worker driver: every pass is W + R(W) tasks of
    the driver (none of the default driver's block tasks), the eigenvalues equal the
    default driver's fit on the same cluster to 1e-10 and scikit-learn's PCA of the
    explicit Nyström features to 1e-8, the embeddings up to sign; nothing of the driver
    is left after the fit."""
    client = five_workers
    X, _ = make_blobs(3000, n_features=5, centers=8, cluster_std=1.5, random_state=2)
    kw = dict(
        kernel="rbf",
        gamma=0.05,
        eigen_solver="nystroem",
        n_landmarks=100,
        nystroem_method=method,
        random_state=0,
        chunk_size=300,
        tol=1e-12,
    )
    Xd = da.from_array(X, chunks=(300, -1))
    new = X[:40] * 1.1 + 0.3
    with dask.config.set({"kpca.execution": "cluster"}):
        ref = KernelPCA(5, **kw).fit(Xd)
        _settle(client)
        before = _scheduler_keys(client)
        models: list = []
        with dask.config.set(WORKERS):
            keys = _tasks(client, lambda: models.append(KernelPCA(5, **kw).fit(Xd)))
        m = models[0]
    assert m.n_passes_ >= 1 and not any("kpca-nys-block" in k for k in keys)
    parts = sum(k.startswith("kpca-nys-wpart") for k in keys)
    sums = sum(k.startswith("kpca-nys-wsum") for k in keys)
    assert parts == W * m.n_passes_ and sums == reduction_tasks(W) * m.n_passes_
    np.testing.assert_array_equal(m.landmark_indices_, ref.landmark_indices_)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    emb, emb_ref = m.transform(new), ref.transform(new)
    np.testing.assert_allclose(align_signs(emb, emb_ref), emb_ref, atol=1e-8)
    pca, feats = _explicit_nystroem(
        X, X[m.landmark_indices_], make_kernel("rbf", gamma=0.05), 5
    )
    np.testing.assert_allclose(
        m.eigenvalues_, pca.explained_variance_ * (len(X) - 1), rtol=1e-8
    )
    emb_pca = pca.transform(feats(new))
    np.testing.assert_allclose(align_signs(emb, emb_pca), emb_pca, atol=1e-6)
    assert _released(client) == ({}, [])
    assert _new_keys(client, before) == set()  # the scattered landmarks and M too
