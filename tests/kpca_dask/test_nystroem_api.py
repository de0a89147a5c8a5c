"""The Nyström solver behind the same estimator contract: validation, save/load, sklearn."""

import json
import subprocess
import sys

import dask.array as da
import numpy as np
import pytest
import zarr
from sklearn.base import clone
from sklearn.datasets import make_circles
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import check_fit_check_is_fitted, check_transformer_general

import kpca_dask
from kpca_dask import (
    DroppedComponentsWarning,
    InvalidInputError,
    InvalidParameterError,
    KernelPCA,
    ModelFormatError,
    NotFittedError,
)

RNG = np.random.default_rng(0)
X = RNG.standard_normal((600, 4))
NEW = RNG.standard_normal((25, 4))


def nys(**kw):
    params = dict(
        n_components=3,
        kernel="rbf",
        gamma=0.3,
        eigen_solver="nystroem",
        n_landmarks=80,
        random_state=0,
    )
    params.update(kw)
    return KernelPCA(**params)


# -------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_values_are_located(bad):
    Xb = X.copy()
    Xb[455, 1] = bad
    with pytest.raises(
        InvalidInputError,
        match=r"NaN or infinity \(1 value\(s\); the first in "
        r"rows 400-599\)",
    ):
        nys().fit(da.from_array(Xb, chunks=(200, -1)))


@pytest.mark.parametrize(
    "bad,msg",
    [
        (np.ones(10), "2-D array .* Reshape your data with X.reshape"),
        (np.empty((0, 3)), "empty: shape \\(0, 3\\)"),
        (np.array([["a", "b"], ["c", "d"]]), "not numeric"),
        (np.ones((4, 2), dtype=complex), "complex"),
    ],
)
def test_bad_shapes_and_dtypes(bad, msg):
    with pytest.raises(ValueError, match=msg):
        nys(n_components=1).fit(bad)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (
            {"n_landmarks": 0},
            "'n_landmarks' parameter of KernelPCA must be an int in the range "
            "\\[1, inf\\) or None",
        ),
        ({"n_landmarks": 2.5}, "'n_landmarks'"),
        (
            {"landmark_method": "random"},
            "'landmark_method' parameter of KernelPCA must be one of",
        ),
        ({"landmark_sample_size": 0}, "'landmark_sample_size'"),
        ({"nystroem_method": "svd"}, "'nystroem_method'"),
        ({"n_components": 81}, "n_components=81 must be <= n_landmarks=80"),
        (
            {"n_components": None, "nystroem_method": "randomized"},
            "needs an explicit n_components",
        ),
    ],
)
def test_impossible_parameters(kw, msg):
    with pytest.raises(InvalidParameterError, match=msg):
        nys(**kw).fit(X)


def test_parameter_errors_come_before_any_pass_over_the_data():
    Xb = X.copy()
    Xb[0, 0] = np.nan
    with pytest.raises(InvalidParameterError, match="n_landmarks"):
        nys(n_components=100).fit(Xb)


def test_exact_kernel_inputs_are_refused():
    with pytest.raises(InvalidParameterError, match="never uses it"):
        nys(chunk_size=100).fit(X, centring=(np.zeros(600), 0.0))


def test_transform_feature_mismatch_and_nan():
    m = nys().fit(X)
    with pytest.raises(
        ValueError, match="X has 5 features, but KernelPCA is expecting 4 features as input"
    ):
        m.transform(np.ones((2, 5)))
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        m.score_samples(np.array([[0.0, np.nan, 1.0, 2.0]]))


def test_not_fitted():
    for method in ("transform", "score_samples"):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            getattr(nys(), method)(X)


def test_constant_data_has_no_components():
    with pytest.raises(InvalidInputError, match="no positive eigenvalue"):
        nys(kernel="linear").fit(np.ones((200, 3)))


def test_rank_deficient_features_warn_and_drop():
    """Duplicate rows: the features have rank 3, so 2 of 5 components are dropped."""
    Xd = np.repeat(X[:4], 50, axis=0)  # 4 distinct rows: centred rank 3
    with pytest.warns(DroppedComponentsWarning, match="Kept 3 of 5"):
        m = nys(
            n_components=5, n_landmarks=20, landmark_method="uniform", remove_zero_eig=True
        ).fit(Xd)
    assert m.n_components_ == 3
    assert np.all(np.isfinite(m.transform(X)))


def test_refit_with_another_solver_leaves_no_nystroem_state():
    m = nys().fit(X)
    assert hasattr(m, "projection_")
    m.set_params(eigen_solver="dense").fit(X)
    assert not hasattr(m, "projection_") and m.X_fit_.shape == X.shape


# ------------------------------------------------------------ persistence
@pytest.fixture
def model():
    return nys(gamma="scale", nystroem_method="randomized").fit(X)


