"""The randomized solver against the dense one, on spectra with a gap."""

import dask.array as da
import numpy as np
import pytest
import scipy.linalg
from sklearn.datasets import make_blobs

from kpca_dask import ConvergenceWarning, KernelPCA
from kpca_dask.centering import CentredKernel
from kpca_dask.gram import BlockKernelMatrix
from kpca_dask.kernels import RBFKernel
from kpca_dask.solvers import randomized_eigh

# Ten clusters in 8-D: the leading rbf eigenvalues are well separated.
X, _ = make_blobs(1500, n_features=8, centers=10, cluster_std=1.5, random_state=0)
GAMMA = 0.01
K = 6


@pytest.fixture(scope="module")
def dense():
    return KernelPCA(K, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(X)


def test_the_spectrum_has_a_gap(dense):
    """Precondition of the tests below: relative gaps between the top eigenvalues."""
    full = KernelPCA(K + 1, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(X).eigenvalues_
    gaps = np.abs(np.diff(full)) / full[0]
    assert gaps.min() > 1e-3


def max_angle(A, B):
    return float(np.max(scipy.linalg.subspace_angles(A, B)))


@pytest.mark.parametrize("method", ["block_krylov", "subspace"])
def test_float64_matches_dense(dense, method):
    """Top-k eigenvalues within 1e-6 relative, subspace angle below 1e-4."""
    m = KernelPCA(
        K,
        kernel="rbf",
        gamma=GAMMA,
        eigen_solver="randomized",
        random_state=0,
        randomized_method=method,
        max_iter=40,
    ).fit(X)
    np.testing.assert_allclose(m.eigenvalues_, dense.eigenvalues_, rtol=1e-6)
    assert max_angle(m.eigenvectors_, dense.eigenvectors_) < 1e-4
    np.testing.assert_allclose(m.row_means_, dense.row_means_, rtol=1e-12)
    assert m.grand_mean_ == pytest.approx(dense.grand_mean_, rel=1e-12)
    assert m.converged_


def test_float32_kernel_evaluation_matches_dense(dense):
    """float32 kernel values and products: eigenvalues within 1e-5 relative."""
    m = KernelPCA(
        K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0, dtype="float32"
    ).fit(X)
    np.testing.assert_allclose(m.eigenvalues_, dense.eigenvalues_, rtol=1e-5)
    assert max_angle(m.eigenvectors_, dense.eigenvectors_) < 1e-3


def test_signs_and_embeddings_agree_with_dense(dense):
    """The deterministic sign convention makes solvers agree without alignment."""
    m = KernelPCA(K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0).fit(
        X
    )
    new = X[:50] + 0.3
    np.testing.assert_allclose(m.transform(new), dense.transform(new), atol=1e-6)


def test_residuals_are_real_certificates(dense):
    """residuals_ equals ||Kc v - lambda v|| / lambda computed from the dense matrix."""
    m = KernelPCA(
        K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0, n_power_iter=1
    )
    with pytest.warns(ConvergenceWarning, match="did not certify"):
        m.fit(X)  # two passes only: the certificate says so
    assert not m.converged_
    Kc = RBFKernel(GAMMA)(X, X)
    mu = Kc.mean(axis=1)
    Kc = Kc - mu[:, None] - mu[None, :] + mu.mean()
    V, lam = m.eigenvectors_, m.eigenvalues_
    expected = np.linalg.norm(Kc @ V - V * lam, axis=0) / lam
    np.testing.assert_allclose(m.residuals_, expected, rtol=1e-6, atol=1e-12)
    assert m.residuals_.max() > 1e-8  # only two passes: not converged to rounding


@pytest.mark.filterwarnings("ignore::kpca_dask.exceptions.ConvergenceWarning")
def test_fixed_passes_and_determinism():
    """An integer n_power_iter makes exactly n_power_iter + 1 passes (+1 certification),
    and a seed makes the result reproducible bit for bit."""
    kw = dict(
        kernel="rbf", gamma=GAMMA, eigen_solver="randomized", n_power_iter=3, random_state=42
    )
    a = KernelPCA(K, **kw).fit(X)
    b = KernelPCA(K, **kw).fit(X)
    assert a.n_passes_ == 5
    np.testing.assert_array_equal(a.eigenvalues_, b.eigenvalues_)
    np.testing.assert_array_equal(a.eigenvectors_, b.eigenvectors_)


@pytest.mark.filterwarnings("ignore::kpca_dask.exceptions.ConvergenceWarning")
def test_result_does_not_depend_on_chunking():
    """The test matrix comes from the seed, not the chunks: other chunkings agree
    to rounding (summation order), signs included."""
    kw = dict(
        kernel="rbf", gamma=GAMMA, eigen_solver="randomized", n_power_iter=4, random_state=7
    )
    a = KernelPCA(K, chunk_size=1500, **kw).fit(X)
    b = KernelPCA(K, chunk_size=211, **kw).fit(da.from_array(X, chunks=(400, -1)))
    np.testing.assert_allclose(b.eigenvalues_, a.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(b.eigenvectors_, a.eigenvectors_, atol=1e-8)


def test_convergence_warning_when_capped(dense):
    """Hitting max_iter before tol warns (never returns partial results silently)."""
    m = KernelPCA(
        K,
        kernel="rbf",
        gamma=GAMMA,
        eigen_solver="randomized",
        random_state=0,
        max_iter=2,
        tol=1e-15,
    )
    with pytest.warns(ConvergenceWarning, match="did not certify"):
        m.fit(X)
    assert not m.converged_
    assert m.residuals_.shape == (K,)


def test_solver_certificate_matches_dense_errors():
    """On the operator directly: the certified bounds hold against the dense
    reference (eigenvalue error <= bound, subspace angle <= angle bound)."""
    Xd = da.from_array(X, chunks=(500, -1))
    dense_m = KernelPCA(K + 8, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(X)
    ref, Vref = dense_m.eigenvalues_[:K], dense_m.eigenvectors_[:, :K]
    op = CentredKernel(BlockKernelMatrix(Xd, RBFKernel(GAMMA)))
    res = randomized_eigh(op, K, n_oversamples=8, tol=1e-8, random_state=0)
    assert res.converged and res.info["finish"] == "rayleigh_ritz"
    cert = res.info["certificate"]
    err = np.abs(res.eigenvalues - ref) / ref
    assert np.all(err <= np.array(cert["eigenvalue_bounds"]) + 1e-13)
    for j in range(K):  # all clusters are single pairs here (gapped spectrum)
        ang = scipy.linalg.subspace_angles(res.eigenvectors[:, [j]], Vref[:, [j]])[0]
        assert np.sin(ang) <= cert["angle_bounds"][j] + 1e-12


def test_sigmoid_randomized_matches_dense():
    """Indefinite kernel: Rayleigh-Ritz finish, top positive eigenvalues as dense."""
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((600, 5))
    kw = dict(kernel="sigmoid", gamma=0.05, coef0=0.0)
    d = KernelPCA(4, eigen_solver="dense", **kw).fit(Z)
    r = KernelPCA(4, eigen_solver="randomized", random_state=0, max_iter=40, **kw).fit(Z)
    assert r.solver_info_["finish"] == "rayleigh_ritz"
    np.testing.assert_allclose(r.eigenvalues_, d.eigenvalues_, rtol=1e-6)
