"""The exact solvers against scikit-learn's KernelPCA (dense), data set by kernel."""

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.decomposition import KernelPCA as SkKernelPCA
from sklearn.metrics.pairwise import laplacian_kernel

from kpca_dask import KernelPCA
from tests.conftest import _datasets

TRAIN = _datasets(300, seed=0)
NEW = _datasets(40, seed=1)

KERNELS = {
    "linear": {},
    "poly": {"gamma": 0.05, "degree": 3, "coef0": 1.0},
    "rbf": {"gamma": 0.5},
    "laplacian": {"gamma": 0.3},
    "sigmoid": {"gamma": 1.0, "coef0": -0.5},
    "cosine": {},
}


def _reference(name, X, new, kernel, params, k):
    """scikit-learn's dense KernelPCA; laplacian through a precomputed kernel."""
    if kernel == "laplacian":
        g = params["gamma"]
        sk = SkKernelPCA(k, kernel="precomputed", eigen_solver="dense").fit(
            laplacian_kernel(X, gamma=g)
        )
        return (
            sk.eigenvalues_,
            sk.transform(laplacian_kernel(X, gamma=g)),
            sk.transform(laplacian_kernel(new, X, gamma=g)),
        )
    sk = SkKernelPCA(k, kernel=kernel, eigen_solver="dense", **params).fit(X)
    return sk.eigenvalues_, sk.transform(X), sk.transform(new)


def _n_components(kernel, X):
    return min(5, X.shape[1]) if kernel in ("linear", "cosine") else 5


def assert_embeddings_match(ours, ref, eigenvalues, atol):
    """Equal up to the sign of each component; components whose eigenvalues are
    (nearly) degenerate are compared as a subspace (projector), since their
    individual eigenvectors are not defined."""
    k = ref.shape[1]
    groups, start = [], 0
    for i in range(1, k + 1):
        if i == k or abs(eigenvalues[i - 1] - eigenvalues[i]) > 1e-3 * eigenvalues[0]:
            groups.append(range(start, i))
            start = i
    for g in groups:
        a, b = ours[:, g], ref[:, g]
        if len(g) == 1:
            s = np.sign(np.sum(a * b)) or 1.0
            np.testing.assert_allclose(a * s, b, atol=atol, rtol=0)
        else:  # compare Gram matrices of the group (sign- and rotation-free)
            np.testing.assert_allclose(a @ a.T, b @ b.T, atol=atol * np.abs(b).max(), rtol=0)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("name", sorted(TRAIN))
def test_dense_matches_sklearn(name, kernel):
    """Eigenvalues within 1e-8 relative; training and new-point embeddings within 1e-6."""
    X, new, params = TRAIN[name], NEW[name], KERNELS[kernel]
    k = _n_components(kernel, X)
    ev, emb_ref, new_ref = _reference(name, X, new, kernel, params, k)
    m = KernelPCA(k, kernel=kernel, eigen_solver="dense", **params)
    emb = m.fit_transform(X)
    np.testing.assert_allclose(m.eigenvalues_, ev, rtol=1e-8)
    scale = max(1.0, np.abs(emb_ref).max())
    assert_embeddings_match(emb, emb_ref, ev, atol=1e-6 * scale)
    assert_embeddings_match(m.transform(new), new_ref, ev, atol=1e-6 * scale)
    assert m.residuals_.max() < 1e-10


@pytest.mark.parametrize("kernel", ["rbf", "poly", "laplacian", "sigmoid"])
def test_dask_input_and_chunking_give_the_same_result(kernel):
    """A dask array in uneven chunks gives the numpy result; transform stays lazy."""
    X, new, params = TRAIN["blobs"], NEW["blobs"], KERNELS[kernel]
    ref = KernelPCA(4, kernel=kernel, eigen_solver="dense", **params).fit(X)
    Xd = da.from_array(X, chunks=((100, 37, 163), -1))
    m = KernelPCA(4, kernel=kernel, eigen_solver="dense", chunk_size=70, **params).fit(Xd)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    out = m.transform(da.from_array(new, chunks=(15, -1)))
    assert isinstance(out, da.Array)
    assert out.chunks[0] == (15, 15, 10)
    np.testing.assert_allclose(out.compute(), ref.transform(new), atol=1e-9)
    emb = m.fit_transform(Xd)
    assert isinstance(emb, da.Array) and emb.chunks[0] == (100, 37, 163)


def test_float32_evaluation_is_close_to_float64():
    X, new = TRAIN["moons"], NEW["moons"]
    a = KernelPCA(4, kernel="rbf", gamma=2.0, eigen_solver="dense").fit(X)
    b = KernelPCA(4, kernel="rbf", gamma=2.0, eigen_solver="dense", dtype="float32").fit(X)
    np.testing.assert_allclose(b.eigenvalues_, a.eigenvalues_, rtol=1e-5)
    out = b.transform(new)
    assert out.dtype == np.float32
    assert_embeddings_match(out, a.transform(new), a.eigenvalues_, atol=1e-4)


def test_sigmoid_drops_non_positive_eigenvalues_with_a_warning():
    """Non-PSD kernels: components whose eigenvalue is not positive are removed."""
    X = TRAIN["random"]
    m = KernelPCA(None, kernel="sigmoid", gamma=0.5, coef0=-1.0, eigen_solver="dense")
    with pytest.warns(Warning, match="not positive"):
        m.fit(X)
    assert np.all(m.eigenvalues_ > 0)
    assert m.n_components_ == m.eigenvectors_.shape[1] < X.shape[0]
    assert np.all(np.isfinite(m.transform(X[:5])))


def test_n_components_none_keeps_all_positive_components_like_sklearn():
    X = TRAIN["moons"]
    sk = SkKernelPCA(None, kernel="rbf", gamma=1.0, eigen_solver="dense").fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = KernelPCA(None, kernel="rbf", gamma=1.0).fit(X)
    keep = sk.eigenvalues_ > 1e-12 * sk.eigenvalues_[0]
    np.testing.assert_allclose(m.eigenvalues_[:50], sk.eigenvalues_[keep][:50], rtol=1e-8)
