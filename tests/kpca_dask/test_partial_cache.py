"""The partial kernel-cache tier (issue 29): when the upper kernel blocks do not all fit
the budget, ``kernel_cache="auto"`` keeps the ones that fit and evaluates the others at
every pass. Products and fits against the full cache, the recomputed kernel and a dense
``scipy.linalg.eigh`` reference, on the threaded scheduler and a real LocalCluster; the
tier chosen for each budget; and the cost model's price of the tier."""

from __future__ import annotations

import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.linalg as sl
from dask.utils import parse_bytes
from sklearn.datasets import make_blobs
from sklearn.metrics.pairwise import rbf_kernel

from kpca_dask import KernelPCA
from kpca_dask.cache_tiers import block_evaluations, blocks_to_cache
from kpca_dask.cost import Cluster, Machine
from kpca_dask.gram import BlockKernelMatrix
from kpca_dask.kernels import RBFKernel
from kpca_dask.kernels_custom import CallableKernel

BUDGET = "kpca.kernel-cache-budget"
X, _ = make_blobs(900, n_features=8, centers=6, random_state=5)
GAMMA = 1 / 8
ROWS = 200  # 4 blocks of 200 rows and one of 100: 15 upper blocks


def _chunks(n=X.shape[0], r=ROWS):
    return [min(r, n - a) for a in range(0, n, r)]


def _bytes(pairs, chunks, item):
    return sum(chunks[i] * chunks[j] * item for i, j in pairs)


# ------------------------------------------------------------------ which blocks
def test_blocks_to_cache_fit_the_budget_off_diagonal_first():
    """Blocks by evaluations saved per byte kept: off-diagonal blocks (1) before diagonal
    blocks taller than a strip (a product evaluates only their upper triangle, strip by
    strip: about 0.6), in the order of the upper triangle, skipping those that no longer
    fit; none below the smallest block, all when they fit."""
    # float32 blocks of 2000 rows (strips of 524 rows) and a last block of 1000 rows
    # (one strip: its diagonal block is evaluated whole, as an off-diagonal one)
    c, mb = [2000] * 4 + [1000], 16_000_000
    assert block_evaluations(2000, 1000, False, 4) == 2000 * 1000
    assert 0.55 * 2000**2 < block_evaluations(2000, 2000, True, 4) < 0.7 * 2000**2
    assert block_evaluations(1000, 1000, True, 4) == 1000**2
    off = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)]
    # 100 MB: five 16 MB and two 8 MB off-diagonal blocks; (2, 3) no longer fits, nor the
    # 8 MB (2, 4) and (3, 4); the 4 MB square (4, 4) does
    assert blocks_to_cache(c, 4, 100_000_000) == sorted([*off[:7], (4, 4)])
    # 170 MB: every off-diagonal block and (4, 4) (132 MB), then two 2000-row squares
    assert blocks_to_cache(c, 4, 170_000_000) == sorted([*off, (4, 4), (0, 0), (1, 1)])
    assert blocks_to_cache(c, 4, 4 * mb + 16 * 10**6 * 6 + 8 * 10**6 * 4 + 4 * 10**6) == sorted(
        [(i, j) for i in range(5) for j in range(i, 5)]
    )
    assert blocks_to_cache(c, 4, 1000 * 1000 * 4 - 1) == []
    # any budget: within it, never fewer bytes for more budget
    chunks = _chunks()
    upper = [(i, j) for i in range(5) for j in range(i, 5)]
    total, prev = _bytes(upper, chunks, 8), 0
    for budget in np.linspace(0.05, 1.0, 12) * total:
        kept = blocks_to_cache(chunks, 8, budget)
        got = _bytes(kept, chunks, 8)
        assert prev <= got <= budget and kept == sorted(kept)
        prev = got
    assert kept == upper


