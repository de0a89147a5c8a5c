"""Pre-images: exact for the linear kernel, learned (vs scikit-learn), fixed point (vs a
plain-numpy Mika et al. iteration), fallbacks, dask laziness, validation."""

import warnings

import dask.array as da
import numpy as np
import pytest
import zarr
from scipy.spatial.distance import cdist
from sklearn.datasets import make_blobs, make_moons
from sklearn.decomposition import PCA
from sklearn.decomposition import KernelPCA as SkKernelPCA
from sklearn.metrics.pairwise import pairwise_kernels

from kpca_dask import (
    InvalidInputError,
    InvalidParameterError,
    KernelPCA,
    NotFittedError,
    PreimageConvergenceWarning,
)
from kpca_dask.preimage import STATUS_CONVERGED, STATUS_DIVERGED, STATUS_MAX_ITER

RNG = np.random.default_rng(0)
X = make_blobs(160, n_features=5, centers=4, cluster_std=1.5, random_state=0)[0]
NEW = X[:25] + 0.3 * RNG.standard_normal((25, 5))
MOONS = make_moons(200, noise=0.05, random_state=0)[0]


def _close(a, b, rtol):
    """Max abs difference relative to the reference's scale."""
    err = float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    assert err <= rtol * max(1.0, float(np.max(np.abs(b)))), err


# ------------------------------------------------------------------- linear: exact
@pytest.mark.parametrize("solver", ["dense", "randomized", "nystroem"])
def test_linear_kernel_reconstruction_is_linear_pca(solver):
    """Linear kernel: inverse_transform(transform(x)) is PCA's mean + z V^T, exactly."""
    kw = dict(n_landmarks=40, random_state=0) if solver == "nystroem" else {}
    if solver == "randomized":  # keep the block (k + oversamples) within rank(Kc) = 5
        kw = dict(n_oversamples=2)
    m = KernelPCA(
        3,
        kernel="linear",
        eigen_solver=solver,
        fit_inverse_transform=True,
        n_power_iter=6,
        **kw,
    ).fit(X)
    assert m.preimage_ == "exact"
    ref = PCA(3).fit(X)
    _close(
        m.inverse_transform(m.transform(NEW)), ref.inverse_transform(ref.transform(NEW)), 1e-9
    )
    _close(m.preimage_mean_, X.mean(axis=0), 1e-12)
    # the exact pre-image's components are PCA's (up to sign)
    s = np.sign(np.sum(m.preimage_components_ * ref.components_, axis=1))
    _close(m.preimage_components_ * s[:, None], ref.components_, 1e-9)


def test_linear_kernel_learned_map_is_sklearns_without_the_mean():
    """preimage='learned' on the linear kernel is scikit-learn's map (no mean added back)."""
    kw = dict(kernel="linear", fit_inverse_transform=True, alpha=1e-3)
    m = KernelPCA(3, preimage="learned", **kw).fit(X)
    sk = SkKernelPCA(3, **kw).fit(X)
    ours = m.inverse_transform(m.transform(NEW))
    _close(ours, sk.inverse_transform(sk.transform(NEW)), 1e-8)
    exact = m.inverse_transform(m.transform(NEW), method="exact")
    assert np.abs(ours - exact).max() > 1.0  # the learned map misses the mean


