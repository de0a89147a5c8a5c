"""Nyström kernel PCA against exact kernel PCA and an independent dense construction."""

import dask.array as da
import numpy as np
import pytest
import scipy.linalg
from sklearn.datasets import make_blobs
from sklearn.decomposition import PCA
from threadpoolctl import threadpool_limits

from kpca_dask import ConvergenceWarning, KernelPCA
from kpca_dask.kernels import make_kernel

from ..conftest import align_signs

X_SMALL, _ = make_blobs(400, n_features=5, centers=6, cluster_std=1.2, random_state=1)
NEW_SMALL = X_SMALL[:30] + 0.4

# Ten clusters in 8-D (as in test_randomized): a clear, gapped rbf spectrum.
X_BLOBS, _ = make_blobs(1500, n_features=8, centers=10, cluster_std=1.5, random_state=0)
GAMMA = 0.01
K = 8


def imbalanced_clusters(seed=0, big=1700, n_small=30, d=3):
    """One large cluster and many small far-away ones of 6-14 points."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(6, 15, size=n_small)
    parts = [rng.normal(scale=1.0, size=(big, d))]
    centres = rng.normal(scale=30.0, size=(n_small, d))
    parts += [c + rng.normal(scale=0.3, size=(s, d)) for c, s in zip(centres, sizes)]
    return np.vstack(parts)


def nys(n_components=K, **kw):
    params = dict(kernel="rbf", gamma=GAMMA, eigen_solver="nystroem", random_state=0)
    params.update(kw)
    return KernelPCA(n_components, **params)


def max_rel(a, b):
    return float(np.max(np.abs(a - b) / np.abs(b)))


def dense_reference(X, k, **kw):
    """The dense exact solver (one BLAS thread: several times faster for its eigh when
    the shared machine's other core is busy)."""
    with threadpool_limits(limits=1, user_api="blas"):
        return KernelPCA(k, eigen_solver="dense", **kw).fit(X)


@pytest.fixture(scope="module")
def blobs_exact():
    return dense_reference(X_BLOBS, K, kernel="rbf", gamma=GAMMA)


# ----------------------------------------------------------- m = n is exact
KERNELS = [
    dict(kernel="rbf", gamma=0.05),
    dict(kernel="laplacian", gamma=0.05),
    dict(kernel="poly", gamma=0.05, degree=2, coef0=1.0),
    dict(kernel="cosine"),
]


@pytest.mark.parametrize("kw", KERNELS, ids=lambda kw: kw["kernel"])
@pytest.mark.parametrize("method", ["covariance", "randomized"])
def test_all_rows_as_landmarks_equals_the_exact_solver(kw, method):
    """m = n: eigenvalues, eigenvectors (same signs), transform, score, centring
    statistics and explained variance equal the dense exact solver's. (poly and cosine
    kernel matrices are rank deficient here: the coefficients on the rows are then not
    unique and only the functions they define are compared.)"""
    k = 4
    ref = dense_reference(X_SMALL, k, **kw)
    m = KernelPCA(
        k,
        eigen_solver="nystroem",
        n_landmarks=len(X_SMALL),
        nystroem_method=method,
        random_state=0,
        tol=1e-12,
        max_iter=30,
        **kw,
    ).fit(X_SMALL)
    assert m.n_landmarks_ == len(X_SMALL)
    np.testing.assert_array_equal(m.landmark_indices_, np.arange(len(X_SMALL)))
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-9)
    if kw["kernel"] in ("rbf", "laplacian"):
        np.testing.assert_allclose(m.eigenvectors_, ref.eigenvectors_, atol=1e-6)
    np.testing.assert_allclose(m.transform(NEW_SMALL), ref.transform(NEW_SMALL), atol=1e-6)
    np.testing.assert_allclose(
        m.score_samples(NEW_SMALL), ref.score_samples(NEW_SMALL), rtol=1e-6, atol=1e-9
    )
    np.testing.assert_allclose(m.row_means_, ref.row_means_, rtol=1e-12)
    assert m.grand_mean_ == pytest.approx(ref.grand_mean_, rel=1e-9)
    assert m.kernel_trace_ == pytest.approx(ref.kernel_trace_, rel=1e-12)
    np.testing.assert_allclose(
        m.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-9
    )
    np.testing.assert_allclose(
        m.fit_transform(X_SMALL), ref.eigenvectors_ * np.sqrt(ref.eigenvalues_), atol=1e-6
    )


