"""The kernel cache tier: upper kernel blocks evaluated once and kept in memory across
the passes of a solve (kernel_cache="memory"), or evaluated at every pass
("recompute"), chosen by a memory budget ("auto"); released after the fit."""

import time

import dask
import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.decomposition import KernelPCA as SKKernelPCA

from kpca_dask import KernelPCA
from kpca_dask.exceptions import InvalidParameterError
from kpca_dask.gram import BlockKernelMatrix, kernel_cache_budget
from kpca_dask.kernels import RBFKernel

X, _ = make_blobs(900, n_features=8, centers=6, random_state=5)
GAMMA = 1 / 8
K_FIT = {
    "kernel": "rbf",
    "gamma": GAMMA,
    "eigen_solver": "randomized",
    "random_state": 0,
    "chunk_size": 200,
}


@pytest.fixture(scope="module")
def sk_ref():
    """scikit-learn's dense KernelPCA: the reference eigenvalues."""
    return SKKernelPCA(6, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(X).eigenvalues_


def _close_to_sklearn(fit, ref, rtol):
    """The 5 gapped eigenvalues to ``rtol``; the 6th, cut by n_components from a flat
    run of nearly equal ones, is certified by its eigenvalue only, to the solver's tail
    tolerance (1 %, docs/solvers.md): it must be within the bound its certificate
    states (measured: 2e-8 to 3e-6 relative, against bounds of 1e-4 to 2e-3). ARPACK
    gets every eigenvalue to ``rtol``."""
    w = fit.eigenvalues_
    np.testing.assert_allclose(w[:5], ref[:5], rtol=rtol)
    if fit.eigen_solver_ == "arpack":  # Lanczos to its tolerance on every eigenvalue
        np.testing.assert_allclose(w, ref, rtol=rtol)
        return
    cert = fit.solver_info_["certificate"]
    assert cert["certified"][5] == "eigenvalue only"
    assert abs(w[5] - ref[5]) / ref[5] <= max(cert["eigenvalue_bounds"][5], rtol)
    assert cert["eigenvalue_bounds"][5] <= cert["eigenvalue_levels"][5] <= 0.01


def _kblock_keys_on(client) -> tuple[list, list]:
    """Cached-block keys the scheduler knows and those the workers hold."""
    sched = client.run_on_scheduler(
        lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks if "kpca-kblock" in str(k)]
    )
    held = client.run(
        lambda dask_worker: [str(k) for k in dask_worker.data if "kpca-kblock" in str(k)]
    )
    return sched, [k for keys in held.values() for k in keys]


def _wait_released(client, timeout=10.0) -> tuple[list, list]:
    deadline = time.monotonic() + timeout
    while True:
        sched, held = _kblock_keys_on(client)
        if (not sched and not held) or time.monotonic() > deadline:
            return sched, held
        time.sleep(0.1)


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-9), ("float32", 1e-4)])
def test_threaded_cache_on_off_same_as_sklearn(sk_ref, dtype, rtol):
    """Threaded scheduler: the cached and recomputed fits agree to rounding, and both
    with scikit-learn's dense solve."""
    with dask.config.set(scheduler="threads"):
        on = KernelPCA(6, kernel_cache="memory", dtype=dtype, **K_FIT).fit(X)
        off = KernelPCA(6, kernel_cache="recompute", dtype=dtype, **K_FIT).fit(X)
    assert on.solver_info_["kernel_cache"]["tier"] == "memory"
    assert off.solver_info_["kernel_cache"]["tier"] == "recompute"
    assert on.n_passes_ >= 3  # several passes read the cache
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(on.eigenvalues_, off.eigenvalues_, rtol=tol)
    for fit in (on, off):
        _close_to_sklearn(fit, sk_ref, rtol)
    emb_on, emb_off = on.transform(X[:50]), off.transform(X[:50])
    np.testing.assert_allclose(
        np.abs(emb_on), np.abs(emb_off), atol=1e-8 if dtype == "float64" else 1e-3
    )