@pytest.mark.parametrize(
    "budget, tier, kept",
    [("50kB", "recompute", 0), ("1MB", "partial", None), ("10MB", "memory", 15)],
)
def test_tier_by_budget(budget, tier, kept):
    """Below one block: recompute; between one block and all of them: partial; above
    all: memory. The decision is recorded (blocks and bytes kept, the reason); one-pass
    solvers (dense) never cache."""
    Xd = da.from_array(X, chunks=(ROWS, -1))
    K = BlockKernelMatrix(Xd, RBFKernel(GAMMA), np.float64)
    with dask.config.set({"scheduler": "threads", BUDGET: budget}):
        info = K.plan_cache("auto", "randomized")
        K.release_cache()
        dense = K.plan_cache("auto", "dense")
        K.release_cache()
    assert info["tier"] == tier and info["blocks"] == 15
    assert info["budget"] == parse_bytes(budget)
    assert info["bytes"] == K.upper_block_bytes() == 3_920_000
    assert "above the budget" in info["reason"] or tier == "memory"
    if tier == "partial":
        assert 0 < info["blocks_cached"] < 15
        assert 0 < info["cached_bytes"] <= info["budget"]
        assert f"{info['blocks_cached']} of 15 blocks kept" in info["reason"]
        assert info["cached_bytes"] == _bytes(blocks_to_cache(_chunks(), 8, 1e6), _chunks(), 8)
    else:
        assert info["blocks_cached"] == kept
        assert info["cached_bytes"] == (info["bytes"] if kept else 0)
    assert dense["tier"] == "recompute" and dense["blocks_cached"] == 0


def test_default_budget_keeps_all_blocks_or_none():
    """Without a budget of the user's, "auto" keeps every block or none: blocks above
    the default budget (half the memory available) are recomputed, not partly kept (at
    n = 100 000 on two workers the partial tier took 13.2 GiB instead of 1.6 GiB for no
    faster solve, docs/tuning.md); the same blocks under a budget set in dask's config
    are partly kept. Only the decision is made: the lazy rows are never computed."""
    Xl = da.zeros((1_000_000, 8), chunks=(4096, -1))  # upper blocks: ~2 TB in float32
    K = BlockKernelMatrix(Xl, RBFKernel(GAMMA), np.float32)
    with dask.config.set({"scheduler": "threads", BUDGET: None}):  # the default budget
        info = K.plan_cache("auto", "randomized")
        K.release_cache()
    with dask.config.set({"scheduler": "threads", BUDGET: "100MB"}):
        mine = K.plan_cache("auto", "randomized")
        K.release_cache()
    assert info["tier"] == "recompute" and info["blocks_cached"] == 0
    assert info["budget"] < info["bytes"] and f"set {BUDGET}" in info["reason"]
    assert mine["tier"] == "partial" and 0 < mine["blocks_cached"] < mine["blocks"]
    assert 0 < mine["cached_bytes"] <= parse_bytes("100MB")


