"""The scikit-learn contract, feature by feature, against independent references.

References: scipy's ``eigh`` on the explicitly centred kernel matrix and
scikit-learn's own ``KernelPCA`` (never our code checking itself).
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.linalg
import scipy.sparse
from sklearn.datasets import make_blobs, make_circles
from sklearn.decomposition import KernelPCA as SkKernelPCA
from sklearn.metrics.pairwise import rbf_kernel

from kpca_dask import KernelPCA
from kpca_dask import validation as V
from kpca_dask.exceptions import (
    AsymmetricKernelWarning,
    InvalidInputError,
    InvalidParameterError,
)

X = make_blobs(300, n_features=5, centers=4, random_state=0)[0]
NEW = make_blobs(40, n_features=5, centers=4, random_state=1)[0]


def reference(K: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k eigenpairs of the centred K by scipy's eigh (the independent reference)."""
    n = K.shape[0]
    H = np.eye(n) - 1.0 / n
    w, V = scipy.linalg.eigh(H @ K @ H)
    return w[::-1][:k], V[:, ::-1][:, :k]


def same_up_to_sign(A: np.ndarray, B: np.ndarray, atol: float) -> None:
    s = np.sign(np.sum(A * B, axis=0))
    s[s == 0] = 1
    np.testing.assert_allclose(A * s, B, atol=atol)


# ------------------------------------------------------------------ arpack
@pytest.mark.parametrize("kernel", ["rbf", "linear"])
def test_arpack_matches_eigh(kernel):
    K = rbf_kernel(X, gamma=0.1) if kernel == "rbf" else X @ X.T
    w_ref, V_ref = reference(K, 6)
    m = KernelPCA(6, kernel=kernel, gamma=0.1, eigen_solver="arpack", random_state=0).fit(X)
    assert m.eigen_solver_ == "arpack" and m.converged_
    np.testing.assert_allclose(m.eigenvalues_[:5], w_ref[:5], rtol=1e-10)
    # linear on 5 features: rank 5, the 6th eigenvalue is 0 (kept as a zero column)
    same_up_to_sign(m.eigenvectors_[:, :5], V_ref[:, :5], atol=1e-8)
    assert m.residuals_.max() < 1e-8
    assert m.n_passes_ < 300


def test_arpack_low_rank_zero_eigenvalues_converge():
    """Linear kernel on 2-D data (rank 2) with 10 components: 8 zero eigenvalues, which
    ARPACK cannot converge at tol=0 without the shift (measured: 7 of 10 pairs)."""
    Xc = make_circles(400, factor=0.3, noise=0.05, random_state=0)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning
        m = KernelPCA(10, kernel="linear", eigen_solver="arpack", random_state=0).fit(Xc)
    w_ref, _ = reference(Xc @ Xc.T, 2)
    np.testing.assert_allclose(m.eigenvalues_[:2], w_ref, rtol=1e-10)
    assert m.eigenvalues_.shape == (10,) and np.all(m.eigenvalues_[2:] == 0)
    ref = SkKernelPCA(10, kernel="linear", eigen_solver="dense").fit(Xc).transform(Xc[:20])
    same_up_to_sign(m.transform(Xc[:20]), ref, atol=1e-10)


def test_arpack_is_deterministic_and_seeded_like_sklearn():
    a = KernelPCA(3, kernel="rbf", eigen_solver="arpack", random_state=3).fit_transform(X)
    b = KernelPCA(3, kernel="rbf", eigen_solver="arpack", random_state=3).fit_transform(X)
    np.testing.assert_array_equal(a, b)


