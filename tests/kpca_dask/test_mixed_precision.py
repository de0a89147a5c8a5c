"""Mixed precision (issue 29, decision 2): float32 kernel blocks under a float64 model,
certified for the kernel itself against a dense float64 reference, with the fallback to
float64 blocks where float32 cannot certify the requested level (kpca_dask.mixed)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from sklearn.datasets import make_blobs
from sklearn.metrics.pairwise import rbf_kernel

from kpca_dask import KernelPCA
from kpca_dask.exceptions import InvalidParameterError
from kpca_dask.mixed import MIXED_MIN_SAMPLES, block_rounding

K = 12
SOLVER = dict(eigen_solver="randomized", random_state=0)


def _centred(X, gamma):
    Kx = rbf_kernel(X, gamma=gamma)
    return Kx - Kx.mean(axis=0) - Kx.mean(axis=1)[:, None] + Kx.mean()


def _reference(X, gamma, k=K):
    n = X.shape[0]
    return sl.eigh(_centred(X, gamma), eigvals_only=True, subset_by_index=[n - k, n - 1])[::-1]


def _clustered(n=1500, d=32, seed=0):
    # ten well separated blobs: a cluster of nine near-equal eigenvalues, then a flat tail
    return make_blobs(n, n_features=d, centers=10, random_state=seed)[0]


def _gaussian(n=1500, d=32):
    return np.random.default_rng(0).standard_normal((n, d))


def _assert_within_certificate(m, ref):
    cert = m.solver_info_["certificate"]
    bounds = np.asarray(cert["eigenvalue_bounds"])
    err = np.abs(m.eigenvalues_ - ref)
    # the certified bound (relative) holds against the dense float64 eigenvalues; the
    # reference's own rounding (float64 eigh of an n x n matrix) is far below it
    slack = 1e-12 * ref[0]
    assert np.all(err <= bounds * np.abs(m.eigenvalues_) + slack), (err / ref, bounds)
    levels = np.asarray(cert["eigenvalue_levels"])
    assert np.all(bounds <= levels + 1e-15)


@pytest.mark.parametrize("data", ["clustered", "gaussian"])
def test_float32_blocks_certified_against_dense_float64(data):
    X = _clustered() if data == "clustered" else _gaussian()
    gamma = 1.0 / X.shape[1]
    m = KernelPCA(K, kernel="rbf", gamma=gamma, block_dtype="float32", **SOLVER).fit(X)
    assert m.converged_
    assert m.block_dtype_ == "float32"
    info = m.solver_info_["mixed_precision"]
    assert info["blocks"] == "float32"
    # certified on the kernel evaluated afresh in float64: no rounding of blocks to add
    assert info["block_rounding"] == 0.0
    _assert_within_certificate(m, _reference(X, gamma))
    # results in the model's dtype
    assert m.eigenvalues_.dtype == np.float64
    assert m.transform(X[:5]).dtype == np.float64


def test_clustered_float32_blocks_match_float64_blocks():
    """The same fit on float64 blocks: the embeddings agree to the certified level."""
    X = _clustered()
    kw = dict(kernel="rbf", gamma=1.0 / X.shape[1], **SOLVER)
    m32 = KernelPCA(K, block_dtype="float32", **kw).fit(X)
    m64 = KernelPCA(K, block_dtype="float64", **kw).fit(X)
    assert (m32.block_dtype_, m64.block_dtype_) == ("float32", "float64")
    assert "mixed_precision" not in m64.solver_info_
    rel = np.abs(m32.eigenvalues_ - m64.eigenvalues_) / m64.eigenvalues_
    levels = np.asarray(m32.solver_info_["certificate"]["eigenvalue_levels"])
    assert np.all(rel <= 2 * levels)


def test_uncertified_lone_pair_falls_back_to_float64_blocks():
    """Six blobs in d = 16, five components: the fifth is a lone eigenvalue asked to
    tol = 1e-8 whose gap below is unknown to the certifying pass, so only its residual
    (Weyl) bounds it, and vectors from float32 blocks have residuals far above 1e-8 of
    it. The fit solves again on float64 blocks and says why."""
    X = make_blobs(2000, n_features=16, centers=6, random_state=0)[0]
    gamma = 1.0 / 16
    m = KernelPCA(5, kernel="rbf", gamma=gamma, block_dtype="float32", **SOLVER).fit(X)
    assert m.converged_
    assert m.block_dtype_ == "float64"
    mp = m.solver_info_["mixed_precision"]
    assert mp["tried"] == "float32" and "does not hold for component(s) [4]" in mp["reason"]
    assert m.n_passes_ > mp["passes"]
    _assert_within_certificate(m, _reference(X, gamma, 5))


def test_lone_pairs_with_gaps_are_certified_on_float32_blocks():
    """The same data with twelve components: the lone eigenvalues have known gaps, and
    the quadratic bound on the float64 kernel's residuals certifies them to 1e-8."""
    X = make_blobs(2000, n_features=16, centers=6, random_state=0)[0]
    gamma = 1.0 / 16
    m = KernelPCA(K, kernel="rbf", gamma=gamma, block_dtype="float32", **SOLVER).fit(X)
    assert m.block_dtype_ == "float32" and m.converged_
    assert "vector" in m.solver_info_["certificate"]["certified"]
    _assert_within_certificate(m, _reference(X, gamma))


