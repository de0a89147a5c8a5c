"""Kernels against scikit-learn's pairwise functions (the independent reference)."""

import numpy as np
import pytest
from sklearn.metrics import pairwise

from kpca_dask.exceptions import InvalidParameterError
from kpca_dask.kernels import (
    CallableKernel,
    CosineKernel,
    LaplacianKernel,
    LinearKernel,
    PolynomialKernel,
    RBFKernel,
    SigmoidKernel,
    kernel_from_dict,
    make_kernel,
)

RNG = np.random.default_rng(0)
X = RNG.standard_normal((37, 5))
Y = RNG.standard_normal((23, 5)) + 0.5

CASES = [
    (LinearKernel(), lambda a, b: pairwise.linear_kernel(a, b)),
    (PolynomialKernel(0.3, 3, 1.0), lambda a, b: pairwise.polynomial_kernel(a, b, 3, 0.3, 1.0)),
    (PolynomialKernel(0.2, 2, 0.0), lambda a, b: pairwise.polynomial_kernel(a, b, 2, 0.2, 0.0)),
    (RBFKernel(0.4), lambda a, b: pairwise.rbf_kernel(a, b, gamma=0.4)),
    (LaplacianKernel(0.4), lambda a, b: pairwise.laplacian_kernel(a, b, gamma=0.4)),
    (SigmoidKernel(0.1, 0.5), lambda a, b: pairwise.sigmoid_kernel(a, b, 0.1, 0.5)),
    (CosineKernel(), lambda a, b: pairwise.cosine_similarity(a, b)),
]
IDS = [c[0].name + str(i) for i, c in enumerate(CASES)]


@pytest.mark.parametrize("kernel,reference", CASES, ids=IDS)
def test_block_matches_sklearn_float64(kernel, reference):
    """Every named kernel equals sklearn.metrics.pairwise to rounding, in float64."""
    np.testing.assert_allclose(kernel(X, Y), reference(X, Y), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel,reference", CASES, ids=IDS)
def test_block_float32_is_close(kernel, reference):
    """float32 evaluation stays within float32 rounding of the float64 kernel."""
    K = kernel(X, Y, dtype=np.float32)
    assert K.dtype == np.float32
    ref = reference(X, Y)
    np.testing.assert_allclose(K, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())


@pytest.mark.parametrize("kernel,reference", CASES, ids=IDS)
def test_diag_matches_full_block(kernel, reference):
    """diag() gives k(x_i, x_i) without forming the block."""
    np.testing.assert_allclose(kernel.diag(X), np.diag(reference(X, X)), rtol=1e-12, atol=1e-12)


def test_rbf_duplicate_rows_never_exceed_one():
    """Rounding in the norm-expanded GEMM never yields kernel values above 1."""
    Z = np.repeat(
        RNG.standard_normal((5, 30)) * 1e3, 4, axis=0
    )  # large norms, exact duplicates
    for dtype in (np.float32, np.float64):
        K = RBFKernel(1e-6)(Z, Z, dtype=dtype)
        assert K.max() <= 1.0
        assert np.all(np.isfinite(K))


def test_cosine_zero_rows_give_zero():
    """Rows of norm zero have zero similarity, as in scikit-learn."""
    Z = np.vstack([np.zeros(5), X[:3]])
    K = CosineKernel()(Z, Z)
    np.testing.assert_array_equal(K[0], 0.0)
    np.testing.assert_array_equal(CosineKernel().diag(Z), [0, 1, 1, 1])


def test_callable_kernel_receives_blocks():
    """A user callable is called on whole numpy blocks with kernel_params."""
    calls = []

    def k(a, b, scale):
        calls.append((a.shape, b.shape))
        return scale * (a @ b.T)

    kern = CallableKernel(k, {"scale": 2.0})
    np.testing.assert_allclose(kern(X, Y), 2.0 * X @ Y.T)
    assert calls[0] == ((1, X.shape[1]), (1, Y.shape[1]))  # the convention probe, once
    assert calls[1:] == [(X.shape, Y.shape)]
    np.testing.assert_allclose(kern.diag(X), 2.0 * np.sum(X * X, axis=1))


def test_callable_kernel_written_for_sklearn_is_called_per_pair():
    """scikit-learn's convention (two 1-D rows in, a number out) works, as pairwise_kernels."""
    from sklearn.metrics.pairwise import pairwise_kernels

    def histogram(x, y):
        assert x.ndim == 1 and y.ndim == 1 or x.shape[0] == 1
        return np.minimum(x, y).sum()

    A, B = np.abs(X[:7]), np.abs(Y[:5])
    kern = CallableKernel(histogram)
    np.testing.assert_allclose(kern(A, B), pairwise_kernels(A, B, metric=histogram))
    np.testing.assert_allclose(kern.diag(A), [np.minimum(a, a).sum() for a in A])


def test_callable_kernel_wrong_shape_is_named():
    kern = CallableKernel(lambda a, b: a @ a.T)
    with pytest.raises(InvalidParameterError, match="must return shape"):
        kern(X, Y)


def test_make_kernel_rejects_unknown_and_bad_gamma():
    with pytest.raises(InvalidParameterError, match="Unknown kernel 'chi2'"):
        make_kernel("chi2")
    with pytest.raises(InvalidParameterError, match="gamma > 0"):
        make_kernel("rbf", gamma=0.0)
    with pytest.raises(InvalidParameterError, match="gamma > 0"):
        make_kernel("rbf", gamma=-1.0)


@pytest.mark.parametrize("kernel", [c[0] for c in CASES], ids=IDS)
def test_dict_round_trip(kernel):
    """Named kernels serialise to JSON-able dicts and come back equal."""
    again = kernel_from_dict(kernel.to_dict())
    assert again == kernel
    np.testing.assert_array_equal(again(X, Y), kernel(X, Y))


def test_kernel_from_dict_refuses_callables_and_unknown_params():
    with pytest.raises(InvalidParameterError):
        kernel_from_dict({"name": "callable"})
    with pytest.raises(InvalidParameterError, match="Unknown parameters"):
        kernel_from_dict({"name": "rbf", "gamma": 1.0, "code": "import os"})
