"""Centring and scaling, checked on examples worked by hand and against H K H."""

import dask.array as da
import numpy as np
import pytest

from kpca_dask import KernelPCA
from kpca_dask.centering import CentredKernel, centre_cross_kernel
from kpca_dask.gram import BlockKernelMatrix
from kpca_dask.kernels import LinearKernel, RBFKernel


@pytest.mark.parametrize("solver", ["dense", "randomized"])
def test_hand_worked_one_dimensional_linear(solver):
    """x = [0, 1, 3], linear kernel, worked on paper.

    K = x x^T; mu = [0, 4/3, 4]; g = 16/9; Kc = xc xc^T with xc = [-4, -1, 5]/3,
    so lambda = |xc|^2 = 14/3, v = [-4, -1, 5]/sqrt(42) (largest entry positive),
    embedding = v sqrt(lambda) = xc. New point 2: kx = [0, 2, 6],
    kc = kx - mu - mean(kx) + g = [-8, -2, 10]/9, embedding kc.v/sqrt(lambda) = 2/3.
    """
    X = np.array([[0.0], [1.0], [3.0]])
    m = KernelPCA(1, kernel="linear", eigen_solver=solver, n_oversamples=1, random_state=0)
    emb = m.fit_transform(X)
    np.testing.assert_allclose(m.row_means_, [0, 4 / 3, 4], atol=1e-14)
    assert m.grand_mean_ == pytest.approx(16 / 9, abs=1e-14)
    np.testing.assert_allclose(m.eigenvalues_, [14 / 3], rtol=1e-13)
    np.testing.assert_allclose(
        m.eigenvectors_[:, 0], np.array([-4, -1, 5]) / np.sqrt(42), atol=1e-13
    )
    np.testing.assert_allclose(emb[:, 0], [-4 / 3, -1 / 3, 5 / 3], atol=1e-13)
    np.testing.assert_allclose(m.transform(np.array([[2.0]])), [[2 / 3]], atol=1e-13)
    assert m.explained_variance_ratio_ == pytest.approx([1.0])
    # ||phi_c(2)||^2 = k(x,x) - 2 mean(kx) + g = 4 - 16/3 + 16/9 = 4/9 = (2/3)^2: nothing left
    assert m.score_samples(np.array([[2.0]]))[0] == pytest.approx(0.0, abs=1e-13)
    # a point off the line of the training data does not exist in 1-D; check a far one
    assert m.score_samples(np.array([[10.0]]))[0] == pytest.approx(0.0, abs=1e-11)


def test_hand_worked_two_dimensional_signs_and_scaling():
    """Four points, worked on paper: centred coordinates xc = [-2, 1, 1, 0] and
    yc = [1, 2, 0, -3] are orthogonal, so the centred linear Gram matrix has
    eigenvalues |yc|^2 = 14 and |xc|^2 = 6 with eigenvectors yc/|yc| and
    xc/|xc|. The sign rule (largest-magnitude entry positive) flips both, so the
    embeddings are -yc = [-1, -2, 0, 3] and -xc = [2, -1, -1, 0]."""
    X = np.array([[-2.0, 1.0], [1.0, 2.0], [1.0, 0.0], [0.0, -3.0]]) + [10.0, 20.0]
    m = KernelPCA(2, kernel="linear", eigen_solver="dense")
    emb = m.fit_transform(X)
    np.testing.assert_allclose(m.eigenvalues_, [14.0, 6.0], rtol=1e-12)
    np.testing.assert_allclose(emb[:, 0], [-1, -2, 0, 3], atol=1e-12)
    np.testing.assert_allclose(emb[:, 1], [2, -1, -1, 0], atol=1e-12)
    np.testing.assert_allclose(m.explained_variance_ratio_, [0.7, 0.3], rtol=1e-12)


def test_centred_operator_equals_hkh():
    """Kc Z = H K H Z with mu and g fused into the first pass."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((123, 4))
    Z = rng.standard_normal((123, 3))
    K = RBFKernel(0.3)(X, X)
    H = np.eye(123) - 1.0 / 123
    op = CentredKernel(BlockKernelMatrix(da.from_array(X, chunks=(40, -1)), RBFKernel(0.3)))
    np.testing.assert_allclose(op.matmul(Z), H @ K @ H @ Z, atol=1e-12)
    assert op.n_passes == 1
    np.testing.assert_allclose(op.row_means, K.mean(axis=1), atol=1e-14)
    assert op.grand_mean == pytest.approx(K.mean(), abs=1e-14)
    np.testing.assert_allclose(op.matmul(Z), H @ K @ H @ Z, atol=1e-12)
    assert op.n_passes == 2  # no extra pass for the means the second time


def test_cross_kernel_centring_matches_feature_space_formula():
    """kc(x) = k(x, X) - mu - mean(k(x, X)) + g equals <phi(x) - m, phi(x_i) - m>
    for the linear kernel, where feature space is the input space."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((20, 3))
    new = rng.standard_normal((5, 3))
    K = LinearKernel()(X, X)
    kx = LinearKernel()(new, X)
    mean = X.mean(axis=0)
    expected = (new - mean) @ (X - mean).T
    np.testing.assert_allclose(
        centre_cross_kernel(kx, K.mean(axis=1), K.mean()), expected, atol=1e-12
    )
