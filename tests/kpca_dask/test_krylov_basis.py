"""The block Krylov basis on BLAS-3 column-major panels computes what numpy did (issue 29).

``kpca_dask.solvers.krylov_basis`` calls ``dgemm``/``dsyrk``/``dtrmm`` on
column-major panels, in place where it can, instead of numpy's ``@`` on mixed
layouts. These tests hold it to the plain numpy formulas it replaced (kept below as
the reference), to ``numpy.linalg.qr`` and to the SVD: on well-conditioned,
ill-conditioned and rank-deficient blocks, exact zeros, an empty basis, row- and
column-major inputs, and through whole solves (same passes, same eigenvalues to
rounding). They also check that the inputs are never overwritten and that the
thread limit the solver sets covers scipy's BLAS as well as numpy's.
"""

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from threadpoolctl import threadpool_info, threadpool_limits

from kpca_dask.solvers import krylov_basis as kb
from kpca_dask.solvers import randomized, randomized_setup
from kpca_dask.threads import blas_threads_for_driver

from .krylov_reference import Dense, next_block_ref, orth_ref, rank_revealing_ref

EPS = np.finfo(np.float64).eps


@pytest.fixture(autouse=True)
def one_blas_thread():
    """The driver's budget (the solver runs its basis work under it), for the tests'
    own algebra too: OpenBLAS threads spinning on a busy machine cost seconds here."""
    with blas_threads_for_driver():
        yield


# ----------------------------------------------------------------- helpers
def basis(n, L, seed, order="F"):
    Q = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, L)))[0]
    return np.asfortranarray(Q) if order == "F" else np.ascontiguousarray(Q)


def with_singular_values(n, sv, seed, W=None):
    """An n x len(sv) block with singular values ``sv`` (orthogonal to W if given)."""
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((n, len(sv)))
    if W is not None:
        P -= W @ (W.T @ P)
        P -= W @ (W.T @ P)
    P = np.linalg.qr(P)[0]
    return (P * np.asarray(sv)) @ np.linalg.qr(rng.standard_normal((len(sv),) * 2))[0]


def projector_gap(Q1, Q2):
    """sin of the largest angle between span(Q1) and span(Q2) (same dimension)."""
    assert Q1.shape == Q2.shape
    if Q1.shape[1] == 0:
        return 0.0
    return float(np.linalg.norm(Q1 - Q2 @ (Q2.T @ Q1), 2))


def orthonormality(Q):
    return float(np.abs(Q.T @ Q - np.eye(Q.shape[1])).max()) if Q.size else 0.0


# ------------------------------------------------------------------- _orth
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_orth_matches_numpy_qr_and_leaves_its_input_alone(order, dtype):
    rng = np.random.default_rng(0)
    R = np.asarray(rng.standard_normal((3001, 24)), dtype=dtype, order=order)
    before = R.copy()
    Q = kb._orth(R)
    np.testing.assert_array_equal(R, before)
    assert Q.dtype == np.float64 and Q.flags.f_contiguous and Q.shape == (3001, 24)
    assert orthonormality(Q) < 1e-14
    Qn = np.linalg.qr(R.astype(np.float64))[0]
    assert projector_gap(Q, Qn) < 1e-13
    # same columns as the numpy expressions, to rounding
    np.testing.assert_allclose(Q, orth_ref(R.astype(np.float64)), atol=1e-13)


def test_orth_in_place_returns_the_same_memory():
    R = np.asfortranarray(np.random.default_rng(1).standard_normal((2000, 16)))
    ref = orth_ref(R.copy())
    Q = kb._orth(R, overwrite=True)
    assert np.shares_memory(Q, R)
    np.testing.assert_allclose(Q, ref, atol=1e-13)


@pytest.mark.parametrize("cond", [1e9, 1e13, 1e17])
def test_orth_ill_conditioned_falls_back_to_householder(cond):
    """Condition numbers past what CholQR2 handles (its Cholesky fails or the result
    is not orthonormal): the Householder fallback still returns an orthonormal basis
    of the block's span (as far as the block defines it)."""
    sv = np.logspace(0, -np.log10(cond), 12)
    R = with_singular_values(2500, sv, seed=2)
    Q = kb._orth(R)
    assert orthonormality(Q) < 1e-13
    # R lies in span(Q): the residual is at the rounding level of R
    assert np.linalg.norm(R - Q @ (Q.T @ R), 2) < 1e-13 * np.linalg.norm(R, 2)
    # float32 input: a float64 basis of it, whichever path ran
    R32 = R.astype(np.float32)
    Q32 = kb._orth(R32)
    assert Q32.dtype == np.float64 and orthonormality(Q32) < 1e-13
    R64 = R32.astype(np.float64)
    assert np.linalg.norm(R64 - Q32 @ (Q32.T @ R64), 2) < 1e-13 * np.linalg.norm(R64, 2)


def test_orth_of_no_columns():
    R = np.zeros((10, 0))
    assert kb._orth(R).shape == (10, 0)


