"""Exact updates of Nyström models (kpca_dask.update, docs/update.md).

A model that keeps its sufficient statistics takes new rows exactly: one or several
``partial_fit`` batches give the model of a fit on the union with the same landmarks.
Checked against the solver's own fit on the union (same landmarks), an independent dense
computation (explicit Nyström features, scipy's eigh) and scikit-learn's PCA of the same
features.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.linalg
from sklearn.decomposition import PCA

from kpca_dask import KernelPCA, load
from kpca_dask.exceptions import NotUpdatableError
from kpca_dask.kernels import make_kernel
from kpca_dask.solvers.nystroem import nystroem_basis, nystroem_eigh

from ..conftest import align_signs

K = 5
M = 60


def _data(n, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    centres = np.array([[0, 0, 0, 0], [3, 0, 1, 0], [0, 3, 0, 1]], dtype=float)
    lab = rng.integers(0, 3, n)
    return centres[lab] + shift + rng.normal(scale=0.7, size=(n, 4))


def _model(**kw):
    params = dict(
        n_components=K,
        kernel="rbf",
        gamma=0.2,
        eigen_solver="nystroem",
        n_landmarks=M,
        landmark_method="uniform",
        random_state=0,
        chunk_size=97,
    )
    params.update(kw)
    return KernelPCA(**params)


def _union_fit(est, X):
    """The solver's own fit on all rows ``X`` with the model's landmarks and shift."""
    kern = make_kernel("rbf", gamma=est.gamma_)
    basis = nystroem_basis(est.landmarks_, kern, np.float64, shift=est.statistics_.shift)
    Xd = da.from_array(X, chunks=(113, -1))
    return basis, nystroem_eigh(Xd, basis, K, method="covariance")


def _dense_reference(est, X):
    """Independent: explicit Nyström features of every row, centred, scipy's eigh."""
    Z = est.landmarks_
    sq = lambda A, B: ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)  # noqa: E731
    W = np.exp(-est.gamma_ * sq(Z, Z))
    S, U = scipy.linalg.eigh(W)
    keep = S > S.max() * 1e-12
    T = U[:, keep] / np.sqrt(S[keep])
    F = np.exp(-est.gamma_ * sq(X, Z)) @ T
    Fc = F - F.mean(axis=0)
    lam, P = scipy.linalg.eigh(Fc.T @ Fc)
    lam, P = lam[::-1][:K], P[:, ::-1][:, :K]
    return lam, Fc @ P, F


@pytest.mark.parametrize("batches", [1, 3])
def test_update_equals_fit_on_union_with_same_landmarks(batches):
    X0 = _data(700, 0)
    new = [_data(150 + 40 * b, 10 + b) for b in range(batches)]
    est = _model().fit(X0)
    assert est.statistics_ is not None and est.statistics_.n_rows == 700
    for Xb in new:
        est.partial_fit(Xb)
    U = np.vstack([X0, *new])
    assert est.n_samples_fit_ == U.shape[0]

    basis, ref = _union_fit(est, U)
    rel = np.abs(est.eigenvalues_ - ref.eigenvalues) / ref.eigenvalues
    assert rel.max() < 1e-10
    kern = make_kernel("rbf", gamma=est.gamma_)
    ref_emb = np.asarray(kern(U, est.landmarks_)) @ ref.projection - ref.offset
    emb = est.transform(U)
    scale = np.abs(ref_emb).max()
    assert np.abs(emb - ref_emb).max() < 1e-8 * scale

    # independent: dense features and scipy's eigh; and scikit-learn's PCA of them
    lam, dense_emb, F = _dense_reference(est, U)
    assert np.abs(est.eigenvalues_ - lam).max() / lam.max() < 1e-9
    assert np.abs(align_signs(emb, dense_emb) - dense_emb).max() < 1e-7 * scale
    pca = PCA(K, svd_solver="full").fit(F)
    assert np.allclose(pca.explained_variance_ * (U.shape[0] - 1), est.eigenvalues_, rtol=1e-9)


