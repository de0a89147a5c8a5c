"""Columns by name (issue 15): the estimator records the feature names it was fitted on,
selects a DataFrame's columns by name in any order, refuses missing and unknown columns in
one line naming them, and keeps the names through save/load."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.decomposition import KernelPCA as SkKernelPCA

from kpca_dask import KernelPCA, load
from kpca_dask.exceptions import InvalidInputError, InvalidParameterError

COLS = ["alpha", "beta", "gamma", "delta", "eps"]


def _data(n=80, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, len(COLS))) * np.array([1.0, 2.0, 0.5, 3.0, 1.5])


@pytest.fixture(scope="module")
def fitted():
    df = pd.DataFrame(_data(), columns=COLS)
    return KernelPCA(3, kernel="rbf", gamma=0.1).fit(df), df


def test_names_recorded_as_sklearn(fitted):
    m, df = fitted
    sk = SkKernelPCA(3, kernel="rbf", gamma=0.1).fit(df)
    assert list(m.feature_names_in_) == list(sk.feature_names_in_) == COLS
    assert m.n_features_in_ == sk.n_features_in_ == len(COLS)
    assert m.features_ == {"names": COLS, "dtypes": ["float64"] * len(COLS)}


def test_reordered_columns_give_the_same_embedding(fitted):
    m, _ = fitted
    new = pd.DataFrame(_data(30, seed=1), columns=COLS)
    ref = m.transform(new)
    shuffled = new[["delta", "alpha", "eps", "gamma", "beta"]]
    np.testing.assert_allclose(m.transform(shuffled), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.score_samples(shuffled), m.score_samples(new), atol=1e-12)
    # and against scikit-learn, given the columns in its (fitted) order
    sk = SkKernelPCA(3, kernel="rbf", gamma=0.1).fit(pd.DataFrame(_data(), columns=COLS))
    got, want = m.transform(shuffled), sk.transform(new)
    np.testing.assert_allclose(np.abs(got), np.abs(want), atol=1e-8)


def test_missing_and_extra_columns_are_named(fitted):
    m, _ = fitted
    new = pd.DataFrame(_data(30, seed=1), columns=COLS)
    with pytest.raises(InvalidInputError) as e:
        m.transform(new.drop(columns=["gamma"]))
    msg = str(e.value)
    assert "yet now missing: ['gamma']" in msg and "\n" not in msg
    assert "add the missing ones" in msg.lower()
    with pytest.raises(InvalidInputError) as e:
        m.transform(new.assign(zeta=1.0))
    msg = str(e.value)
    assert "unseen at fit time: ['zeta']" in msg and "\n" not in msg
    assert "drop the columns the model does not know" in msg.lower()
    with pytest.raises(InvalidInputError, match="unseen at fit time: \\['zeta'\\].*missing"):
        m.transform(new.rename(columns={"beta": "zeta"}))


def test_ndarray_and_dataframe_mixed_warn_as_sklearn(fitted):
    m, df = fitted
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        m.transform(df.to_numpy())
    plain = KernelPCA(3, kernel="rbf", gamma=0.1).fit(df.to_numpy())
    assert not hasattr(plain, "feature_names_in_") and not hasattr(plain, "features_")
    with pytest.warns(UserWarning, match="fitted without feature names"):
        out = plain.transform(df)
    # by position then, as scikit-learn
    np.testing.assert_allclose(out, plain.transform(df.to_numpy()), atol=0)


def test_nan_error_names_the_column():
    df = pd.DataFrame(_data(), columns=COLS)
    df.loc[7, "delta"] = np.nan
    with pytest.raises(InvalidInputError, match=r"rows 0-79\) in column 'delta'\. Remove"):
        KernelPCA(2).fit(df)
    X = df.to_numpy()
    with pytest.raises(InvalidInputError, match=r"in column 3\. Remove"):
        KernelPCA(2).fit(X)


def test_names_saved_and_loaded(fitted, tmp_path):
    m, _ = fitted
    m.save(tmp_path / "m")
    back = load(tmp_path / "m")
    assert list(back.feature_names_in_) == COLS and back.features_ == m.features_
    new = pd.DataFrame(_data(10, seed=2), columns=COLS)
    np.testing.assert_array_equal(back.transform(new[COLS[::-1]]), m.transform(new))
    attrs = json.loads((tmp_path / "m" / "zarr.json").read_text())["attributes"]
    assert attrs["extra"]["features"]["names"] == COLS


def test_model_without_names_loads_without_names(tmp_path):
    m = KernelPCA(2, kernel="rbf", gamma=0.2).fit(_data())
    m.save(tmp_path / "m")
    attrs = json.loads((tmp_path / "m" / "zarr.json").read_text())["attributes"]
    assert "features" not in attrs["extra"]  # the layout of models saved before names
    back = load(tmp_path / "m")
    assert not hasattr(back, "feature_names_in_")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(back.transform(_data(5, 3)), m.transform(_data(5, 3)))


def test_record_features(tmp_path):
    m = KernelPCA(2, kernel="rbf", gamma=0.2).fit(_data())
    m.record_features(COLS, dtypes=["float64"] * 4 + ["bool"], id_column="id")
    assert m.features_["id_column"] == "id" and m.features_["dtypes"][-1] == "bool"
    new = pd.DataFrame(_data(6, seed=4), columns=COLS)
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        plain = m.transform(new.to_numpy())
    np.testing.assert_array_equal(m.transform(new[COLS[::-1]]), plain)
    m.save(tmp_path / "m")
    assert load(tmp_path / "m").features_ == m.features_
    with pytest.raises(InvalidParameterError, match="got 2 names for a model of 5"):
        m.record_features(["a", "b"])
    with pytest.raises(InvalidParameterError, match="names given twice"):
        m.record_features(["a", "a", "b", "c", "d"])
