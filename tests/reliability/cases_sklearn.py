"""Bad input of the scikit-learn contract (issue 13): precomputed kernels, indefinite
matrices, DataFrame columns, too little data. Loaded by catalogue.py (EXTENSIONS)."""

from __future__ import annotations

import numpy as np

from .catalogue import Case
from .helpers import blobs


def _kpca(**kw):
    from kpca_dask import KernelPCA

    return KernelPCA(**kw)


def _gram(n: int = 40, d: int = 3) -> np.ndarray:
    X = blobs(n, d)
    return X @ X.T


def _precomputed_not_square(ctx):
    K = _gram()
    return lambda: _kpca(n_components=2, kernel="precomputed").fit(K[:, :30])


def _precomputed_wrong_columns(ctx):
    K = _gram()
    m = _kpca(n_components=2, kernel="precomputed").fit(K)
    return lambda: m.transform(K[:5, :30])


def _indefinite(ctx):
    # centred, eigenvalues 3, 2, 1, 0 (the ones vector), -2, -3: the top 5 reach -2
    Q = np.linalg.qr(np.random.default_rng(0).normal(size=(6, 6)))[0]
    one = np.ones(6) / np.sqrt(6)
    Q = np.linalg.qr(np.column_stack([one, Q[:, 1:]]))[0][:, 1:]  # orthogonal to 1: centred
    K = Q @ np.diag([3.0, 2.0, 1.0, -2.0, -3.0]) @ Q.T
    return lambda: _kpca(n_components=5, kernel="precomputed", eigen_solver="dense").fit(K)


def _one_sample(ctx):
    return lambda: _kpca(n_components=1).fit(blobs(1, 3))


def _inverse_precomputed(ctx):
    K = _gram()
    return lambda: _kpca(n_components=2, kernel="precomputed", fit_inverse_transform=True).fit(
        K
    )


CASES = [
    Case(
        "est-precomputed-square",
        "estimator",
        "kernel='precomputed' with a non-square matrix",
        _precomputed_not_square,
        ("Precomputed matrix must be a square matrix", "40x30", "n x n kernel matrix"),
    ),
    Case(
        "est-precomputed-columns",
        "estimator",
        "kernel='precomputed': transform with the wrong number of training columns",
        _precomputed_wrong_columns,
        ("X has 30 features, but KernelPCA is expecting 40", "one column per training row"),
    ),
    Case(
        "est-indefinite",
        "estimator",
        "n_components reaches the negative eigenvalues of an indefinite kernel matrix",
        _indefinite,
        (
            "There are significant negative eigenvalues",
            "1 significantly negative, 3 positive",
            "Ask for n_components=3 or fewer",
            "remove_zero_eig=True",
        ),
    ),
    Case(
        "est-one-sample",
        "estimator",
        "a single sample",
        _one_sample,
        ("n_samples=1", "at least 2 samples", "Pass more rows"),
    ),
    Case(
        "est-precomputed-inverse",
        "estimator",
        "fit_inverse_transform with kernel='precomputed'",
        _inverse_precomputed,
        ("Cannot fit_inverse_transform with a precomputed kernel", "named kernel"),
    ),
]
