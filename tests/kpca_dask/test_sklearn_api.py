"""The scikit-learn estimator contract: params, clone, Pipeline, GridSearchCV."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_circles
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import check_fit_check_is_fitted, check_transformer_general

from kpca_dask import KernelPCA

X, y = make_circles(300, factor=0.3, noise=0.05, random_state=0)


def test_get_set_params_and_clone():
    m = KernelPCA(3, kernel="rbf", gamma=0.5, random_state=1)
    assert m.get_params()["gamma"] == 0.5
    m.set_params(gamma=2.0, n_components=2)
    c = clone(m)
    assert c.get_params() == m.get_params()
    assert not hasattr(c, "eigenvalues_")


def test_feature_names_out():
    m = KernelPCA(2, kernel="rbf").fit(X)
    assert list(m.get_feature_names_out()) == ["kernelpca0", "kernelpca1"]


def test_pipeline_and_grid_search():
    """Kernel PCA features make circles linearly separable; GridSearchCV picks gamma."""
    pipe = make_pipeline(KernelPCA(2, kernel="rbf"), LogisticRegression())
    search = GridSearchCV(pipe, {"kernelpca__gamma": [0.01, 5.0]}, cv=3).fit(X, y)
    assert search.best_params_["kernelpca__gamma"] == 5.0
    assert search.best_score_ > 0.95


@pytest.mark.parametrize("check", [check_transformer_general, check_fit_check_is_fitted])
def test_sklearn_estimator_checks(check):
    check("KernelPCA", KernelPCA(2, kernel="rbf"))


def test_fit_transform_equals_fit_then_transform():
    m = KernelPCA(2, kernel="rbf", gamma=2.0)
    emb = m.fit_transform(X)
    np.testing.assert_allclose(m.transform(X), emb, atol=1e-8)