# --------------------------------------------------------- learned vs scikit-learn
@pytest.mark.parametrize(
    "kernel,kw",
    [
        ("rbf", dict(gamma=0.05)),
        ("poly", dict(gamma=0.1, degree=2, coef0=1.0)),
        ("laplacian", dict(gamma=0.1)),
        ("cosine", {}),
        ("sigmoid", dict(gamma=0.01, coef0=0.5)),
    ],
    ids=["rbf", "poly", "laplacian", "cosine", "sigmoid"],
)
@pytest.mark.parametrize("alpha", [1e-3, 1.0])
def test_learned_preimage_matches_sklearn(kernel, kw, alpha):
    """Same kernel and alpha, all rows in the sample: scikit-learn's learned pre-image."""
    m = KernelPCA(
        4, kernel=kernel, fit_inverse_transform=True, alpha=alpha, eigen_solver="dense", **kw
    ).fit(X)
    if kernel == "laplacian":  # not a named kernel of scikit-learn's KernelPCA
        kernel, kw = (lambda a, b: np.exp(-0.1 * np.abs(a - b).sum())), {}
    sk = SkKernelPCA(4, kernel=kernel, fit_inverse_transform=True, alpha=alpha, **kw).fit(X)
    assert m.preimage_ == "learned" and m.X_transformed_fit_.shape == (160, 4)
    # the kernel on the embedding is sign-invariant, so the dual coefficients agree as they are
    _close(m.dual_coef_, sk.dual_coef_, 1e-6)
    _close(m.inverse_transform(m.transform(NEW)), sk.inverse_transform(sk.transform(NEW)), 1e-8)


def test_learned_preimage_agrees_across_exact_solvers_and_input_kinds():
    """randomized == dense; numpy, dask and zarr inputs give the same pre-images."""
    kw = dict(kernel="rbf", gamma=0.05, fit_inverse_transform=True, alpha=0.01)
    dense = KernelPCA(3, eigen_solver="dense", **kw).fit(X)
    rand = KernelPCA(3, eigen_solver="randomized", random_state=0, **kw).fit(X)
    Z = dense.transform(NEW)
    _close(rand.inverse_transform(rand.transform(NEW)), dense.inverse_transform(Z), 1e-7)
    lazy = dense.inverse_transform(da.from_array(Z, chunks=(10, 3)))
    assert isinstance(lazy, da.Array) and lazy.chunks[0] == (10, 10, 5)
    _close(lazy.compute(), dense.inverse_transform(Z), 1e-12)
    z = zarr.create_array(store={}, shape=Z.shape, dtype="f8", chunks=(8, 3))
    z[...] = Z
    _close(dense.inverse_transform(z).compute(), dense.inverse_transform(Z), 1e-12)


def test_learned_preimage_on_a_subsample_is_an_m_by_m_ridge_solve():
    """preimage_sample_size < n: a seeded uniform subsample, an s x s solve (dense ref.)."""
    kw = dict(
        kernel="rbf",
        gamma=0.05,
        fit_inverse_transform=True,
        alpha=0.1,
        preimage_sample_size=50,
        eigen_solver="dense",
    )
    m = KernelPCA(4, random_state=3, **kw).fit(X)
    idx = m.preimage_indices_
    assert idx.shape == (50,) and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(
        idx, KernelPCA(4, random_state=3, **kw).fit(X).preimage_indices_
    )
    assert not np.array_equal(idx, KernelPCA(4, random_state=4, **kw).fit(X).preimage_indices_)
    E = m.fit_transform(X)[idx]
    _close(m.X_transformed_fit_, E, 1e-12)
    K = pairwise_kernels(E, metric="rbf", gamma=0.05) + 0.1 * np.eye(50)
    _close(m.dual_coef_, np.linalg.solve(K, X[idx]), 1e-8)
    Zn = m.transform(NEW)
    _close(
        m.inverse_transform(Zn),
        pairwise_kernels(Zn, E, metric="rbf", gamma=0.05) @ np.linalg.solve(K, X[idx]),
        1e-8,
    )


def test_learned_preimage_default_sample_caps_the_solve():
    """Exact models with n > 2048 train the learned map on 2048 rows, never n x n."""
    Xl = make_blobs(2300, n_features=3, centers=5, random_state=1)[0]
    m = KernelPCA(
        3,
        kernel="rbf",
        gamma=0.1,
        eigen_solver="randomized",
        n_power_iter=3,
        fit_inverse_transform=True,
        random_state=0,
    ).fit(Xl)
    assert m.dual_coef_.shape == (2048, 3) and m.X_transformed_fit_.shape == (2048, 3)