# ------------------------------------------------------------ m < n accuracy
def test_eigenvalues_approach_the_exact_ones_as_m_grows(blobs_exact):
    """Top-k relative eigenvalue error, averaged over 3 seeds, falls with every
    doubling of m (uniform landmarks, gapped spectrum) and is below 2e-3 at m = 400."""
    errors = []
    for m in (25, 50, 100, 200, 400):
        e = [
            max_rel(
                nys(n_landmarks=m, landmark_method="uniform", random_state=s)
                .fit(X_BLOBS)
                .eigenvalues_,
                blobs_exact.eigenvalues_,
            )
            for s in range(3)
        ]
        errors.append(np.mean(e))
    assert all(b < a for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 2e-3, errors


def test_embedding_subspace_approaches_the_exact_one(blobs_exact):
    """The training embedding spans nearly the exact top-k subspace at m = 400."""
    emb = nys(n_landmarks=400, landmark_method="rpcholesky").fit_transform(X_BLOBS)
    angles = scipy.linalg.subspace_angles(emb, blobs_exact.eigenvectors_)
    assert np.max(angles) < 0.05


def test_rpcholesky_beats_uniform_on_imbalanced_clusters():
    """One large cluster plus 30 small far ones: at the same m = 100, rpcholesky's top-16
    eigenvalue error averaged over 4 seeds is several times below uniform's (uniform
    misses most small clusters), and beats uniform with twice the landmarks."""
    X = imbalanced_clusters()
    ref = dense_reference(X, 16, kernel="rbf", gamma=0.1).eigenvalues_

    def err(method, m):
        return np.mean(
            [
                max_rel(
                    KernelPCA(
                        16,
                        kernel="rbf",
                        gamma=0.1,
                        eigen_solver="nystroem",
                        n_landmarks=m,
                        landmark_method=method,
                        random_state=s,
                    )
                    .fit(X)
                    .eigenvalues_,
                    ref,
                )
                for s in range(4)
            ]
        )

    rpc, uni = err("rpcholesky", 100), err("uniform", 100)
    assert rpc < 0.25 * uni, (rpc, uni)
    assert rpc < err("uniform", 200)


# ------------------------------------------- against a dense construction
def dense_nystroem(X, Z, kernel, k):
    """Independent reference: explicit features k(X, Z) W^-1/2 and scikit-learn's PCA."""
    W = kernel(Z, Z)
    s, U = np.linalg.eigh(W)
    keep = s > 1e-12 * s.max()
    W_isqrt = (U[:, keep] / np.sqrt(s[keep])) @ U[:, keep].T
    W_sqrt = (U[:, keep] * np.sqrt(s[keep])) @ U[:, keep].T
    feats = lambda A: kernel(A, Z) @ W_isqrt  # noqa: E731
    F = feats(X)
    pca = PCA(k, svd_solver="full").fit(F)
    return pca, feats, F.mean(axis=0), W_sqrt


@pytest.mark.parametrize("method", ["covariance", "randomized"])
def test_matches_explicit_features_and_sklearn_pca(method):
    """m < n: eigenvalues = sklearn PCA variances * (n - 1) on explicit Nyström features,
    transform = PCA transform of the new rows' features, score = its dense formula."""
    m = nys(
        6,
        n_landmarks=120,
        landmark_method="kmeans++",
        nystroem_method=method,
        gamma=0.05,
        tol=1e-12,
        max_iter=30,
    ).fit(X_BLOBS)
    kern = make_kernel("rbf", gamma=0.05)
    Z = X_BLOBS[m.landmark_indices_]
    np.testing.assert_array_equal(m.landmarks_, Z)
    pca, feats, fmean, _ = dense_nystroem(X_BLOBS, Z, kern, 6)
    n = len(X_BLOBS)
    np.testing.assert_allclose(m.eigenvalues_, pca.explained_variance_ * (n - 1), rtol=1e-8)
    new = X_BLOBS[:40] * 1.1 + 0.5
    emb_ref = pca.transform(feats(new))
    emb = m.transform(new)
    np.testing.assert_allclose(align_signs(emb, emb_ref), emb_ref, atol=1e-6)
    # score: ||phi(x) - P mu||^2 - ||emb||^2 = k(x,x) - |f(x)|^2 + |f(x) - fmean|^2 - |emb|^2
    fx = feats(new)
    score_ref = (
        kern.diag(new) - np.sum(fx**2, 1) + np.sum((fx - fmean) ** 2, 1) - np.sum(emb_ref**2, 1)
    )
    np.testing.assert_allclose(m.score_samples(new), score_ref, rtol=1e-6, atol=1e-9)
    assert m.grand_mean_ == pytest.approx(fmean @ fmean, rel=1e-10)
    np.testing.assert_allclose(m.row_means_, kern(X_BLOBS, Z).mean(axis=0), rtol=1e-12)


def test_score_flags_rows_unlike_every_landmark():
    """A row far from every landmark (k(x, Z) = 0) scores k(x, x) + g - |offset|^2, the
    largest possible value, above every training row: the off-span part counts."""
    m = nys(n_landmarks=100).fit(X_BLOBS)
    far = X_BLOBS[:3] + 1000.0
    limit = 1.0 + m.grand_mean_ - m.offset_ @ m.offset_
    np.testing.assert_allclose(m.score_samples(far), limit, rtol=1e-12)
    assert m.score_samples(X_BLOBS).max() < limit


def test_residuals_certify_the_feature_covariance_eigenpairs():
    """residuals_ = ||Sigma p - lambda p|| / lambda with Sigma the centred feature
    covariance (dense here) and p = W^1/2 A the feature-space eigenvector."""
    m = nys(6, n_landmarks=150, nystroem_method="randomized", n_power_iter=1, gamma=0.05)
    with pytest.warns(ConvergenceWarning, match="did not certify"):
        m.fit(X_BLOBS)  # two passes only: not certified, and it says so
    assert not m.converged_
    kern = make_kernel("rbf", gamma=0.05)
    _, _, _, W_sqrt = dense_nystroem(X_BLOBS, m.landmarks_, kern, 6)
    F = kern(X_BLOBS, m.landmarks_) @ np.linalg.pinv(W_sqrt, rcond=1e-12, hermitian=True)
    Fc = F - F.mean(axis=0)
    Sigma = Fc.T @ Fc
    P = W_sqrt @ m.projection_
    np.testing.assert_allclose(np.linalg.norm(P, axis=0), 1.0, atol=1e-8)
    expected = np.linalg.norm(Sigma @ P - P * m.eigenvalues_, axis=0) / m.eigenvalues_
    np.testing.assert_allclose(m.residuals_, expected, rtol=1e-4, atol=1e-12)
    assert m.residuals_.max() > 1e-10  # two passes only: a real, non-zero certificate


# ------------------------------------------------------------- determinism
@pytest.mark.filterwarnings("ignore::kpca_dask.exceptions.ConvergenceWarning")  # 4 passes
def test_same_seed_same_result_and_chunking_independent():
    """A seed fixes landmarks and result bit for bit; other chunkings give the same
    landmarks and the same result to rounding; another seed other landmarks."""
    kw = dict(n_landmarks=150, nystroem_method="randomized", n_power_iter=3)
    a = nys(random_state=42, **kw).fit(X_BLOBS)
    b = nys(random_state=42, **kw).fit(X_BLOBS)
    np.testing.assert_array_equal(a.eigenvalues_, b.eigenvalues_)
    np.testing.assert_array_equal(a.projection_, b.projection_)
    c = nys(random_state=42, chunk_size=211, **kw).fit(da.from_array(X_BLOBS, chunks=(400, -1)))
    np.testing.assert_array_equal(c.landmark_indices_, a.landmark_indices_)
    np.testing.assert_allclose(c.eigenvalues_, a.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(c.projection_, a.projection_, atol=1e-8)
    d = nys(random_state=43, **kw).fit(X_BLOBS)
    assert not np.array_equal(d.landmark_indices_, a.landmark_indices_)


def test_float32_close_to_float64():
    """float32 kernel evaluation: eigenvalues within 1e-5, transforms within 1e-4."""
    a = nys(n_landmarks=200).fit(X_BLOBS)
    b = nys(n_landmarks=200, dtype="float32").fit(X_BLOBS)
    np.testing.assert_array_equal(a.landmark_indices_, b.landmark_indices_)
    np.testing.assert_allclose(b.eigenvalues_, a.eigenvalues_, rtol=1e-5)
    assert b.transform(X_BLOBS[:50]).dtype == np.float32
    np.testing.assert_allclose(
        b.transform(X_BLOBS[:50]),
        a.transform(X_BLOBS[:50]),
        atol=1e-4 * np.sqrt(a.eigenvalues_[0]),
    )


@pytest.mark.parametrize("method", ["covariance", "randomized"])
def test_both_methods_agree(method, blobs_exact):
    """The covariance and randomized methods solve the same m x m problem."""
    ref = nys(n_landmarks=300, nystroem_method="covariance").fit(X_BLOBS)
    m = nys(n_landmarks=300, nystroem_method=method).fit(X_BLOBS)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-7)
    np.testing.assert_allclose(
        m.transform(X_BLOBS[:20]), ref.transform(X_BLOBS[:20]), atol=1e-4
    )
    assert m.nystroem_method_ == method


# --------------------------------------------------------------- the model
def test_model_holds_nothing_of_size_n():
    """After fit, no fitted array has n rows: landmarks, m x k projection, centring."""
    X = np.random.default_rng(0).standard_normal((3001, 4))
    m = nys(5, n_landmarks=64, gamma=0.3).fit(X)
    assert m.X_fit_ is m.landmarks_ and m.X_fit_.shape == (64, 4)
    assert m.projection_.shape == (64, 5) and m.eigenvectors_.shape == (64, 5)
    assert m.row_means_.shape == (64,) and m.offset_.shape == (5,)
    for name, value in vars(m).items():
        if isinstance(value, np.ndarray):
            assert 3001 not in value.shape, name
    np.testing.assert_allclose(m.offset_, m.row_means_ @ m.projection_, rtol=1e-12)
    np.testing.assert_allclose(m.eigenvectors_, m.projection_ * np.sqrt(m.eigenvalues_))


def test_fit_transform_types_and_values():
    """numpy in -> numpy out; dask in -> lazy dask out with the input's chunks; both are the
    model's embedding of the training rows."""
    m = nys(n_landmarks=100)
    emb = m.fit_transform(X_BLOBS)
    assert isinstance(emb, np.ndarray) and emb.shape == (1500, K)
    np.testing.assert_array_equal(emb, m.transform(X_BLOBS))
    Xd = da.from_array(X_BLOBS, chunks=(700, -1))
    lazy = nys(n_landmarks=100).fit_transform(Xd)
    assert isinstance(lazy, da.Array) and lazy.chunks[0] == Xd.chunks[0]
    np.testing.assert_allclose(lazy.compute(), emb, rtol=1e-12, atol=1e-12)
    # training embedding columns are centred with squared norms = eigenvalues
    np.testing.assert_allclose(emb.mean(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(np.sum(emb**2, axis=0), m.eigenvalues_, rtol=1e-9)


def test_transform_graph_is_one_task_per_block_and_independent_of_n():
    """Transform needs only the landmarks: the graph holds m x d and m x (k + 1) arrays."""
    m = nys(n_landmarks=50, chunk_size=100).fit(X_BLOBS)
    new = da.from_array(X_BLOBS[:1000], chunks=(100, -1))
    out = m.transform(new)
    layer = dict(
        out.dask.layers[[k for k in out.dask.layers if k.startswith("kpca-transform")][0]]
    )
    tasks = [k for k in layer if isinstance(k, tuple)]
    consts = [v for k, v in layer.items() if not isinstance(k, tuple)]
    assert len(tasks) == 10
    assert sorted(c.shape for c in consts) == [(50, 8), (50, K + 1)]


def test_zarr_input_is_read_per_pass_not_held(tmp_path, monkeypatch):
    """A zarr input above the persist budget is streamed at every pass: same result
    as in memory, lazy embedding out."""
    import zarr

    import kpca_dask.plan as est

    z = zarr.create_array(
        str(tmp_path / "x.zarr"), shape=X_BLOBS.shape, chunks=(300, 8), dtype="f8"
    )
    z[...] = X_BLOBS
    monkeypatch.setattr(est, "NYSTROEM_PERSIST_BYTES", 0)
    kw = dict(n_landmarks=100, chunk_size=256, nystroem_method="randomized")
    ref = nys(**kw).fit(X_BLOBS)
    m = nys(**kw)
    emb = m.fit_transform(z)
    assert isinstance(emb, da.Array)
    np.testing.assert_array_equal(m.landmark_indices_, ref.landmark_indices_)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(emb.compute(), ref.transform(X_BLOBS), atol=1e-8)


def test_memory_never_holds_an_n_by_m_array():
    """Peak traced memory of a fit stays far below one n x m float64 array (320 MB).

    Uniform landmarks: rpcholesky adds its documented ``8 s m`` byte factor on the
    sample (64 MB for s = 20000, m = 400), independent of n."""
    import tracemalloc

    X = np.random.default_rng(0).standard_normal((100_000, 4))
    model = nys(
        8,
        n_landmarks=400,
        gamma=0.5,
        dtype="float32",
        nystroem_method="randomized",
        landmark_method="uniform",
    )
    tracemalloc.start()
    try:
        model.fit(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 60e6, f"peak {peak / 1e6:.0f} MB"
    assert model.n_passes_ >= 2


def test_n_components_none_keeps_every_component():
    """n_components=None: all positive eigenvalues of the feature covariance."""
    m = KernelPCA(
        None, kernel="rbf", gamma=GAMMA, eigen_solver="nystroem", n_landmarks=40, random_state=0
    ).fit(X_BLOBS)
    assert m.nystroem_method_ == "covariance"
    assert 30 <= m.n_components_ <= 40
    assert np.all(np.diff(m.eigenvalues_) <= 0)


def test_auto_picks_nystroem_above_the_threshold():
    from kpca_dask.plan import NYSTROEM_MIN_SAMPLES

    def solver(kp, n, **kw):  # the plan reads no data: lazy zeros of n rows
        return kp.plan(da.zeros((n, 4), chunks=(4096, 4)), **kw).solver

    kp = KernelPCA(16, kernel="rbf")
    assert solver(kp, NYSTROEM_MIN_SAMPLES) == "randomized"
    assert solver(kp, NYSTROEM_MIN_SAMPLES + 1) == "nystroem"
    centring = (np.zeros(NYSTROEM_MIN_SAMPLES + 1), 0.0)
    assert solver(kp, NYSTROEM_MIN_SAMPLES + 1, centring=centring) == "randomized"
    assert solver(kp, 1000) == "dense"
    assert solver(KernelPCA(3000), 10**6) == "randomized"  # k > default m


@pytest.mark.parametrize("method_M", [None, 5])
def test_fused_leaves_give_the_same_bits(method_M):
    """The covariance pass's tree with its first level fused into the leaves (what large
    inputs get, to hold one m x m running sum per task instead of one per block) adds the
    same numbers in the same order as the unfused tree: identical statistics."""
    import dask

    from kpca_dask.kernels import make_kernel
    from kpca_dask.solvers.nystroem import block_stats_graph, nystroem_basis

    rng = np.random.default_rng(3)
    X = rng.standard_normal((2300, 6))
    Xd = da.from_array(X, chunks=(50, -1))  # 46 blocks: 6 fused groups, the last short
    basis = nystroem_basis(X[:40], make_kernel("rbf", gamma=0.3), np.float32)
    Zp = basis.prepared()
    M = None if method_M is None else rng.standard_normal((40, method_M)).astype(np.float32)
    outs = [
        dask.compute(block_stats_graph(Xd, basis, Zp, M, True, fuse=f), scheduler="threads")[0]
        for f in (False, True)
    ]
    (a0, c0, d0, r0), (a1, c1, d1, r1) = outs
    assert r0 == r1 == 2300 and d0 == d1
    np.testing.assert_array_equal(a0, a1)
    np.testing.assert_array_equal(c0, c1)
