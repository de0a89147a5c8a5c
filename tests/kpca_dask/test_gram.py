"""The block-partitioned kernel matrix: products against the dense matrix."""

import dask
import dask.array as da
import numpy as np
import pytest
from sklearn.metrics.pairwise import rbf_kernel

from kpca_dask.exceptions import InvalidInputError
from kpca_dask.gram import BlockKernelMatrix, cross_products, kernel_block
from kpca_dask.kernels import PolynomialKernel, RBFKernel

RNG = np.random.default_rng(1)
X = RNG.standard_normal((257, 6))
Z = RNG.standard_normal((257, 5))
K_REF = rbf_kernel(X, gamma=0.2)


@pytest.mark.parametrize("chunks", [257, 100, (50, 7, 100, 100), 64, 1000])
def test_matmul_matches_dense(chunks):
    """K @ Z from upper blocks only equals the dense product, for any row chunking."""
    Xd = da.from_array(X, chunks=(chunks, -1))
    K = BlockKernelMatrix(Xd, RBFKernel(0.2), np.float64)
    np.testing.assert_allclose(K.matmul(Z).compute(), K_REF @ Z, rtol=1e-12, atol=1e-12)


def test_matmul_float32_error_is_float32_rounding():
    Xd = da.from_array(X, chunks=(64, -1))
    Y = BlockKernelMatrix(Xd, RBFKernel(0.2), np.float32).matmul(Z).compute()
    assert Y.dtype == np.float64  # accumulation across blocks stays float64
    np.testing.assert_allclose(Y, K_REF @ Z, rtol=0, atol=1e-5 * np.abs(K_REF @ Z).max())


def test_only_upper_blocks_are_evaluated():
    """One task per block I <= J: nb (nb + 1) / 2 kernel tasks per product."""
    Xd = da.from_array(X, chunks=(50, -1))  # 6 row blocks
    K = BlockKernelMatrix(Xd, RBFKernel(0.2))
    graph = dict(K.matmul(Z).__dask_graph__())
    parts = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("kpca-kz-part")]
    assert len(parts) == 6 * 7 // 2
    assert K.upper_blocks() == [(i, j) for i in range(6) for j in range(i, 6)]
    # entries evaluated: about half the matrix (upper triangle + strip squares)
    n = 257
    evals = K.kernel_evaluations_per_pass()
    assert n * (n + 1) // 2 <= evals <= n * (n + 1) // 2 + n * 50
    assert evals < 0.7 * n * n


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 2e-6)])
def test_stored_blocks_give_the_same_product(dtype, tol):
    """A block reader (materialised kernel store) replaces evaluation transparently:
    diagonal blocks hold their full square, off-diagonal ones serve both K_IJ Z_J and
    K_IJ^T Z_I, in the stored dtype."""
    Xd = da.from_array(X, chunks=(64, -1))
    K = BlockKernelMatrix(Xd, RBFKernel(0.2))
    offs = np.concatenate([[0], np.cumsum(K.row_chunks)])
    store = {
        (i, j): K_REF[offs[i] : offs[i + 1], offs[j] : offs[j + 1]].astype(dtype)
        for i, j in K.upper_blocks()
    }
    stored = BlockKernelMatrix(
        Xd, RBFKernel(0.2), dtype=dtype, block_reader=lambda i, j: store[(i, j)]
    )
    Y = stored.matmul(Z).compute()
    assert Y.dtype == np.float64
    scale = np.abs(K_REF) @ np.abs(Z)
    assert np.max(np.abs(Y - K_REF @ Z) / scale) < tol
    # product() alternates the order of its waves from one call to the next
    for _ in range(2):
        np.testing.assert_allclose(stored.product(Z, wave_tasks=4), Y, rtol=1e-12, atol=1e-12)
    assert stored._products == 2


def test_matmul_accepts_dask_z_with_other_chunks():
    Xd = da.from_array(X, chunks=(64, -1))
    Zd = da.from_array(Z, chunks=(100, 2))
    Y = BlockKernelMatrix(Xd, RBFKernel(0.2)).matmul(Zd).compute()
    np.testing.assert_allclose(Y, K_REF @ Z, rtol=1e-12, atol=1e-12)


def test_matmul_names_are_deterministic():
    Xd = da.from_array(X, chunks=(64, -1))
    K = BlockKernelMatrix(Xd, RBFKernel(0.2))
    assert K.matmul(Z).name == K.matmul(Z.copy()).name
    assert K.matmul(Z).name != K.matmul(Z + 1).name


def test_to_numpy_and_diag():
    Xd = da.from_array(X, chunks=(100, -1))
    K = BlockKernelMatrix(Xd, PolynomialKernel(0.1, 2, 1.0))
    from sklearn.metrics.pairwise import polynomial_kernel

    ref = polynomial_kernel(X, degree=2, gamma=0.1, coef0=1.0)
    np.testing.assert_allclose(K.to_numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(K.diag().compute(), np.diag(ref), rtol=1e-12)


def test_cross_products_matches_dense():
    new = RNG.standard_normal((33, 6))
    M = RNG.standard_normal((257, 4))
    out = cross_products(RBFKernel(0.2), new, X, M, np.float64, train_rows=50)
    np.testing.assert_allclose(out, rbf_kernel(new, X, gamma=0.2) @ M, rtol=1e-12, atol=1e-12)


def test_kernel_block_dtype():
    assert kernel_block(RBFKernel(0.2), X[:3], X[:4], np.float32).dtype == np.float32


def test_chunking_preconditions_fail_loudly():
    with pytest.raises(InvalidInputError, match="single chunk along the features"):
        BlockKernelMatrix(da.from_array(X, chunks=(64, 3)), RBFKernel(0.2))
    Xu = da.from_array(X, chunks=(64, -1))
    Xu = Xu[Xu[:, 0] > 0]  # unknown chunk sizes
    with pytest.raises(InvalidInputError, match="compute_chunk_sizes"):
        BlockKernelMatrix(Xu, RBFKernel(0.2))


def test_runs_on_the_synchronous_scheduler_too():
    Xd = da.from_array(X, chunks=(64, -1))
    with dask.config.set(scheduler="synchronous"):
        Y = BlockKernelMatrix(Xd, RBFKernel(0.2)).matmul(Z).compute()
    np.testing.assert_allclose(Y, K_REF @ Z, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("solver", ["dense", "randomized"])
def test_estimator_fits_from_stored_blocks_and_given_centring(solver):
    """fit(kernel_blocks=..., centring=...) reproduces the ordinary fit and never
    evaluates the kernel on the training blocks."""
    from kpca_dask import KernelPCA

    r = 64
    Xd = da.from_array(X, chunks=(r, -1))
    K = BlockKernelMatrix(Xd, RBFKernel(0.2))
    offs = np.concatenate([[0], np.cumsum(K.row_chunks)])
    store = {
        (i, j): K_REF[offs[i] : offs[i + 1], offs[j] : offs[j + 1]].copy()
        for i, j in K.upper_blocks()
    }
    reads = []

    def reader(i, j):
        reads.append((i, j))
        return store[(i, j)]

    kw = dict(kernel="rbf", gamma=0.2, eigen_solver=solver, random_state=0, chunk_size=r)
    ref = KernelPCA(3, **kw).fit(X)
    mu = K_REF.mean(axis=1)
    m = KernelPCA(3, **kw).fit(X, kernel_blocks=reader, centring=(mu, mu.mean()))
    assert set(reads) == set(K.upper_blocks())
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(m.transform(X[:5]), ref.transform(X[:5]), atol=1e-10)