def test_nystroem_learned_preimage_is_trained_on_the_landmarks():
    """Nyström, sample "auto": rows = landmarks, their embedding = transform(landmarks)."""
    m = KernelPCA(
        4,
        kernel="rbf",
        gamma=0.05,
        eigen_solver="nystroem",
        n_landmarks=60,
        fit_inverse_transform=True,
        alpha=0.01,
        random_state=0,
    ).fit(X)
    np.testing.assert_array_equal(m.preimage_indices_, m.landmark_indices_)
    E = m.transform(m.landmarks_)
    _close(m.X_transformed_fit_, E, 1e-10)
    K = pairwise_kernels(E, metric="rbf", gamma=0.05) + 0.01 * np.eye(60)
    _close(m.dual_coef_, np.linalg.solve(K, m.landmarks_), 1e-6)
    # a sample size of its own: uniform rows of X, embedded by the model
    s = KernelPCA(
        4,
        kernel="rbf",
        gamma=0.05,
        eigen_solver="nystroem",
        n_landmarks=60,
        fit_inverse_transform=True,
        preimage_sample_size=100,
        random_state=0,
    ).fit(X)
    assert s.X_transformed_fit_.shape == (100, 4)
    _close(s.X_transformed_fit_, s.transform(X[s.preimage_indices_]), 1e-10)


def test_nystroem_with_every_row_as_landmark_matches_sklearn():
    kw = dict(kernel="rbf", gamma=0.05, fit_inverse_transform=True, alpha=0.01)
    m = KernelPCA(4, eigen_solver="nystroem", n_landmarks=160, random_state=0, **kw).fit(X)
    sk = SkKernelPCA(4, **kw).fit(X)
    _close(m.inverse_transform(m.transform(NEW)), sk.inverse_transform(sk.transform(NEW)), 1e-6)


# -------------------------------------------------------------------- fixed point
def _mika_reference(sk: SkKernelPCA, Xfit, z, x0, gamma, tol, max_iter):
    """Plain per-row fixed point from scikit-learn's eigenvectors (Mika et al. 1999)."""
    n = Xfit.shape[0]
    A = sk.eigenvectors_ / np.sqrt(sk.eigenvalues_)
    out = []
    for zi, x in zip(z, x0):
        Az = A @ zi
        g = 1.0 / n + Az - Az.sum() / n  # centring terms: P phi = mu + sum_k z_k u_k
        for _ in range(max_iter):
            w = g * np.exp(-gamma * cdist(x[None], Xfit, "sqeuclidean")[0])
            new = w @ Xfit / w.sum()
            done = np.linalg.norm(new - x) <= tol
            x = new
            if done:
                break
        out.append(x)
    return np.array(out)


def test_fixed_point_matches_a_plain_numpy_iteration():
    kw = dict(kernel="rbf", gamma=2.0, fit_inverse_transform=True, alpha=1e-3)
    m = KernelPCA(
        6,
        preimage="fixed_point",
        eigen_solver="dense",
        preimage_tol=1e-10,
        preimage_max_iter=500,
        **kw,
    ).fit(MOONS)
    sk = SkKernelPCA(6, **kw).fit(MOONS)
    noisy = MOONS[:30] + 0.15 * np.random.default_rng(1).standard_normal((30, 2))
    z_sk = sk.transform(noisy)
    ref = _mika_reference(sk, MOONS, z_sk, sk.inverse_transform(z_sk), 2.0, 1e-12, 500)
    got, status = m.inverse_transform(m.transform(noisy), return_status=True)
    assert np.all(status == STATUS_CONVERGED)
    _close(got, ref, 1e-7)
    # and it moves the learned pre-image: the two methods differ
    assert np.abs(got - m.inverse_transform(m.transform(noisy), method="learned")).max() > 1e-2