def test_tight_tol_and_small_n_keep_float64_blocks():
    """block_dtype="auto": float32 blocks for float64 models from MIXED_MIN_SAMPLES rows
    with the default tol; float64 below that tol (tol=1e-10) or those rows, for other
    solvers and kernels, and when forced."""
    X = np.zeros((MIXED_MIN_SAMPLES + 8, 4))
    auto = dict(kernel="rbf", gamma=0.5, eigen_solver="randomized")
    assert KernelPCA(8, **auto).plan(X, kernel=False).block_dtype == np.float32
    assert KernelPCA(8, tol=1e-10, **auto).plan(X, kernel=False).block_dtype == np.float64
    assert KernelPCA(8, block_dtype="float64", **auto).plan(X).block_dtype == np.float64
    assert KernelPCA(8, **auto).plan(X[:1000]).block_dtype == np.float64
    poly = dict(auto, kernel="poly")
    assert KernelPCA(8, **poly).plan(X, kernel=False).block_dtype == np.float64
    arpack = dict(auto, eigen_solver="arpack")
    assert KernelPCA(8, **arpack).plan(X, kernel=False).block_dtype == np.float64
    f32 = KernelPCA(8, dtype="float32", **auto).plan(X, kernel=False)
    assert f32.block_dtype == np.float32 and not f32.mixed


def test_tight_tol_fit_records_float64_blocks():
    X = _gaussian(600, 8)
    m = KernelPCA(6, kernel="rbf", gamma=0.1, tol=1e-10, **SOLVER).fit(X)
    assert m.block_dtype_ == "float64"
    assert m.solver_info_["block_dtype"] == "float64"


def test_recompute_tier_certifies_without_block_rounding():
    """Without a cache the certifying pass evaluates the blocks in float64: no rounding."""
    X = _gaussian()
    gamma = 1.0 / X.shape[1]
    m = KernelPCA(
        K,
        kernel="rbf",
        gamma=gamma,
        block_dtype="float32",
        kernel_cache="recompute",
        **SOLVER,
    ).fit(X)
    assert m.block_dtype_ == "float32"
    assert m.solver_info_["kernel_cache"]["tier"] == "recompute"
    assert m.solver_info_["mixed_precision"]["block_rounding"] == 0.0
    _assert_within_certificate(m, _reference(X, gamma))


def test_block_rounding_bounds_the_rounding_of_the_kernel():
    """delta >= ||K~ - K||_2 for the float32-rounded kernel (a spectral norm computed
    here, densely), and not grossly above it on this data."""
    X = _clustered(800, 16)
    Kx = rbf_kernel(X, gamma=1.0 / 16)
    Kt = Kx.astype(np.float32).astype(np.float64)
    E = np.linalg.norm(Kt - Kx, 2)
    delta = block_rounding(Kt.mean(axis=1), Kx.shape[0], True)
    assert E <= delta
    assert delta <= 50 * max(E, np.finfo(np.float32).eps * np.linalg.norm(Kx, 2))
    assert block_rounding(Kt.mean(axis=1), Kx.shape[0], False) == 0.0


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(block_dtype="half"), "block_dtype"),
        (dict(block_dtype="float32", kernel="poly"), "block_dtype='float32'"),
        (dict(block_dtype="float32", eigen_solver="arpack"), "block_dtype='float32'"),
        (dict(block_dtype="float64", dtype="float32"), "block_dtype='float64'"),
    ],
)
def test_block_dtype_refusals(kw, match):
    params = dict(kernel="rbf", gamma=0.5, eigen_solver="randomized")
    params.update(kw)
    with pytest.raises(InvalidParameterError, match=match):
        KernelPCA(3, **params).fit(_gaussian(200, 4))
