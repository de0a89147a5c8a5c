"""Landmark selection: distributions, determinism, chunk independence, adaptivity."""

import itertools

import dask.array as da
import numpy as np
import pytest

from kpca_dask.kernels import LinearKernel, RBFKernel
from kpca_dask.solvers.landmarks import (
    kmeanspp_landmarks,
    rpcholesky_landmarks,
    sample_indices,
    select_landmarks,
)


def imbalanced_clusters(seed=0, big=3000, n_small=30, small=8, d=3):
    """One large cluster and many small far-away ones (the case uniform sampling misses)."""
    rng = np.random.default_rng(seed)
    parts = [rng.normal(scale=1.0, size=(big, d))]
    centres = rng.normal(scale=30.0, size=(n_small, d))
    parts += [c + rng.normal(scale=0.3, size=(small, d)) for c in centres]
    return np.vstack(parts)


def nystroem_trace_error(X, Z, kernel):
    """tr(K - K_XZ W^+ K_ZX) / tr(K), computed densely."""
    C = kernel(X, Z)
    W = kernel(Z, Z)
    approx = np.einsum("ij,ji->i", C, np.linalg.pinv(W, rcond=1e-12, hermitian=True) @ C.T)
    diag = kernel.diag(X)
    return float((diag - approx).sum() / diag.sum())


def test_accelerated_rpcholesky_has_the_sequential_distribution():
    """Accepted pivot pairs are distributed as sequential RPCholesky's (exact probabilities)."""
    pts = np.array([[0.0], [0.15], [0.3], [1.5], [4.0]])
    kern = RBFKernel(0.5)
    K = kern(pts, pts)
    n = len(pts)
    p_first = np.diag(K) / np.trace(K)
    expected = {}
    for i, j in itertools.combinations(range(n), 2):
        p = 0.0
        for a, b in ((i, j), (j, i)):
            resid = np.diag(K) - K[:, a] ** 2 / K[a, a]
            p += p_first[a] * resid[b] / resid.sum()
        expected[(i, j)] = p
    rng = np.random.default_rng(0)
    trials = 1500
    counts = dict.fromkeys(expected, 0)
    for _ in range(trials):
        piv, _ = rpcholesky_landmarks(pts, 2, kern, rng)
        counts[tuple(sorted(int(v) for v in piv))] += 1
    for pair, p in expected.items():
        sd = np.sqrt(p * (1 - p) / trials)
        assert abs(counts[pair] / trials - p) < 4.5 * sd + 1e-3, (
            pair,
            counts[pair] / trials,
            p,
        )


def test_rpcholesky_factor_is_the_nystroem_approximation():
    """The reported sample trace error equals tr(K - K_SZ W^-1 K_ZS) / tr(K) on the sample."""
    S = imbalanced_clusters(1)[:800]
    kern = RBFKernel(0.1)
    piv, info = rpcholesky_landmarks(S, 40, kern, np.random.default_rng(3))
    assert len(set(piv.tolist())) == 40
    ref = nystroem_trace_error(S, S[piv], kern)
    assert info["sample_trace_error"] == pytest.approx(ref, rel=1e-6, abs=1e-12)
    np.testing.assert_allclose(info["_column_means"], kern(S, S[piv]).mean(axis=0), rtol=1e-12)


def test_rpcholesky_stops_at_the_numerical_rank():
    """A rank-3 kernel matrix is reproduced by 3 pivots; no noise pivots are added."""
    S = np.random.default_rng(0).standard_normal((500, 3))
    piv, info = rpcholesky_landmarks(S, 50, LinearKernel(), np.random.default_rng(0))
    assert piv.size == 3
    assert info["sample_trace_error"] < 1e-12


def test_kmeanspp_finds_every_separated_cluster():
    """With one landmark per cluster and far-apart clusters, D^2 seeding hits each once."""
    X = imbalanced_clusters(2, big=500, n_small=10, small=5)
    labels = np.r_[np.zeros(500), np.repeat(np.arange(1, 11), 5)]
    piv = kmeanspp_landmarks(X, 11, np.random.default_rng(0))
    assert sorted(labels[piv].tolist()) == list(range(11))


@pytest.mark.parametrize("method", ["uniform", "kmeans++", "rpcholesky"])
def test_landmarks_depend_on_the_seed_not_the_chunking(method):
    """Same seed, different chunkings: identical landmark rows; another seed: others."""
    X = imbalanced_clusters(3)
    kern = RBFKernel(0.05)
    kw = dict(sample_size=1000)
    a = select_landmarks(
        da.from_array(X, chunks=(1000, -1)), 60, method, kern, np.random.default_rng(5), **kw
    )
    b = select_landmarks(
        da.from_array(X, chunks=(137, -1)), 60, method, kern, np.random.default_rng(5), **kw
    )
    c = select_landmarks(
        da.from_array(X, chunks=(1000, -1)), 60, method, kern, np.random.default_rng(6), **kw
    )
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.points, X[a.indices])
    assert np.all(np.diff(a.indices) > 0)  # sorted, distinct
    assert a.indices.size == 60
    assert not np.array_equal(a.indices, c.indices)


def test_all_rows_when_m_reaches_n():
    X = np.arange(20.0).reshape(10, 2)
    lm = select_landmarks(
        da.from_array(X, chunks=(3, -1)),
        50,
        "rpcholesky",
        RBFKernel(1.0),
        np.random.default_rng(0),
    )
    np.testing.assert_array_equal(lm.indices, np.arange(10))
    np.testing.assert_array_equal(lm.points, X)


def test_sample_indices_are_uniform_and_distinct():
    rng = np.random.default_rng(0)
    idx = sample_indices(1000, 100, rng)
    assert idx.size == 100 and np.unique(idx).size == 100
    assert np.array_equal(sample_indices(50, 80, rng), np.arange(50))


def test_rpcholesky_beats_uniform_on_imbalanced_clusters():
    """Trace-norm error of the Nyström approximation on all rows, averaged over seeds:
    rpcholesky landmarks are several times more accurate than uniform ones at the same m."""
    X = imbalanced_clusters(4)
    Xd = da.from_array(X, chunks=(1000, -1))
    kern = RBFKernel(0.1)
    errs = {"uniform": [], "rpcholesky": []}
    for seed in range(4):
        for method in errs:
            lm = select_landmarks(Xd, 60, method, kern, np.random.default_rng(seed))
            errs[method].append(nystroem_trace_error(X, lm.points, kern))
    uni, rpc = np.mean(errs["uniform"]), np.mean(errs["rpcholesky"])
    assert rpc < 0.5 * uni, (rpc, uni)