def test_update_keeps_the_models_scaling():
    """A model with preprocess="standard" scales new rows with its own (first) scaler: the
    update equals a fit on the union, scaled that way, with the same landmarks."""
    X0, X1 = _data(500, 7) * [1, 10, 100, 1], _data(200, 8) * [1, 10, 100, 1]
    est = _model(preprocess="standard").fit(X0)
    centre = est.preprocess_.center.copy()
    est.partial_fit(X1)
    np.testing.assert_array_equal(est.preprocess_.center, centre)
    U = est.preprocess_.transform(np.vstack([X0, X1]))
    basis, ref = _union_fit(est, U)
    assert np.max(np.abs(est.eigenvalues_ - ref.eigenvalues) / ref.eigenvalues) < 1e-10


def test_update_survives_save_and_load(tmp_path):
    X0, X1 = _data(500, 1), _data(200, 2)
    est = _model().fit(X0)
    est.save(tmp_path / "m")
    loaded = load(tmp_path / "m")
    assert loaded.statistics_.n_rows == 500
    np.testing.assert_array_equal(loaded.statistics_.cross, est.statistics_.cross)
    loaded.partial_fit(X1)
    est.partial_fit(X1)
    np.testing.assert_allclose(loaded.eigenvalues_, est.eigenvalues_, rtol=1e-12)
    loaded.save(tmp_path / "m2")
    again = load(tmp_path / "m2")
    assert again.statistics_.n_rows == 700
    np.testing.assert_allclose(again.transform(X1), est.transform(X1), rtol=0, atol=1e-12)


def test_update_on_a_dask_cluster(dask_client):
    X0, X1 = _data(600, 3), _data(300, 4)
    est = _model().fit(da.from_array(X0, chunks=(150, -1)))
    est.partial_fit(da.from_array(X1, chunks=(100, -1)))
    basis, ref = _union_fit(est, np.vstack([X0, X1]))
    rel = np.abs(est.eigenvalues_ - ref.eigenvalues) / ref.eigenvalues
    assert rel.max() < 1e-10


def test_randomized_fit_keeps_statistics_only_when_asked():
    X = _data(600, 5)
    auto = _model(nystroem_method="randomized").fit(X)
    assert auto.statistics_ is None
    with pytest.raises(NotUpdatableError, match="keeps no sufficient statistics"):
        auto.partial_fit(X[:50])
    kept = _model(nystroem_method="randomized", keep_statistics=True).fit(X)
    assert kept.statistics_ is not None and kept.statistics_.n_rows == 600
    off = _model(keep_statistics=False).fit(X)
    assert off.statistics_ is None


def test_an_updated_randomized_model_carries_no_stale_certificate():
    """A randomized Nyström fit that kept its statistics has a certificate for its own
    pairs; ``partial_fit`` replaces them by the covariance solve of the merged statistics,
    so the merged model's ``solver_info_`` says so: no certificate, block sizes or passes
    of the old solve (a reader would take them for the new pairs'), the landmarks' entries
    kept, and eigenvalues those of the union's covariance solve."""
    X = _data(900, 6)
    m = _model(nystroem_method="randomized", keep_statistics=True).fit(X[:500])
    before = dict(m.solver_info_)
    assert before["certificate"] and m.nystroem_method_ == "randomized"
    m.partial_fit(X[500:])
    info = m.solver_info_
    assert "certificate" not in info and "block_columns" not in info, sorted(info)
    assert info["method"] == "covariance" and info["update"] == {"n_rows": 900}
    assert info["landmarks"] == before["landmarks"]
    _, ref = _union_fit(m, X)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues, rtol=1e-10)


def test_update_refuses_what_it_cannot_do_exactly():
    X = _data(300, 6)
    exact = KernelPCA(3, kernel="rbf", gamma=0.2, eigen_solver="dense").fit(X)
    with pytest.raises(NotUpdatableError, match="only Nyström models update"):
        exact.partial_fit(X[:20])
    est = _model().fit(X)
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(X[:20, :3])
    bad = X[:20].copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.partial_fit(bad)
    assert est.n_samples_fit_ == 300  # nothing changed