def test_arpack_max_iter_too_small_warns():
    """ARPACK stopping at max_iter returns the pairs that converged, with a warning."""
    from sklearn.exceptions import ConvergenceWarning as SkConvergenceWarning

    with pytest.warns(SkConvergenceWarning, match="ARPACK stopped at max_iter=1 with 3 of 5"):
        m = KernelPCA(
            5,
            kernel="rbf",
            eigen_solver="arpack",
            max_iter=1,
            tol=1e-14,
            remove_zero_eig=True,
            random_state=0,
        ).fit(X)
    assert not m.converged_ and m.n_components_ == 3
    w_ref, _ = reference(rbf_kernel(X, gamma=0.2), 3)
    np.testing.assert_allclose(m.eigenvalues_, w_ref, rtol=1e-8)


# ------------------------------------------------------------- precomputed
@pytest.mark.parametrize(
    "container,solver",
    [
        ("numpy", "dense"),
        ("numpy", "arpack"),
        ("numpy", "randomized"),
        ("dask", "dense"),
        ("dask", "arpack"),
        ("zarr", "arpack"),
        ("zarr", "randomized"),
    ],
)
def test_precomputed_matches_sklearn(container, solver, tmp_path):
    K = rbf_kernel(X, gamma=0.1)
    Knew = rbf_kernel(NEW, X, gamma=0.1)
    if container == "dask":
        Kin = da.from_array(K, chunks=(70, 90))
    elif container == "zarr":
        import zarr

        Kin = zarr.create_array(
            str(tmp_path / "k.zarr"), shape=K.shape, chunks=(64, 64), dtype="f8"
        )
        Kin[...] = K
    else:
        Kin = K
    m = KernelPCA(
        4,
        kernel="precomputed",
        eigen_solver=solver,
        chunk_size=100,
        n_power_iter=10,
        random_state=0,
    ).fit(Kin)
    sk = SkKernelPCA(4, kernel="precomputed", eigen_solver="dense").fit(K)
    np.testing.assert_allclose(m.eigenvalues_, sk.eigenvalues_, rtol=1e-8)
    out = m.transform(Knew)
    same_up_to_sign(out, sk.transform(Knew), atol=1e-7)
    # the same model from rows and the rbf kernel
    rows = KernelPCA(4, kernel="rbf", gamma=0.1, eigen_solver="dense").fit(X)
    same_up_to_sign(out, rows.transform(NEW), atol=1e-7)
    emb = m.fit_transform(Kin)
    emb = emb.compute() if hasattr(emb, "compute") else emb
    same_up_to_sign(emb, sk.transform(K), atol=1e-7)


def test_precomputed_blocks_are_square_and_read_once_per_pass():
    """Out of core: the matrix is used in r x r blocks (never a full row block), the
    upper ones only when K is symmetric."""
    from kpca_dask.gram import PrecomputedKernelMatrix

    K = rbf_kernel(X, gamma=0.1)
    K = 0.5 * (K + K.T)  # rbf_kernel's own output is symmetric to rounding only
    op = PrecomputedKernelMatrix(da.from_array(K, chunks=(300, 300)), block_rows=64)
    assert set(op.X.chunks[0]) <= {64, 300 - 4 * 64} and op.X.chunks[0] == op.X.chunks[1]
    bad, asym, top = op.inspect()
    assert (bad, asym) == (0, 0.0) and op.symmetric
    Z = np.random.default_rng(0).normal(size=(300, 3))
    np.testing.assert_allclose(op.product(Z), K @ Z, rtol=1e-12)
    dsk, _, _ = op._pair_graph(Z, range(op.n_blocks), "t")
    reads = [
        t for t in dsk.values() if isinstance(t, tuple) and t[0].__name__ == "_precomputed_task"
    ]
    assert len(reads) == op.n_blocks * (op.n_blocks + 1) // 2
    assert all(t[2] is None for t in reads)  # no mirror block read: symmetric