# ------------------------------------------------------- rank revealing
def test_rank_deficient_block_keeps_only_the_directions_above_tau():
    n = 3000
    sv = [3.0, 1.0, 0.5, 1e-3] + [1e-15] * 4
    R = with_singular_values(n, sv, seed=3)
    tau = 1e-10
    Q, dropped, well = kb._rank_revealing_orth(R, tau)
    Qr, dr, wr = rank_revealing_ref(R, tau)
    assert Q.shape == (n, 4) and not well and not wr
    assert 0.0 < dropped < tau and dropped == pytest.approx(dr, rel=1e-6, abs=1e-20)
    assert orthonormality(Q) < 1e-14
    assert projector_gap(Q, Qr) < 1e-12
    assert np.linalg.norm(R - Q @ (Q.T @ R), 2) <= dropped + 100 * EPS * np.linalg.norm(R, 2)


def test_block_of_exact_zeros_and_zero_columns():
    n = 1000
    Z = np.zeros((n, 8))
    Q, dropped, well = kb._rank_revealing_orth(Z, 1e-12)
    assert Q.shape == (n, 0) and dropped == 0.0 and not well
    # exact zero columns beside independent ones: the zero columns are dropped exactly
    R = np.zeros((n, 8))
    R[:, :5] = np.random.default_rng(4).standard_normal((n, 5))
    Q, dropped, well = kb._rank_revealing_orth(R, 1e-12)
    assert Q.shape == (n, 5) and dropped == 0.0 and not well
    assert orthonormality(Q) < 1e-14
    assert projector_gap(Q, np.linalg.qr(R[:, :5])[0]) < 1e-13


def test_well_conditioned_block_takes_cholqr2_and_matches_the_reference():
    R = np.random.default_rng(5).standard_normal((4000, 32))
    Q, dropped, well = kb._rank_revealing_orth(R, 1e-12)
    assert well and dropped == 0.0
    np.testing.assert_allclose(Q, rank_revealing_ref(R, 1e-12)[0], atol=1e-13)


# --------------------------------------------------------------- _next_block
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize(
    "case", ["generic", "mostly-inside", "ill-conditioned", "rank-deficient", "inside", "zero"]
)
def test_next_block_matches_the_numpy_formulas(case, order):
    """Q, S and the dropped norm equal the numpy expressions' to rounding (Q up to the
    rotation Householder QR may choose inside a deflated block); neither W nor Y
    is modified; Q is orthogonal to W."""
    rng = np.random.default_rng(6)
    n, L, c = 2000, 96, 24
    W = basis(n, L, 7, order)
    inside = W @ rng.standard_normal((L, c))
    if case == "generic":
        Y = rng.standard_normal((n, c))
    elif case == "mostly-inside":
        Y = inside + 1e-7 * with_singular_values(n, np.ones(c), 8, W)
    elif case == "ill-conditioned":
        Y = inside + with_singular_values(n, np.logspace(0, -9, c), 9, W)
    elif case == "rank-deficient":
        Y = inside + with_singular_values(n, [1.0] * 10 + [1e-11] * 8 + [0.0] * 6, 10, W)
    elif case == "inside":
        Y = inside
    else:
        Y = np.zeros((n, c))
    tau = 1e-12
    Y_before, W_before = Y.copy(), W.copy()
    Q, S, dropped = kb._next_block(W, Y, tau)
    Qr, Sr, dr = next_block_ref(W, Y, tau)
    np.testing.assert_array_equal(Y, Y_before)
    np.testing.assert_array_equal(W, W_before)
    np.testing.assert_allclose(S, Sr, atol=1e-13 * max(1.0, np.abs(Y).max()))
    assert Q.shape == Qr.shape, (Q.shape, Qr.shape)
    assert dropped == pytest.approx(dr, rel=1e-3, abs=tau * 1e-3)
    if Q.shape[1]:
        assert Q.flags.f_contiguous
        assert np.abs(W.T @ Q).max() < 1e-13
        assert orthonormality(Q) < 1e-14
        assert projector_gap(Q, Qr) < 1e-10
        if case in ("generic", "mostly-inside"):  # CholQR2 path: the same columns
            np.testing.assert_allclose(Q, Qr, atol=1e-12)
    expected = {"inside": 0, "zero": 0, "rank-deficient": 18}.get(case, c)
    assert Q.shape[1] == expected


def test_next_block_with_an_empty_or_full_basis():
    rng = np.random.default_rng(11)
    Y = rng.standard_normal((500, 8))
    Q, S, dropped = kb._next_block(np.zeros((500, 0)), Y, 1e-12)
    assert S.shape == (0, 8) and Q.shape == (500, 8) and dropped == 0.0
    assert projector_gap(Q, np.linalg.qr(Y)[0]) < 1e-13
    W = basis(40, 40, 12)  # the basis spans the space: nothing is left
    Y = rng.standard_normal((40, 8))
    Q, S, dropped = kb._next_block(W, Y, 1e-12)
    assert Q.shape == (40, 0) and dropped == 0.0
    np.testing.assert_allclose(S, W.T @ Y, atol=1e-13)


