"""Nyström with every row a landmark is exact kernel PCA, down to which components
``n_components=None`` keeps (issue 36: it kept 99 where the exact solver and scikit-learn
keep 116 -- W was cut relative to its uncentred top, and Sigma formed from cross products
turned the tail into rounding noise -- so ``score_samples`` differed by up to 50 % on an
outlier). Checked against scikit-learn's KernelPCA(eigen_solver="dense")."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import KernelPCA as SkKernelPCA
from sklearn.metrics.pairwise import rbf_kernel

from kpca_dask import KernelPCA


def _reference_scores(sk, X, Y, gamma):
    """Reconstruction error in feature space from scikit-learn's model: ``||phi_c(y)||^2``
    minus the squared embedding (Hoffmann 2007), every term from sklearn or by hand."""
    Kxx = rbf_kernel(X, gamma=gamma)
    Kyx = rbf_kernel(Y, X, gamma=gamma)
    norm = 1.0 - 2.0 * Kyx.mean(axis=1) + Kxx.mean()
    return norm - (sk.transform(Y) ** 2).sum(axis=1)


@pytest.mark.parametrize(("n", "d", "gamma"), [(300, 2, 0.1), (400, 2, 1.0)])
def test_every_row_a_landmark_keeps_the_exact_components(n, d, gamma):
    X = np.random.default_rng(0).standard_normal((n, d))
    Y = np.vstack([X[:3], np.full((1, d), 3.0), np.full((1, d), -2.5)])  # two outliers
    sk = SkKernelPCA(None, kernel="rbf", gamma=gamma, eigen_solver="dense").fit(X)
    ny = KernelPCA(None, kernel="rbf", gamma=gamma, eigen_solver="nystroem", n_landmarks=n).fit(
        X
    )
    ex = KernelPCA(None, kernel="rbf", gamma=gamma, eigen_solver="dense").fit(X)
    assert ny.solver_info_["landmarks"]["method"] == "all"
    assert ny.n_components_ == ex.n_components_ == sk.eigenvalues_.size
    lead = sk.eigenvalues_[:20]
    np.testing.assert_allclose(ny.eigenvalues_[:20], lead, rtol=1e-9)
    ref = _reference_scores(sk, X, Y, gamma)
    got = np.asarray(ny.score_samples(Y))
    # the outliers' scores are O(1); the training rows' near 0: absolute, vs k(x, x) = 1
    np.testing.assert_allclose(got, ref, atol=1e-3)
    np.testing.assert_allclose(got[3:], ref[3:], rtol=1e-2)  # before: up to 50 % off