def test_cached_product_equals_recomputed_and_blocks_in_compute_dtype():
    """Gram level: products from the cache equal evaluated ones, every block is kept
    once in the compute dtype (float32 halves the cache), and release drops them."""
    Xd = dask.array.from_array(X, chunks=(200, -1))
    Z = np.random.default_rng(0).standard_normal((X.shape[0], 5))
    for dtype in (np.float64, np.float32):
        ref = BlockKernelMatrix(Xd, RBFKernel(GAMMA), dtype).product(Z)
        K = BlockKernelMatrix(Xd, RBFKernel(GAMMA), dtype)
        with dask.config.set(scheduler="threads"), K.kernel_cache("memory") as info:
            assert info["tier"] == "memory" and K._cache is None  # filled by the first product
            Y1 = K.product(Z)
            blocks = dask.compute(*K._cache.values())
            Y2 = K.product(Z)
            dense = K.to_numpy()  # the dense escalation reads the cache too
        assert K._cache is None  # released on exit
        assert len(blocks) == 5 * 6 // 2  # 5 row blocks: the upper triangle, once
        assert {b.dtype for b in blocks} == {np.dtype(dtype)}
        assert sum(b.nbytes for b in blocks) == info["bytes"] == K.upper_block_bytes()
        tol = 1e-12 if dtype == np.float64 else 1e-5
        scale = np.abs(ref).max()
        np.testing.assert_allclose(Y1, ref, atol=tol * scale)
        np.testing.assert_array_equal(Y1, Y2)
        fresh = BlockKernelMatrix(Xd, RBFKernel(GAMMA), dtype).to_numpy()
        if dtype == np.float32:
            # cached float32 blocks have their subnormals flushed to zero (SGEMM on
            # subnormals crawls; kpca_dask.gram._flush_subnormal): equal otherwise
            tiny = np.finfo(np.float32).tiny
            assert not np.any((dense != 0) & (np.abs(dense) < tiny))
            fresh = np.where(np.abs(fresh) < tiny, 0, fresh).astype(fresh.dtype)
        np.testing.assert_array_equal(dense, fresh)


def test_arpack_reads_the_cache(sk_ref):
    """ARPACK makes one pass per Lanczos vector: the cached blocks serve them all."""
    kw = {**K_FIT, "eigen_solver": "arpack"}
    with dask.config.set(scheduler="threads"):
        on = KernelPCA(6, kernel_cache="memory", **kw).fit(X)
        off = KernelPCA(6, kernel_cache="recompute", **kw).fit(X)
    assert on.solver_info_["kernel_cache"]["tier"] == "memory"
    np.testing.assert_allclose(on.eigenvalues_, off.eigenvalues_, rtol=1e-10)
    _close_to_sklearn(on, sk_ref, 1e-9)


def test_auto_chooses_recompute_when_the_budget_is_too_small():
    # below the smallest upper block (the last row block's 100 x 100 float64 square,
    # 80 kB): between one block and all of them is the partial tier (test_partial_cache.py)
    small = KernelPCA(6, **K_FIT)
    with dask.config.set({"scheduler": "threads", "kpca.kernel-cache-budget": "50kB"}):
        small.fit(X)
    info = small.solver_info_["kernel_cache"]
    assert info["requested"] == "auto" and info["tier"] == "recompute"
    assert info["budget"] == 50_000 < info["bytes"]
    assert "above the budget" in info["reason"]
    with dask.config.set({"scheduler": "threads", "kpca.kernel-cache-budget": "1GiB"}):
        big = KernelPCA(6, **K_FIT).fit(X)
    assert big.solver_info_["kernel_cache"]["tier"] == "memory"
    np.testing.assert_allclose(big.eigenvalues_, small.eigenvalues_, rtol=1e-12)


def test_auto_budget_on_the_threaded_scheduler_is_half_the_available_memory():
    import psutil

    with dask.config.set(scheduler="threads"):
        budget, where = kernel_cache_budget()
    avail = psutil.virtual_memory().available
    assert 0.3 * avail < budget < 0.7 * avail
    assert "available memory" in where