def test_round_trip_transforms_identically(model, tmp_path):
    path = tmp_path / "model.zarr"
    model.save(path)
    loaded = kpca_dask.load(path)
    np.testing.assert_array_equal(loaded.transform(NEW), model.transform(NEW))
    np.testing.assert_array_equal(loaded.score_samples(NEW), model.score_samples(NEW))
    assert loaded.get_params() == model.get_params()
    for attr in (
        "eigenvalues_",
        "eigenvectors_",
        "projection_",
        "offset_",
        "row_means_",
        "landmark_indices_",
        "mean_weights_",
        "explained_variance_ratio_",
    ):
        np.testing.assert_array_equal(getattr(loaded, attr), getattr(model, attr))
    assert loaded.eigen_solver_ == "nystroem" and loaded.n_landmarks_ == 80
    assert loaded.n_samples_fit_ == 600


def test_saved_model_holds_landmarks_not_data(model, tmp_path):
    """Only m-sized arrays are stored: no X_fit, no n x k eigenvectors, plain JSON attrs."""
    path = tmp_path / "model.zarr"
    model.save(path)
    root = zarr.open_group(str(path), mode="r")
    attrs = dict(root.attrs)
    json.dumps(attrs)
    assert attrs["model_kind"] == "nystroem"
    names = {name for name, _ in root.arrays()}
    assert names == {
        "eigenvalues",
        "explained_variance_ratio",
        "residuals",
        "landmarks",
        "landmark_indices",
        "projection",
        "offset",
        "landmark_means",
        "mean_weights",
        "kernel_center",  # (d,): the rbf kernel's centre (issue 29)
    }
    for _, arr in root.arrays():
        assert 600 not in arr.shape
        assert arr.dtype.kind in "fi"


@pytest.mark.cluster  # a fresh Python process
def test_round_trip_in_a_fresh_process(model, tmp_path):
    path = tmp_path / "model.zarr"
    model.save(path)
    np.save(tmp_path / "new.npy", NEW)
    code = (
        "import numpy as np, kpca_dask, sys; m = kpca_dask.load(sys.argv[1]); "
        "np.save(sys.argv[2], m.transform(np.load(sys.argv[3])))"
    )
    subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(path),
            str(tmp_path / "out.npy"),
            str(tmp_path / "new.npy"),
        ],
        check=True,
    )
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), model.transform(NEW))


def test_tampered_or_inconsistent_store_is_refused(model, tmp_path):
    path = tmp_path / "model.zarr"
    model.save(path)
    z = zarr.open_array(str(path / "projection"), mode="r+")
    z[0, 0] = z[0, 0] + 1.0
    with pytest.raises(ModelFormatError, match="checksum mismatch for 'projection'"):
        kpca_dask.load(path)
    model.save(path, overwrite=True)
    g = zarr.open_group(str(path), mode="r+")
    g.attrs["arrays"] = [a for a in g.attrs["arrays"] if a != "offset"]
    with pytest.raises(ModelFormatError, match="attribute checksum mismatch"):
        kpca_dask.load(path)
    from kpca_dask.persistence import attrs_sha256

    g.attrs["attrs_sha256"] = attrs_sha256(dict(g.attrs))  # a forger who re-seals them
    with pytest.raises(ModelFormatError, match="lacks the arrays \\['offset'\\]"):
        kpca_dask.load(path)


def test_exact_models_still_save_their_training_rows(tmp_path):
    m = KernelPCA(2, kernel="rbf", eigen_solver="dense").fit(X)
    m.save(tmp_path / "e.zarr")
    root = zarr.open_group(str(tmp_path / "e.zarr"), mode="r")
    assert root.attrs["model_kind"] == "exact"
    assert "X_fit" in {name for name, _ in root.arrays()}
    np.testing.assert_array_equal(
        kpca_dask.load(tmp_path / "e.zarr").transform(NEW), m.transform(NEW)
    )


# ---------------------------------------------------------- sklearn contract
@pytest.mark.parametrize("check", [check_transformer_general, check_fit_check_is_fitted])
def test_sklearn_estimator_checks(check):
    check(
        "KernelPCA",
        KernelPCA(2, kernel="rbf", eigen_solver="nystroem", n_landmarks=10, random_state=0),
    )


def test_clone_and_grid_search_over_landmarks():
    Xc, y = make_circles(300, factor=0.3, noise=0.05, random_state=0)
    pipe = make_pipeline(
        KernelPCA(2, kernel="rbf", gamma=5.0, eigen_solver="nystroem", random_state=0),
        LogisticRegression(),
    )
    c = clone(pipe)
    assert c.get_params()["kernelpca__landmark_method"] == "rpcholesky"
    search = GridSearchCV(pipe, {"kernelpca__n_landmarks": [3, 60]}, cv=3).fit(Xc, y)
    assert search.best_params_["kernelpca__n_landmarks"] == 60
    assert search.best_score_ > 0.95