def test_fixed_point_with_every_component_recovers_training_rows():
    """All components: P phi(x_j) = phi(x_j), whose pre-image is x_j itself."""
    Xs = MOONS[::5]  # 40 rows: a well-conditioned rbf Gram matrix
    m = KernelPCA(
        len(Xs) - 1,
        kernel="rbf",
        gamma=1.0,
        eigen_solver="dense",
        preimage="fixed_point",
        fit_inverse_transform=True,
        alpha=1e-2,
    ).fit(Xs)
    assert m.n_components_ == len(Xs) - 1
    x = m.inverse_transform(m.transform(Xs))
    _close(x, Xs, 1e-6)
    assert np.abs(m.inverse_transform(m.transform(Xs), method="learned") - Xs).max() > 1e-3


def test_fixed_point_nystroem_with_every_landmark_equals_exact():
    kw = dict(
        kernel="rbf",
        gamma=2.0,
        fit_inverse_transform=True,
        alpha=1e-3,
        preimage="fixed_point",
        preimage_tol=1e-10,
        preimage_max_iter=500,
    )
    ex = KernelPCA(6, eigen_solver="dense", **kw).fit(MOONS)
    ny = KernelPCA(6, eigen_solver="nystroem", n_landmarks=200, random_state=0, **kw).fit(MOONS)
    noisy = MOONS[:20] + 0.1
    _close(
        ny.inverse_transform(ny.transform(noisy)),
        ex.inverse_transform(ex.transform(noisy)),
        1e-6,
    )


def test_fixed_point_nystroem_uses_the_landmark_expansion():
    """m < n landmarks: the result is a fixed point of the map over the landmarks."""
    m = KernelPCA(
        6,
        kernel="rbf",
        gamma=2.0,
        eigen_solver="nystroem",
        n_landmarks=50,
        fit_inverse_transform=True,
        alpha=1e-3,
        preimage="fixed_point",
        preimage_tol=1e-12,
        preimage_max_iter=1000,
        random_state=0,
    ).fit(MOONS)
    noisy = MOONS[:20] + 0.1
    z = m.transform(noisy)
    x, status = m.inverse_transform(z, return_status=True)
    assert np.all(status == STATUS_CONVERGED)
    L = m.landmarks_
    g = m.mean_weights_[None, :] + z @ m.projection_.T
    w = g * np.exp(-2.0 * cdist(x, L, "sqeuclidean"))
    _close(x, (w @ L) / w.sum(axis=1)[:, None], 1e-9)


def test_fixed_point_falls_back_to_the_learned_preimage_and_warns():
    m = KernelPCA(
        6,
        kernel="rbf",
        gamma=2.0,
        fit_inverse_transform=True,
        alpha=1e-3,
        preimage="fixed_point",
    ).fit(MOONS)
    Z = 5.0 * m.transform(MOONS[:50])  # far off the data's embedding: denominators vanish
    learned = m.inverse_transform(Z, method="learned")
    with pytest.warns(PreimageConvergenceWarning, match=r"did not converge for \d+ of 50 rows"):
        x = m.inverse_transform(Z)
    x2, status = m.inverse_transform(Z, return_status=True)
    bad = status == STATUS_DIVERGED
    assert bad.sum() >= 10
    np.testing.assert_array_equal(x[bad], learned[bad])
    np.testing.assert_array_equal(x, x2)
    capped = KernelPCA(
        6,
        kernel="rbf",
        gamma=2.0,
        fit_inverse_transform=True,
        alpha=1e-3,
        preimage="fixed_point",
        preimage_max_iter=1,
    ).fit(MOONS)
    z = capped.transform(MOONS[:10] + 0.1)
    with pytest.warns(PreimageConvergenceWarning, match="10 reached preimage_max_iter=1"):
        xc = capped.inverse_transform(z)
    np.testing.assert_array_equal(xc, capped.inverse_transform(z, method="learned"))
    _, st = capped.inverse_transform(z, return_status=True)
    assert np.all(st == STATUS_MAX_ITER)


