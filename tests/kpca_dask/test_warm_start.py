"""Warm-started exact refits (``fit(X, v0=...)``, kpca_dask.update.warm_start_vectors).

An exact model takes new rows by a refit on every row; starting the randomized solver
from the old eigenvectors (extended to the new rows by the Nyström extension) must give
the cold fit's result, to the solver's certified tolerance, in fewer passes. Checked
against dense ``scipy.linalg.eigh`` of the centred kernel matrix of the union, on
clustered data (a flat tail after the cluster eigenvalues, as in the field), on standard
normal rows, and with a scaling refitted on the union. A bad start (vectors from the
bottom of the spectrum) must still give the right answer: the stopping rule does not
trust the start.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from sklearn.datasets import make_blobs

from kpca_dask import KernelPCA
from kpca_dask.exceptions import InvalidInputError, InvalidParameterError, NotUpdatableError
from kpca_dask.kernels import make_kernel
from kpca_dask.update import warm_start_vectors

K = 12


def _clustered(n, seed):
    return make_blobs(n, n_features=8, centers=6, cluster_std=1.5, random_state=seed)[0]


def _gaussian(n, seed):
    return np.random.default_rng(seed).standard_normal((n, 8))


def _estimator(**kw):
    params = dict(
        n_components=K,
        kernel="rbf",
        gamma=1 / 8,
        eigen_solver="randomized",
        random_state=0,
        chunk_size=500,
    )
    params.update(kw)
    return KernelPCA(**params)


def _reference(est, X):
    """Independent: the centred kernel matrix of the fitted rows, scipy's dense eigh."""
    Xs = X if est.preprocess_ is None else est.preprocess_.transform(X)
    Kx = make_kernel("rbf", gamma=est.gamma_)(Xs, Xs)
    n = Kx.shape[0]
    J = np.eye(n) - 1.0 / n
    w, V = scipy.linalg.eigh(J @ Kx @ J)
    return w[::-1][:K], V[:, ::-1][:, :K]


def _check_certified(est, ref):
    """Every eigenvalue within its certified bound (plus rounding) of the reference."""
    cert = est.solver_info_["certificate"]
    bound = np.asarray(cert["eigenvalue_bounds"])[:K] + 1e-10 * ref[0]
    assert est.converged_
    np.testing.assert_array_less(np.abs(est.eigenvalues_ - ref), bound)


@pytest.mark.parametrize(
    "data, kw",
    [
        (_clustered, {}),
        (_gaussian, {}),
        (_clustered, {"preprocess": "standard"}),
    ],
    ids=["clustered", "gaussian", "clustered-scaled"],
)
def test_warm_refit_matches_cold_in_fewer_passes(data, kw):
    # a nightly batch: 1.5 % more rows from the same distribution (at 10 % the flat
    # tail's eigenvalues set the pass count warm or cold: docs/update.md)
    X = data(2030, 1)
    X_old, X_new = X[:2000], X[2000:]
    old = _estimator(**kw).fit(X_old)
    v0 = warm_start_vectors(old, X_new)
    assert v0.shape == (2030, K)

    cold = _estimator(**kw).fit(X)
    warm = _estimator(**kw).fit(X, v0=v0)
    ref, Vref = _reference(warm, X)
    _check_certified(cold, ref)
    _check_certified(warm, ref)
    assert warm.solver_info_["warm_start"] == K
    assert warm.n_passes_ < cold.n_passes_, (warm.n_passes_, cold.n_passes_)
    # the leading (gapped) components: the same vectors as the dense reference's
    top = 3
    cos = np.abs(np.sum(warm.eigenvectors_[:, :top] * Vref[:, :top], axis=0))
    np.testing.assert_allclose(cos, 1.0, atol=1e-6)


def test_exact_eigenvectors_certify_in_one_pass_and_the_check():
    X = _clustered(1500, 2)
    est = _estimator().fit(X)
    ref, Vref = _reference(est, X)
    warm = _estimator().fit(X, v0=Vref)
    assert warm.converged_
    # one pass certifies the start, one more is the certification pass
    assert warm.n_passes_ == 2
    # exact, flat tail included (a cold start certifies the tail to 1 % only)
    np.testing.assert_allclose(warm.eigenvalues_, ref, rtol=1e-10)


def test_a_bad_start_still_gives_the_right_answer():
    """Vectors from the bottom of the spectrum: no help, but no harm to the result."""
    X = _clustered(1500, 3)
    n = X.shape[0]
    Kx = make_kernel("rbf", gamma=1 / 8)(X, X)
    J = np.eye(n) - 1.0 / n
    w, V = scipy.linalg.eigh(J @ Kx @ J)
    bottom = V[:, :K]  # the smallest eigenvalues' vectors
    est = _estimator().fit(X, v0=bottom)
    _check_certified(est, w[::-1][:K])


def test_v0_is_checked():
    X = _gaussian(300, 0)
    with pytest.raises(InvalidInputError, match=r"one row per row of X"):
        _estimator().fit(X, v0=np.ones((299, 3)))
    bad = np.ones((300, 2))
    bad[5, 1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        _estimator().fit(X, v0=bad)
    with pytest.raises(InvalidParameterError, match="Nyström"):
        _estimator(eigen_solver="nystroem", n_landmarks=50).fit(X, v0=np.ones((300, 2)))
    dense = _estimator(eigen_solver="dense").fit(X, v0=np.ones((300, 2)))
    assert dense.solver_info_["warm_start"] == "not used by the dense solver"


def test_dependent_start_columns_are_dropped():
    """Zero and repeated columns (a model with dropped components) do not break the QR."""
    X = _gaussian(800, 4)
    v = np.random.default_rng(0).standard_normal((800, 1))
    v0 = np.hstack([v, v, np.zeros((800, 1))])
    est = _estimator().fit(X, v0=v0)
    assert est.solver_info_["warm_start"] == 1
    assert est.converged_


def test_warm_start_vectors_refuses_nystroem_models():
    X = _gaussian(400, 5)
    nys = _estimator(eigen_solver="nystroem", n_landmarks=60).fit(X)
    with pytest.raises(NotUpdatableError, match="updates exactly"):
        warm_start_vectors(nys, X[:10])
