"""A kernel whose diagonal is zero (scikit-learn's ``additive_chi2``: ``k(x, x) = 0``)
gives randomly pivoted Cholesky nothing to sample. Issue 36: it chose no landmark, and
the fit then called the kernel on an empty block (scikit-learn's "Found array with 0
sample(s)"). Now the landmarks are chosen by kmeans++, with one warning line saying so."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.decomposition import KernelPCA as SkKernelPCA
from sklearn.metrics.pairwise import additive_chi2_kernel, pairwise_kernels

from kpca_dask import KernelPCA
from kpca_dask.exceptions import KpcaWarning

X = np.random.default_rng(0).random((300, 4))  # additive_chi2 needs non-negative rows


def _via_pairwise(A, B=None):
    return pairwise_kernels(A, B, metric="additive_chi2")


@pytest.mark.parametrize("kernel", [additive_chi2_kernel, _via_pairwise])
def test_zero_diagonal_kernel_falls_back_to_kmeanspp(kernel):
    kw = {"eigen_solver": "nystroem", "n_landmarks": 120, "random_state": 0}
    with pytest.warns(KpcaWarning) as rec:
        m = KernelPCA(3, kernel=kernel, landmark_method="rpcholesky", **kw).fit(X)
    assert len(rec) == 1 and "\n" not in str(rec[0].message)
    assert type(rec[0].message).__name__ == "LandmarkMethodWarning"
    assert "positive diagonal" in str(rec[0].message) and "'kmeans++'" in str(rec[0].message)
    info = m.solver_info_["landmarks"]
    assert info["method"] == "kmeans++" and info["requested_method"] == "rpcholesky"
    assert m.n_landmarks_ == 120
    # exactly what kmeans++ landmarks give, asked for directly
    with warnings.catch_warnings():
        warnings.simplefilter("error", KpcaWarning)
        ref = KernelPCA(3, kernel=kernel, landmark_method="kmeans++", **kw).fit(X)
    np.testing.assert_array_equal(m.landmark_indices_, ref.landmark_indices_)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-12)
    # and close to scikit-learn's exact kernel PCA of the same kernel matrix
    sk = SkKernelPCA(3, kernel="precomputed", eigen_solver="dense").fit(additive_chi2_kernel(X))
    np.testing.assert_allclose(m.eigenvalues_, sk.eigenvalues_, rtol=0.05)
    emb = m.transform(X[:20])
    assert emb.shape == (20, 3) and np.all(np.isfinite(emb))


def test_positive_diagonal_kernel_keeps_rpcholesky():
    with warnings.catch_warnings():
        warnings.simplefilter("error", KpcaWarning)
        m = KernelPCA(
            3,
            kernel="rbf",
            gamma=1.0,
            eigen_solver="nystroem",
            n_landmarks=60,
            landmark_method="rpcholesky",
            random_state=0,
        ).fit(X)
    assert m.solver_info_["landmarks"]["method"] == "rpcholesky"