# ------------------------------------------------------------------ products
def _counting_rbf():
    """A real rbf kernel as a user callable that counts the kernel values it evaluates
    (the threaded scheduler runs the tasks in this process)."""
    counts: list[int] = []
    lock = threading.Lock()

    def rbf(A, B):
        if A.shape[0] * B.shape[0] > 1:  # not the callable's 1 x 1 convention probe
            with lock:
                counts.append(A.shape[0] * B.shape[0])
        return rbf_kernel(A, B, gamma=GAMMA)

    return CallableKernel(rbf), counts


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_partial_products_equal_full_cache_and_recompute(dtype):
    """Products with a partial cache equal the full-cache and recomputed ones to
    rounding, read the kept blocks and evaluate exactly the others at every pass
    (counted), and the dense escalation reads the kept blocks too."""
    Xd = da.from_array(X, chunks=(ROWS, -1))
    Z = np.random.default_rng(0).standard_normal((X.shape[0], 5))
    kern, counts = _counting_rbf()
    c, item = _chunks(), np.dtype(dtype).itemsize
    with dask.config.set(scheduler="threads"):
        rec = BlockKernelMatrix(Xd, kern, dtype).product(Z)
        full = BlockKernelMatrix(Xd, kern, dtype)
        with full.kernel_cache("memory"):
            full.product(Z)
            Yfull = full.product(Z)
        K = BlockKernelMatrix(Xd, kern, dtype)
        with dask.config.set({BUDGET: 1_000_000}), K.kernel_cache("auto") as info:
            assert info["tier"] == "partial"
            kept = blocks_to_cache(c, item, 1_000_000)
            rest = [p for p in K.upper_blocks() if p not in kept]
            counts.clear()
            Y1 = K.product(Z)
            first = sum(counts)
            assert sorted(K._cache) == kept
            blocks = dask.compute(*K._cache.values())
            counts.clear()
            Y2 = K.product(Z)
            later = sum(counts)
            dense = K.to_numpy()
        assert K._cache is None  # released on exit
    evaluated = sum(block_evaluations(c[i], c[j], i == j, item) for i, j in rest)
    assert later == evaluated  # the kept blocks are read, the others evaluated
    assert first == evaluated + _bytes(kept, c, 1)  # plus the kept blocks, once, whole
    assert {b.dtype for b in blocks} == {np.dtype(dtype)}
    assert sum(b.nbytes for b in blocks) == info["cached_bytes"] <= 1_000_000
    tol = 1e-12 if dtype == np.float64 else 1e-5
    scale = np.abs(rec).max()
    np.testing.assert_allclose(Y1, rec, atol=tol * scale)
    np.testing.assert_allclose(Y1, Yfull, atol=tol * scale)
    np.testing.assert_array_equal(Y1, Y2)
    exact = rbf_kernel(X, gamma=GAMMA)
    np.testing.assert_allclose(dense, exact, atol=1e-6 if dtype == np.float32 else 1e-14)


def test_mixed_precision_partial_products():
    """The mixed-precision blocks (float32, the kept ones evaluated in float64 then
    rounded): partial products agree with the full float32 cache and the float64 kernel
    to float32 rounding."""
    Xd = da.from_array(X, chunks=(ROWS, -1))
    Z = np.random.default_rng(1).standard_normal((X.shape[0], 4))
    ref = rbf_kernel(X, gamma=GAMMA) @ Z
    with dask.config.set(scheduler="threads"):
        full = BlockKernelMatrix(Xd, RBFKernel(GAMMA), np.float32, cache_eval_dtype=np.float64)
        with full.kernel_cache("memory"):
            Yfull = full.product(Z)
        K = BlockKernelMatrix(Xd, RBFKernel(GAMMA), np.float32, cache_eval_dtype=np.float64)
        with dask.config.set({BUDGET: 600_000}), K.kernel_cache("auto") as info:
            Y = K.product(Z)
            Y2 = K.product(Z)
    assert info["tier"] == "partial" and 0 < info["blocks_cached"] < 15
    scale = np.abs(ref).max()
    np.testing.assert_allclose(Y, Yfull, atol=1e-5 * scale)
    np.testing.assert_allclose(Y, ref, atol=1e-5 * scale)
    np.testing.assert_array_equal(Y, Y2)


# ------------------------------------------------------------------ fits
XF = make_blobs(2000, n_features=16, centers=6, random_state=0)[0]
GF = 1 / 16
KF = 12
FIT = dict(kernel="rbf", gamma=GF, eigen_solver="randomized", random_state=0, chunk_size=250)


@pytest.fixture(scope="module")
def dense_ref():
    """The centred kernel's top eigenpairs from a dense float64 ``scipy.linalg.eigh``."""
    Kx = rbf_kernel(XF, gamma=GF)
    Kc = Kx - Kx.mean(axis=0) - Kx.mean(axis=1)[:, None] + Kx.mean()
    n = XF.shape[0]
    w, V = sl.eigh(Kc, subset_by_index=[n - KF - 1, n - 1])
    return w[::-1], V[:, ::-1]