# ----------------------------------------------------------- small pieces
@pytest.mark.parametrize("shape", [(1, 3), (64, 5), (65, 5), (1000, 1), (1001, 33)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fortran_copy_is_exact(shape, dtype):
    A = np.asarray(np.random.default_rng(13).standard_normal(shape), dtype=dtype)
    F = kb._fortran(A, copy=True)
    assert F.flags.f_contiguous and F.dtype == np.float64 and not np.shares_memory(F, A)
    np.testing.assert_array_equal(F, A.astype(np.float64))
    G = np.asfortranarray(A.astype(np.float64))
    assert kb._fortran(G) is G  # no copy when it is column-major float64 already


def test_block_norm2_matches_the_svd():
    R = np.random.default_rng(14).standard_normal((2000, 12)) * np.logspace(0, -3, 12)
    norm2 = kb._block_norm2(R)
    for a, b in [(0, 12), (0, 1), (3, 7), (11, 12), (5, 5)]:
        ref = np.linalg.norm(R[:, a:b], 2) if b > a else 0.0
        assert norm2(a, b) == pytest.approx(ref, rel=1e-12)


def test_columns_grow_and_keep_every_block():
    rng = np.random.default_rng(15)
    cols = kb._Columns(100, 8)
    blocks = [rng.standard_normal((100, 5)), np.asfortranarray(rng.standard_normal((100, 7)))]
    blocks.append(np.ascontiguousarray(rng.standard_normal((100, 3))))
    for b in blocks:
        cols.append(b)
    np.testing.assert_array_equal(cols.view, np.hstack(blocks))
    assert cols.view.flags.f_contiguous
    cols.reset(blocks[1])
    np.testing.assert_array_equal(cols.view, blocks[1])


def test_driver_limit_covers_scipys_blas_too():
    """The basis calls scipy's BLAS (dgemm, dsyrk, dtrmm), numpy's ``@`` numpy's (two
    OpenBLAS copies in the wheels, one library in some installs): the driver's thread
    limit must hold for every BLAS library loaded, and come off afterwards."""
    kb._tn(np.ones((4, 2), order="F"), np.ones((4, 2), order="F"))  # scipy's BLAS loaded

    def threads():
        return {
            i["filepath"]: i["num_threads"]
            for i in threadpool_info()
            if i["user_api"] == "blas"
        }

    with threadpool_limits(limits=2, user_api="blas"):  # above the autouse fixture's 1
        assert threads() and set(threads().values()) == {2}
        with blas_threads_for_driver():
            assert set(threads().values()) == {1}, threads()
        assert set(threads().values()) == {2}


# ------------------------------------------------------- whole solves
def blob_kernel(n=1500):
    X, _ = make_blobs(n, n_features=32, centers=10, random_state=0)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    K = np.exp(-d2 / 32.0)
    K -= K.mean(0)
    K -= K.mean(1)[:, None]
    return (K + K.T) / 2


def rank7(n=1500):
    X = np.random.default_rng(4).standard_normal((n, 7)) * np.arange(7, 0, -1)
    X -= X.mean(0)
    return X @ X.T


@pytest.mark.parametrize("make", [blob_kernel, rank7], ids=["flat-tail", "rank-7"])
@pytest.mark.parametrize("method", ["block_krylov", "subspace"])
def test_whole_solve_is_the_numpy_solve_to_rounding(make, method, monkeypatch):
    """The solver with the BLAS-3 basis and with the numpy formulas: the same passes,
    basis size and certificate, eigenvalues to 1e-12, vectors to 1e-8 (the spaces
    of clusters up to rotation)."""
    A = make(1200)
    kw = dict(tol=1e-8, random_state=0, method=method, max_passes=40)
    new = randomized.randomized_eigh(Dense(A), 16, **kw)
    monkeypatch.setattr(randomized, "_next_block", next_block_ref)
    monkeypatch.setattr(randomized, "_orth", lambda R, overwrite=False: orth_ref(R))
    monkeypatch.setattr(randomized_setup, "_orth", lambda R, overwrite=False: orth_ref(R))
    monkeypatch.setattr(
        randomized,
        "_rank_revealing_orth",
        lambda R, tau, overwrite=False: rank_revealing_ref(R, tau),
    )
    old = randomized.randomized_eigh(Dense(A), 16, **kw)
    assert new.n_passes == old.n_passes
    assert new.info["basis_columns"] == old.info["basis_columns"]
    assert new.converged and old.converged
    assert new.info["certificate"]["certified"] == old.info["certificate"]["certified"]
    np.testing.assert_allclose(new.eigenvalues, old.eigenvalues, rtol=1e-12)
    np.testing.assert_allclose(
        new.info["certificate"]["eigenvalue_bounds"],
        old.info["certificate"]["eigenvalue_bounds"],
        rtol=1e-6,
        atol=1e-13,
    )
    # lone eigenvalues: the same vectors; every returned space the same
    assert projector_gap(new.eigenvectors, old.eigenvectors) < 1e-8
