"""The block Krylov basis stays orthonormal when the third projection is skipped.

``_next_block`` projects a new block against the basis twice (CGS2) and only a third
time when the remainder is ill conditioned (issue 17: the third projection was a
third of the driver's time). These tests measure the orthogonality the solver relies
on (its Rayleigh-Ritz matrix is assembled as if ``W^T W = I``), directly on hard
blocks and through whole fits, against dense ``scipy.linalg.eigh``.
"""

import numpy as np
import pytest
import scipy.linalg
from sklearn.datasets import make_blobs

from kpca_dask.solvers import randomized
from kpca_dask.solvers.randomized import _next_block, _rank_revealing_orth

from .krylov_reference import Dense

EPS = np.finfo(np.float64).eps


def orth_errors(W, Q):
    """(max |W^T Q|, max |Q^T Q - I|)."""
    return (
        float(np.abs(W.T @ Q).max()) if W.size and Q.size else 0.0,
        float(np.abs(Q.T @ Q - np.eye(Q.shape[1])).max()) if Q.size else 0.0,
    )


def basis(n, L, seed):
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((n, L)))[0]


@pytest.mark.parametrize("inside", [0.0, 1.0 - 1e-6, 1.0 - 1e-9])
def test_well_conditioned_block_is_orthogonal_after_two_projections(inside):
    """Y mostly inside span(W) (all but 1e-6 or 1e-9 of its norm), its remainder well
    conditioned: the cheap path is taken and Q is orthogonal to W and orthonormal to
    well below 1e-10."""
    rng = np.random.default_rng(1)
    n, L, c = 4000, 200, 24
    W = basis(n, L, 0)
    out = np.linalg.qr(rng.standard_normal((n, c)) - W @ (W.T @ rng.standard_normal((n, c))))[0]
    out -= W @ (W.T @ out)
    Y = inside * (W @ rng.standard_normal((L, c))) + (1.0 - inside) * out
    tau = EPS * np.sqrt(n) * 1e-3 * np.linalg.norm(Y, 2)
    R = Y - W @ (W.T @ Y)
    R -= W @ (W.T @ R)
    assert _rank_revealing_orth(R, tau)[2], "precondition: the CholQR2 path"
    Q, S, dropped = _next_block(W, Y, tau)
    assert Q.shape == (n, c) and dropped == 0.0
    across, within = orth_errors(W, Q)
    assert across < 1e-10 and within < 1e-12
    np.testing.assert_allclose(S, W.T @ Y, atol=1e-12 * np.abs(Y).max())


def test_ill_conditioned_block_takes_the_third_projection():
    """A remainder with directions of norm 1 and others just above the rounding level
    (1e-11, tau = 1e-12), and some below it: the rank-revealing path drops the last, and
    the kept small directions would carry the rounding of the projection amplified by
    ``||R|| / 1e-11`` (about 1e-5 off orthogonal after CGS2 alone); the third projection
    brings them back to orthogonal."""
    rng = np.random.default_rng(2)
    n, L, c = 4000, 200, 24
    W = basis(n, L, 3)
    P = rng.standard_normal((n, c))
    P -= W @ (W.T @ P)
    P -= W @ (W.T @ P)
    P = np.linalg.qr(P)[0]
    sv = np.array([1.0] * 10 + [1e-11] * 10 + [1e-14] * 4)
    Y = (
        W @ rng.standard_normal((L, c))
        + (P * sv) @ np.linalg.qr(rng.standard_normal((c, c)))[0]
    )
    tau = 1e-12
    R = Y - W @ (W.T @ Y)
    R -= W @ (W.T @ R)
    assert not _rank_revealing_orth(R, tau)[2]
    Q, _, dropped = _next_block(W, Y, tau)
    assert Q.shape[1] == 20 and 0 < dropped < tau
    across, within = orth_errors(W, Q)
    assert across < 1e-10 and within < 1e-12


def flat_tail_kernel(n=1500):
    """Centred rbf kernel of 10 blobs in d = 32: 9 gapped eigenvalues, then a flat tail."""
    X, _ = make_blobs(n, n_features=32, centers=10, random_state=0)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    Kc = np.exp(-d2 / 32.0)
    Kc -= Kc.mean(0)
    Kc -= Kc.mean(1)[:, None]
    return (Kc + Kc.T) / 2


def low_rank_matrix(n=1500, r=7):
    """Centred linear kernel of rank 7: the Krylov space is exhausted after one block."""
    X = np.random.default_rng(4).standard_normal((n, r)) * np.arange(r, 0, -1)
    X -= X.mean(0)
    return X @ X.T


@pytest.mark.parametrize(
    "make", [flat_tail_kernel, low_rank_matrix], ids=["flat-tail", "rank-7"]
)
def test_whole_fit_keeps_the_basis_orthonormal(make, monkeypatch):
    """Every block added during a default fit is orthogonal to the basis before it (to
    1e-10), and the certified eigenvalues are within their bounds of dense eigh."""
    A = make()
    seen = []
    inner = randomized._next_block

    def watched(W, Y, tau):
        Q, S, dropped = inner(W, Y, tau)
        seen.append(orth_errors(W, Q))
        return Q, S, dropped

    monkeypatch.setattr(randomized, "_next_block", watched)
    k = 16
    res = randomized.randomized_eigh(Dense(A), k, tol=1e-8, random_state=0)
    assert seen and max(a for a, _ in seen) < 1e-10 and max(w for _, w in seen) < 1e-12
    ref = scipy.linalg.eigh(A, eigvals_only=True)[::-1][: len(res.eigenvalues)]
    bounds = np.asarray(res.info["certificate"]["eigenvalue_bounds"])
    assert res.converged
    err = np.abs(res.eigenvalues - ref) / ref
    assert np.all(err <= bounds + 1e-12), (err, bounds)
    if make is low_rank_matrix:
        assert len(res.eigenvalues) == 7