def test_dense_and_stored_kernels_are_not_cached():
    """The dense solver reads each block once; with a kernel store (the pipeline's disk
    tier) "auto" keeps reading the store; "memory" reads each stored block once."""
    with dask.config.set(scheduler="threads"):
        dense = KernelPCA(6, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(X)
    assert dense.solver_info_["kernel_cache"]["tier"] == "recompute"
    Xd = dask.array.from_array(X, chunks=(300, -1))
    full = RBFKernel(GAMMA)(X, X)
    reads = []

    def reader(i, j):
        reads.append((i, j))
        return full[300 * i : 300 * (i + 1), 300 * j : 300 * (j + 1)]

    Z = np.ones((X.shape[0], 2))
    with dask.config.set(scheduler="threads"):
        K = BlockKernelMatrix(Xd, RBFKernel(GAMMA), block_reader=reader)
        with K.kernel_cache("auto") as info:
            K.product(Z)
            K.product(Z)
        assert info["tier"] == "store" and len(reads) == 2 * 6
        reads.clear()
        with K.kernel_cache("memory") as info:
            Y = K.product(Z)
            K.product(Z)
        assert info["tier"] == "memory" and sorted(reads) == K.upper_blocks()
    np.testing.assert_allclose(Y, full @ Z, rtol=1e-12)


def test_kernel_cache_parameter_is_validated():
    with pytest.raises(InvalidParameterError, match="kernel_cache"):
        KernelPCA(2, kernel_cache="disk").fit(X[:50])


@pytest.mark.distributed
def test_cluster_cache_on_off_same_as_sklearn_and_released(dask_client, sk_ref):
    """A real LocalCluster: "auto" keeps the blocks on the workers (budget from their
    memory limits), the results equal the recomputed fit and scikit-learn's, and no
    cached block is left on the scheduler or the workers after the fit."""
    budget, where = kernel_cache_budget()
    limits = [w["memory_limit"] for w in dask_client.scheduler_info()["workers"].values()]
    assert 0 < budget <= 0.5 * sum(limits) and "workers" in where
    on = KernelPCA(6, **K_FIT).fit(X)
    assert on.solver_info_["kernel_cache"]["tier"] == "memory"
    assert on.solver_info_["kernel_cache"]["budget"] > on.solver_info_["kernel_cache"]["bytes"]
    sched, held = _wait_released(dask_client)
    assert sched == [] and held == [], "cached kernel blocks leaked on the cluster"
    off = KernelPCA(6, kernel_cache="recompute", **K_FIT).fit(X)
    assert off.solver_info_["kernel_cache"]["tier"] == "recompute"
    np.testing.assert_allclose(on.eigenvalues_, off.eigenvalues_, rtol=1e-12)
    _close_to_sklearn(on, sk_ref, 1e-9)


@pytest.mark.distributed
def test_cluster_blocks_live_on_the_workers_until_released(dask_client):
    """During the solve the blocks are held by the workers (float32 when the compute
    dtype is), spread over both; products run where they are; release frees them."""
    Xd = dask.array.from_array(X, chunks=(150, -1)).persist()
    K = BlockKernelMatrix(Xd, RBFKernel(GAMMA), np.float32)
    Z = np.random.default_rng(1).standard_normal((X.shape[0], 4))
    ref = BlockKernelMatrix(Xd, RBFKernel(GAMMA), np.float32).product(Z)
    with K.kernel_cache("memory"):
        Y1 = K.product(Z)
        Y2 = K.product(Z)
        dtypes = dask_client.run(
            lambda dask_worker: sorted(
                {str(v.dtype) for k, v in dask_worker.data.items() if "kpca-kblock" in str(k)}
            )
        )
        sched, held = _kblock_keys_on(dask_client)
    assert len(set(held)) == 6 * 7 // 2
    assert all(d == ["float32"] for d in dtypes.values()), dtypes  # both workers hold some
    np.testing.assert_allclose(Y1, ref, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_array_equal(Y1, Y2)
    del Xd
    sched, held = _wait_released(dask_client)
    assert sched == [] and held == []