def _assert_matches_dense(m, ref):
    """Every eigenvalue within its certified bound of the dense one, the gapped ones to
    1e-6; the subspaces the certificate names within its angle bound."""
    w, V = ref
    cert = m.solver_info_["certificate"]
    assert m.converged_ and cert["ok"]
    err = np.abs(m.eigenvalues_ - w[:KF])
    bounds = np.asarray(cert["eigenvalue_bounds"])
    assert np.all(err <= bounds * np.abs(m.eigenvalues_) + 1e-12 * w[0]), (err / w[:KF], bounds)
    gapped = [i for i, what in enumerate(cert["certified"]) if what != "eigenvalue only"]
    assert len(gapped) >= 5  # the data have gapped eigenvalues to check
    assert np.all(err[gapped] <= 1e-6 * w[gapped])
    angles = np.asarray(cert["angle_bounds"])
    for i in gapped:
        # the eigenvector (or its cluster's subspace) against the dense one
        members = [j for j in gapped if cert["clusters"][j] == cert["clusters"][i]]
        theta = sl.subspace_angles(m.eigenvectors_[:, members], V[:, members]).max()
        assert theta <= angles[i] + 1e-10, (i, theta, angles[i])
        assert theta < 1e-3


@pytest.mark.parametrize("block_dtype", ["float64", "float32"])
def test_partial_fit_equals_dense_eigh(dense_ref, block_dtype):
    """A fit on a partial cache (float64 blocks, and mixed precision: float32 blocks
    under the float64 model) matches the dense reference as its certificate says, and
    the full-cache fit."""
    upper = BlockKernelMatrix(
        da.from_array(XF, chunks=(250, -1)), RBFKernel(GF), block_dtype
    ).upper_block_bytes()
    with dask.config.set({"scheduler": "threads", BUDGET: upper // 2}):
        m = KernelPCA(KF, block_dtype=block_dtype, **FIT).fit(XF)
    with dask.config.set(scheduler="threads"):
        full = KernelPCA(KF, block_dtype=block_dtype, kernel_cache="memory", **FIT).fit(XF)
    info = m.solver_info_["kernel_cache"]
    if block_dtype == "float32" and m.block_dtype_ == "float64":
        # fell back to float64 blocks: the decision recorded is the float64 solve's,
        # the float32 one's is kept beside the reason
        info = m.solver_info_["mixed_precision"]["kernel_cache"]
    assert info["tier"] == "partial", info
    assert 0 < info["blocks_cached"] < info["blocks"] == 36
    assert m.block_dtype_ == full.block_dtype_
    assert m.n_passes_ >= 3
    _assert_matches_dense(m, dense_ref)
    rel = np.abs(m.eigenvalues_ - full.eigenvalues_) / full.eigenvalues_
    levels = np.asarray(m.solver_info_["certificate"]["eigenvalue_levels"])
    assert np.all(rel <= 2 * levels)


# ------------------------------------------------------------------ cluster
def _kblock_keys(client) -> list[str]:
    held = client.run(
        lambda dask_worker: [str(k) for k in dask_worker.data if "kpca-kblock" in str(k)]
    )
    return [k for keys in held.values() for k in keys]


def _released(client, timeout=30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        held = _kblock_keys(client)
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


@pytest.mark.distributed
def test_cluster_partial_products_and_fit(dask_client):
    """A real LocalCluster: the kept blocks are futures on the workers (as many as the
    decision says), the others are evaluated from X's rows (not persisted by the caller:
    the pass persists them), products equal the recomputed ones, a fit equals the
    recomputed fit, and nothing is left on the workers afterwards."""
    Xd = da.from_array(X, chunks=(150, -1))  # 6 row blocks, 21 upper blocks
    Z = np.random.default_rng(2).standard_normal((X.shape[0], 4))
    ref = BlockKernelMatrix(Xd, RBFKernel(GAMMA), np.float32).product(Z)
    K = BlockKernelMatrix(Xd, RBFKernel(GAMMA), np.float32)
    with dask.config.set({BUDGET: 400_000}), K.kernel_cache("auto") as info:
        Y1 = K.product(Z)
        Y2 = K.product(Z)
        held = _kblock_keys(dask_client)
    assert info["tier"] == "partial" and 0 < info["blocks_cached"] < 21
    assert len(set(held)) == info["blocks_cached"]
    np.testing.assert_allclose(Y1, ref, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_array_equal(Y1, Y2)
    assert _released(dask_client) == []

    kw = dict(kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0)
    with dask.config.set({BUDGET: "1MB"}):
        part = KernelPCA(6, chunk_size=ROWS, **kw).fit(X)
    off = KernelPCA(6, chunk_size=ROWS, kernel_cache="recompute", **kw).fit(X)
    assert part.solver_info_["kernel_cache"]["tier"] == "partial"
    assert str(part.solver_info_["executed"]).startswith("cluster")
    np.testing.assert_allclose(part.eigenvalues_, off.eigenvalues_, rtol=1e-12)
    assert _released(dask_client) == []


# ------------------------------------------------------------------ cost model
def _lazy(n, d):
    return da.zeros((n, d), chunks=(min(n, 100_000), d))


def test_cost_model_prices_the_partial_tier():
    """Between the tiers: the kept share is priced as the memory tier prices all the
    blocks (read at every later pass), the rest as recomputed; the kept bytes add to the
    workers' memory; the fill of the kept blocks to the first pass."""
    plan = KernelPCA(16, kernel="rbf", eigen_solver="randomized").plan(
        _lazy(50_000, 32), kernel=False
    )
    m = Machine()
    upper = plan.estimate(
        Cluster(workers=2, threads=1, memory=1e12), m, passes=6
    ).kernel_cache_bytes
    # half of each worker's memory over 2 workers: 40 % of the blocks fit, but a default
    # budget keeps none of them (the partial tier is the user's choice)...
    cl = Cluster(workers=2, threads=1, memory=0.4 * upper)
    assert plan.estimate(cl, m, passes=6).kernel_cache == "recompute"
    # ...and a budget set in dask's config keeps the 40 % that fit
    with dask.config.set({BUDGET: int(0.4 * upper)}):
        part = plan.estimate(cl, m, passes=6)
        kept = plan.estimate(cl, m, passes=6, kernel_cache="memory")
        again = plan.estimate(cl, m, passes=6, kernel_cache="recompute")
    assert part.kernel_cache == "partial"
    assert 0.3 * upper < part.kernel_cache_bytes <= 0.4 * upper
    share = part.kernel_cache_share
    assert 0.3 < share < 0.45  # off-diagonal blocks first: a share of evaluations >= bytes
    later = {e.kernel_cache: e.stages[2].parts["compute"] for e in (part, kept, again)}
    assert later["partial"] == pytest.approx(
        share * later["memory"] + (1 - share) * later["recompute"], rel=1e-9
    )
    assert later["memory"] < later["partial"] < later["recompute"]
    first = part.stages[1].parts["compute"]
    assert first > later["partial"] / 5  # the kept blocks' fill on top (5 later passes)
    assert part.memory_per_worker - again.memory_per_worker == pytest.approx(
        part.kernel_cache_bytes / 2
    )
    assert "partial" in part.summary()
    with dask.config.set({BUDGET: "1MB"}):  # below one block
        assert plan.estimate(cl, m, passes=6).kernel_cache == "recompute"


def test_cost_model_prices_the_tier_the_fit_takes():
    """The dask config budget decides the fit's tier and the estimate's alike: the same
    blocks kept (bytes), on any cluster description."""
    kw = dict(kernel="rbf", gamma=GAMMA, eigen_solver="randomized", chunk_size=ROWS)
    with dask.config.set({"scheduler": "threads", BUDGET: "1MB"}):
        est = KernelPCA(6, **kw).fit(X)
        e = (
            KernelPCA(6, **kw)
            .plan(X)
            .estimate(
                Cluster(workers=1, threads=2, distributed=False), passes=int(est.n_passes_)
            )
        )
    info = est.solver_info_["kernel_cache"]
    assert info["tier"] == e.kernel_cache == "partial"
    assert info["cached_bytes"] == e.kernel_cache_bytes