def test_fixed_point_on_dask_input_is_lazy_and_equal():
    m = KernelPCA(
        6,
        kernel="rbf",
        gamma=2.0,
        fit_inverse_transform=True,
        alpha=1e-3,
        preimage="fixed_point",
    ).fit(MOONS)
    Z = m.transform(MOONS[:45] + 0.1)
    out, status = m.inverse_transform(da.from_array(Z, chunks=(20, 6)), return_status=True)
    assert isinstance(out, da.Array) and out.chunks == ((20, 20, 5), (2,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _close(out.compute(), m.inverse_transform(Z), 1e-12)
    assert status.dtype == np.int8 and np.all(status.compute() == 0)


def test_float32_model_returns_float32():
    m = KernelPCA(
        3, kernel="rbf", gamma=0.05, dtype="float32", fit_inverse_transform=True, alpha=0.01
    ).fit(X)
    out = m.inverse_transform(m.transform(NEW))
    assert out.dtype == np.float32 and out.shape == NEW.shape


# --------------------------------------------------------------------- validation
def test_inverse_transform_needs_fit_inverse_transform():
    m = KernelPCA(3, kernel="rbf").fit(X)
    with pytest.raises(NotFittedError, match="fit_inverse_transform"):
        m.inverse_transform(m.transform(NEW))


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(kernel="poly", preimage="fixed_point"), "for the\\s+rbf kernel"),
        (dict(kernel="rbf", preimage="exact"), "only for the linear kernel"),
    ],
)
def test_preimage_kernel_mismatch_is_refused_at_fit(params, match):
    with pytest.raises(InvalidParameterError, match=match):
        KernelPCA(2, fit_inverse_transform=True, **params).fit(X)


@pytest.mark.parametrize(
    "name,value",
    [
        ("alpha", -1.0),
        ("preimage", "newton"),
        ("preimage_sample_size", 0),
        ("preimage_tol", 0.0),
        ("preimage_max_iter", 0),
        ("fit_inverse_transform", 1),
    ],
)
def test_bad_preimage_parameters_are_refused(name, value):
    with pytest.raises(InvalidParameterError, match=f"The '{name}' parameter of KernelPCA"):
        KernelPCA(2, **{name: value}).fit(X)


def test_bad_embeddings_are_refused():
    m = KernelPCA(3, kernel="rbf", fit_inverse_transform=True).fit(X)
    with pytest.raises(InvalidInputError, match="3 columns"):
        m.inverse_transform(np.zeros((2, 4)))
    with pytest.raises(InvalidInputError, match="NaN"):
        m.inverse_transform(np.full((2, 3), np.nan))
    with pytest.raises(InvalidInputError, match="NaN"):
        m.inverse_transform(da.full((2, 3), np.nan, chunks=1)).compute()
    with pytest.raises(InvalidParameterError, match="rbf"):
        m.inverse_transform(np.zeros((2, 3)), method="exact")


def test_refit_without_the_flag_drops_the_preimage():
    m = KernelPCA(3, kernel="linear", fit_inverse_transform=True).fit(X)
    m.set_params(fit_inverse_transform=False).fit(X)
    assert not hasattr(m, "dual_coef_") and not hasattr(m, "preimage_components_")


@pytest.mark.distributed
def test_preimages_on_a_distributed_cluster(dask_client):
    """Block tasks (kernel, expansion, learned map) travel to worker processes and agree."""
    import dask

    m = KernelPCA(
        6,
        kernel="rbf",
        gamma=2.0,
        fit_inverse_transform=True,
        alpha=1e-3,
        preimage="fixed_point",
        eigen_solver="nystroem",
        n_landmarks=80,
        random_state=0,
    ).fit(MOONS)
    Z = m.transform(MOONS[:60] + 0.1)
    with dask.config.set(scheduler="threads"):
        ref = m.inverse_transform(Z)
    out = m.inverse_transform(da.from_array(Z, chunks=(15, 6)))
    _close(dask_client.compute(out).result(), ref, 1e-12)
