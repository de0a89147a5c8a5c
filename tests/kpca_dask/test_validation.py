"""Bad input fails fast with a ValueError that names the problem and the fix."""

import dask.array as da
import numpy as np
import pytest
import zarr

from kpca_dask import InvalidInputError, InvalidParameterError, KernelPCA, NotFittedError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((60, 3))


def fit(X=X, **kw):
    return KernelPCA(**{"n_components": 2, "kernel": "rbf", **kw}).fit(X)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_located(bad):
    Xb = X.copy()
    Xb[45, 1] = bad
    with pytest.raises(
        ValueError, match=r"NaN or infinity \(1 value\(s\); the first in rows 40-59\)"
    ):
        fit(da.from_array(Xb, chunks=(20, -1)))


def test_non_finite_in_a_zarr_array(tmp_path):
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(20, 3), dtype="f8")
    Xb = X.copy()
    Xb[5, 0] = np.nan
    z[...] = Xb
    with pytest.raises(InvalidInputError, match="rows 0-19"):
        fit(z)


@pytest.mark.parametrize(
    "bad,msg",
    [
        (np.ones(10), "2-D array .* Reshape your data with X.reshape"),
        (np.ones((2, 3, 4)), "2-D array"),
        (np.empty((0, 3)), "empty: shape \\(0, 3\\)"),
        (np.empty((5, 0)), "empty: shape \\(5, 0\\)"),
        (np.array([["a", "b"], ["c", "d"]]), "not numeric"),
        (np.ones((4, 2), dtype=complex), "complex"),
        (np.array([[1, 2], [3]], dtype=object), "not numeric"),
    ],
)
def test_bad_shapes_and_dtypes(bad, msg):
    with pytest.raises(ValueError, match=msg):
        fit(bad, n_components=1)


def test_ragged_list_is_refused():
    with pytest.raises(ValueError, match="ragged|numeric"):
        fit([[1.0, 2.0], [3.0]], n_components=1)


def test_integer_data_is_cast_to_float():
    Xi = (X * 10).astype(np.int64)
    a = fit(Xi)
    b = fit(Xi.astype(np.float64))
    np.testing.assert_array_equal(a.eigenvalues_, b.eigenvalues_)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (
            {"n_components": 0},
            "'n_components' parameter of KernelPCA must be an int in the range \\[1, inf\\)",
        ),
        ({"n_components": 2.5}, "'n_components'"),
        ({"n_components": 61}, "n_components=61 must be <= n_samples=60"),
        ({"gamma": 0.0}, "'gamma' parameter of KernelPCA must be a float in the range \\(0"),
        ({"gamma": -1.0}, "'gamma'"),
        ({"gamma": "median"}, "'gamma'"),
        ({"kernel": "chi2"}, "'kernel' parameter of KernelPCA must be one of"),
        ({"eigen_solver": "lobpcg"}, "'eigen_solver'"),
        ({"dtype": "float16"}, "'dtype'"),
        ({"chunk_size": 0}, "'chunk_size'"),
        ({"n_oversamples": -1}, "'n_oversamples'"),
        ({"degree": 0}, "'degree'"),
        ({"kernel_params": {"a": 1}}, "kernel_params is only used with a callable kernel"),
        (
            {"eigen_solver": "randomized", "n_components": None},
            "needs an explicit n_components",
        ),
    ],
)
def test_impossible_parameters(kw, msg):
    with pytest.raises(
        InvalidParameterError if "n_samples" not in msg else InvalidInputError, match=msg
    ):
        fit(**kw)


def test_parameter_errors_come_before_any_pass_over_the_data():
    """Validation happens before the data are read: a NaN is not even noticed."""
    Xb = X.copy()
    Xb[0, 0] = np.nan
    with pytest.raises(InvalidParameterError, match="'gamma'"):
        fit(Xb, gamma=-1.0)


def test_transform_feature_mismatch():
    m = fit()
    with pytest.raises(
        ValueError, match="X has 4 features, but KernelPCA is expecting 3 features as input"
    ):
        m.transform(np.ones((2, 4)))


def test_transform_before_fit():
    for method in ("transform", "score_samples"):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            getattr(KernelPCA(2), method)(X)


def test_transform_refuses_nan():
    m = fit()
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        m.transform(np.array([[0.0, np.nan, 1.0]]))


def test_unknown_dask_chunk_sizes():
    Xd = da.from_array(X, chunks=(20, -1))
    Xd = Xd[Xd[:, 0] > 0]
    with pytest.raises(InvalidInputError, match="compute_chunk_sizes"):
        fit(Xd)


def test_constant_data_has_no_components():
    with pytest.raises(InvalidInputError, match="no positive eigenvalue"):
        fit(np.ones((30, 3)), kernel="linear")


def test_duplicate_rows_reduce_the_rank_with_a_warning():
    """remove_zero_eig=True: the zero components are dropped, with a warning."""
    Xd = np.repeat(X[:3], 10, axis=0)  # rank 2 after centring
    with pytest.warns(Warning, match="Kept 2 of 4"):
        m = fit(Xd, n_components=4, eigen_solver="dense", remove_zero_eig=True)
    assert m.n_components_ == 2
    assert np.all(np.isfinite(m.transform(X)))


def test_duplicate_rows_keep_zero_components_by_default_like_sklearn():
    """remove_zero_eig=False (scikit-learn's default): zero eigenvalues stay as zero columns."""
    Xd = np.repeat(X[:3], 10, axis=0)  # rank 2 after centring
    m = fit(Xd, n_components=4, eigen_solver="dense")
    assert m.n_components_ == 4
    assert np.all(m.eigenvalues_[2:] == 0) and np.all(m.eigenvalues_[:2] > 0)
    emb = m.transform(X)
    assert np.all(np.isfinite(emb)) and np.all(emb[:, 2:] == 0)
    np.testing.assert_allclose(m.fit_transform(Xd)[:, 2:], 0, atol=0)


def test_extreme_gamma_is_finite_or_refused():
    """gamma -> inf makes K ~ I (fine); gamma -> 0 makes Kc ~ 0 (a clear error or finite)."""
    m = fit(gamma=1e6)
    assert np.all(np.isfinite(m.transform(X[:3])))
    try:
        m = fit(gamma=1e-300)
        assert np.all(np.isfinite(m.transform(X[:3])))
    except InvalidInputError as exc:
        assert "no positive eigenvalue" in str(exc)


def test_gamma_scale_median_heuristic():
    """'scale' resolves to 1 / (2 median squared distance) on a sample, stored in gamma_."""
    from scipy.spatial.distance import pdist

    m = fit(gamma="scale")
    assert m.gamma_ == pytest.approx(1.0 / (2 * np.median(pdist(X, "sqeuclidean"))))
    assert m.gamma == "scale"  # the parameter is never overwritten
    assert fit(gamma=None).gamma_ == pytest.approx(1 / 3)