def test_precomputed_non_symmetric_uses_the_symmetric_part():
    rng = np.random.default_rng(0)
    K = rbf_kernel(X, gamma=0.1)
    A = K + 1e-3 * rng.normal(size=K.shape)  # not symmetric
    S = 0.5 * (A + A.T)
    w_ref, V_ref = reference(S, 3)
    for solver in ("dense", "arpack", "randomized"):
        est = KernelPCA(
            3,
            kernel="precomputed",
            eigen_solver=solver,
            chunk_size=64,
            n_power_iter=10,
            random_state=0,
        )
        # asymmetric beyond rounding: symmetrised, and said (issue 29; docs/sklearn.md)
        with pytest.warns(AsymmetricKernelWarning, match=r"max \|K - K\.T\| = 0\.00"):
            m = est.fit(da.from_array(A, chunks=100))
        np.testing.assert_allclose(m.eigenvalues_, w_ref, rtol=1e-7, err_msg=solver)
        same_up_to_sign(m.eigenvectors_, V_ref, atol=1e-6)


def test_precomputed_errors():
    K = rbf_kernel(X[:20], gamma=0.1)
    with pytest.raises(InvalidInputError, match="Precomputed matrix must be a square matrix"):
        KernelPCA(2, kernel="precomputed").fit(K[:, :10])
    Kn = K.copy()
    Kn[3, 4] = np.nan
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        KernelPCA(2, kernel="precomputed").fit(Kn)
    m = KernelPCA(2, kernel="precomputed").fit(K)
    with pytest.raises(InvalidInputError, match="expecting 20 features.*n_indexed"):
        m.transform(K[:, :5])
    assert not hasattr(m, "score_samples")
    with pytest.raises(ValueError, match="Cannot fit_inverse_transform with a precomputed"):
        KernelPCA(2, kernel="precomputed", fit_inverse_transform=True).fit(K)
    with pytest.raises(InvalidParameterError, match="nystroem"):
        KernelPCA(2, kernel="precomputed", eigen_solver="nystroem").fit(K)


def test_precomputed_model_saves_and_loads(tmp_path):
    from kpca_dask import load

    K = rbf_kernel(X, gamma=0.1)
    m = KernelPCA(3, kernel="precomputed").fit(K)
    m.save(tmp_path / "m")
    m2 = load(tmp_path / "m")
    Knew = rbf_kernel(NEW, X, gamma=0.1)
    np.testing.assert_array_equal(m2.transform(Knew), m.transform(Knew))


# ------------------------------------------------- zero and negative eigenvalues
def test_remove_zero_eig_and_n_components_none_like_sklearn():
    Xr = np.repeat(X[:4], 5, axis=0)  # 4 distinct rows: centred rank 3
    for kw, shape in [
        (dict(n_components=5), 5),
        (dict(n_components=5, remove_zero_eig=True), 3),
        (dict(n_components=None), 3),
    ]:
        sk = SkKernelPCA(kernel="linear", eigen_solver="dense", **kw).fit(Xr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = KernelPCA(kernel="linear", eigen_solver="dense", **kw).fit(Xr)
        assert m.eigenvalues_.shape == sk.eigenvalues_.shape == (shape,), kw
        np.testing.assert_allclose(m.eigenvalues_, sk.eigenvalues_, rtol=1e-10, atol=0)
        same_up_to_sign(m.transform(X[:7]), sk.transform(X[:7]), atol=1e-8)


def test_significant_negative_eigenvalues_are_refused_unless_dropped():
    rng = np.random.default_rng(0)
    B = rng.normal(size=(30, 30))
    K = B + B.T  # indefinite
    with pytest.raises(
        InvalidInputError,
        match="There are significant negative eigenvalues.*Ask for n_components=",
    ):
        KernelPCA(25, kernel="precomputed", eigen_solver="dense").fit(K)
    with pytest.warns(Warning, match="Kept"):
        m = KernelPCA(25, kernel="precomputed", eigen_solver="dense", remove_zero_eig=True).fit(
            K
        )
    assert np.all(m.eigenvalues_ > 0)


# ------------------------------------------------------------------ sparse
@pytest.mark.parametrize("fmt", ["csr_matrix", "csc_matrix", "csr_array", "coo_array"])
def test_sparse_input_matches_dense(fmt):
    rng = np.random.default_rng(0)
    D = rng.random((200, 30)) * (rng.random((200, 30)) < 0.1)
    S = getattr(scipy.sparse, fmt)(D)
    a = KernelPCA(3, kernel="rbf", gamma=0.2, eigen_solver="dense")
    b = KernelPCA(3, kernel="rbf", gamma=0.2, eigen_solver="dense")
    ea, eb = a.fit_transform(S), b.fit_transform(D)
    assert isinstance(ea, np.ndarray)
    np.testing.assert_allclose(ea, eb, atol=1e-12)
    np.testing.assert_allclose(a.transform(S[:10]), b.transform(D[:10]), atol=1e-12)
    sk = SkKernelPCA(3, kernel="rbf", gamma=0.2).fit(scipy.sparse.csr_matrix(D))
    same_up_to_sign(a.transform(S[:10]), sk.transform(D[:10]), atol=1e-8)


def test_sparse_input_is_densified_a_row_block_at_a_time():
    S = scipy.sparse.random(1000, 50, density=0.01, format="csr", random_state=0)
    Xd = V.sparse_to_dask(S, block_bytes=50 * 8 * 100)  # 100 rows per block
    assert Xd.chunks[0] == (100,) * 10
    np.testing.assert_array_equal(Xd.compute(), S.toarray())
    # the graph holds sparse slices, not dense arrays
    for v in dict(Xd.__dask_graph__()).values():
        assert not (isinstance(v, np.ndarray) and v.size > 100 * 50)


# --------------------------------------------------------- dtypes, errors, names
def test_float32_in_float32_out():
    m = KernelPCA(3, kernel="rbf", gamma=0.1)
    e32 = m.fit_transform(X.astype(np.float32))
    assert e32.dtype == np.float32 and m.transform(NEW.astype(np.float32)).dtype == np.float32
    assert m.transform(NEW).dtype == np.float64
    e64 = KernelPCA(3, kernel="rbf", gamma=0.1).fit_transform(X)
    np.testing.assert_allclose(e32, e64, atol=1e-5)


def test_not_fitted_error_is_sklearn_s():
    from sklearn.exceptions import NotFittedError as SkNotFitted

    with pytest.raises(SkNotFitted, match="not fitted yet"):
        KernelPCA(2).transform(X)
    m = KernelPCA(2).fit(X)
    with pytest.raises(SkNotFitted, match="fit_inverse_transform"):
        m.inverse_transform(m.transform(X))


@pytest.mark.cluster  # a fresh Python process
def test_importing_kpca_dask_does_not_import_sklearn():
    """Dask workers import kpca_dask.gram and kpca_dask.kernels: scikit-learn (~2 s, ~100 MB
    per process) comes only with the first use of a class that subclasses its own."""
    code = (
        "import sys, kpca_dask, kpca_dask.gram, kpca_dask.kernels, kpca_dask.exceptions; "
        "assert 'sklearn' not in sys.modules, 'sklearn imported'; "
        "from kpca_dask import ConvergenceWarning, NotFittedError; "
        "import sklearn.exceptions as e; "
        "assert issubclass(ConvergenceWarning, e.ConvergenceWarning); "
        "assert issubclass(NotFittedError, e.NotFittedError)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_transform_leaves_the_estimator_unchanged():
    m = KernelPCA(3, kernel="rbf").fit(X)
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in m.__dict__.items()}
    m.transform(NEW)
    assert m.__dict__.keys() == before.keys()
    for k, v in before.items():
        assert (
            np.array_equal(v, m.__dict__[k])
            if isinstance(v, np.ndarray)
            else v is m.__dict__[k] or v == m.__dict__[k]
        ), k


@pytest.mark.parametrize(
    "bad,msg",
    [
        (np.ones(5), "Reshape your data"),
        (np.ones((4, 2), dtype=complex), "Complex data not supported"),
        (
            np.empty((5, 0)),
            r"0 feature\(s\) \(shape=\(5, 0\)\) while a minimum of 1 is required",
        ),
        (np.ones((1, 3)), "n_samples=1"),
    ],
)
def test_sklearn_wordings(bad, msg):
    with pytest.raises(ValueError, match=msg):
        KernelPCA(1).fit(bad)


def test_object_arrays_of_numbers_are_accepted_others_refused():
    a = KernelPCA(2, kernel="rbf").fit_transform(X.astype(object))
    np.testing.assert_array_equal(a, KernelPCA(2, kernel="rbf").fit_transform(X))
    bad = X.astype(object)
    bad[0, 0] = {"a": 1}
    with pytest.raises(TypeError, match="argument must be a string or a real number"):
        KernelPCA(2).fit(bad)


def test_dataframe_feature_names_and_column_order():
    import pandas as pd  # a core dependency (pyproject.toml)

    cols = [f"f{i}" for i in range(5)]
    df = pd.DataFrame(X, columns=cols)
    m = KernelPCA(2, kernel="rbf").fit(df)
    assert list(m.feature_names_in_) == cols
    np.testing.assert_array_equal(
        m.transform(pd.DataFrame(NEW, columns=cols)),
        KernelPCA(2, kernel="rbf").fit(X).transform(NEW),
    )
    # columns by name: another order gives the same result (scikit-learn refuses it)
    np.testing.assert_array_equal(
        m.transform(pd.DataFrame(NEW, columns=cols)[cols[::-1]]),
        m.transform(pd.DataFrame(NEW, columns=cols)),
    )
    with pytest.raises(InvalidInputError, match="unseen at fit time"):
        m.transform(pd.DataFrame(NEW, columns=[c + "x" for c in cols]))
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        m.transform(NEW)
    with pytest.warns(UserWarning, match="has feature names"):
        KernelPCA(2).fit(X).transform(df)


def test_sklearn_params():
    from kpca_dask.exceptions import KpcaWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KpcaWarning)  # 3 passes may not certify: not the point
        m = KernelPCA(
            2, kernel="rbf", eigen_solver="randomized", iterated_power=3, random_state=0
        ).fit(X)
        same = KernelPCA(
            2, kernel="rbf", eigen_solver="randomized", n_power_iter=3, random_state=0
        ).fit(X)
    assert m.n_passes_ == same.n_passes_  # iterated_power is n_power_iter
    np.testing.assert_array_equal(m.eigenvalues_, same.eigenvalues_)
    with pytest.raises(InvalidParameterError, match="pass only one of them"):
        KernelPCA(2, iterated_power=3, n_power_iter=2).fit(X)
    KernelPCA(2, tol=0, max_iter=None, n_jobs=-1, copy_X=False).fit(X)  # accepted
    with pytest.raises(InvalidParameterError, match="'remove_zero_eig'"):
        KernelPCA(2, remove_zero_eig="yes").fit(X)


def test_arpack_all_components_small_n_only():
    """n_components >= n - 1 (ARPACK cannot) forms Kc and uses eigh, for small n only."""
    Xs = X[:30]
    w_ref, _ = reference(rbf_kernel(Xs, gamma=0.2), 29)
    m = KernelPCA(None, kernel="rbf", eigen_solver="arpack").fit(Xs)
    np.testing.assert_allclose(m.eigenvalues_, w_ref[w_ref > 1e-12 * w_ref[0]], rtol=1e-9)
    from kpca_dask.plan import ARPACK_FORMED_MAX_SAMPLES

    with pytest.raises(InvalidParameterError, match="at most n_samples - 2 components"):
        KernelPCA(None, eigen_solver="arpack").plan(
            np.zeros((ARPACK_FORMED_MAX_SAMPLES + 1, 2))
        )
