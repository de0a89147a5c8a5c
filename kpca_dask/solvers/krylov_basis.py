"""Orthonormal bases for the randomized solver (:mod:`.randomized`).

Cholesky QR twice (CholQR2) for well-conditioned panels, Householder QR plus an
SVD of its small factor when a block must be deflated (directions below the
rounding level ``tau`` dropped), block Gram-Schmidt twice against the basis, and
the growing column store of the block Krylov basis.

Memory: every function works on n x c panels (c a block's columns) and the basis
``W`` (n x L) it is given; the small Gram and triangular factors are c x c. No
n x n array is ever formed.

Speed (issue 29): the basis work is BLAS-3 on column-major (Fortran-ordered)
float64 panels, called through ``scipy.linalg.blas`` so that nothing is copied or
transposed on the way: ``W^T R`` is one ``dgemm`` (``trans_a``), ``R -= W S`` one
``dgemm`` accumulating in place (``beta = 1``), Gram matrices one ``dsyrk`` (half
the flops of ``R.T @ R``), and CholQR's ``Q C^-T`` one in-place ``dtrmm`` with the
small inverse factor. The basis ``W`` (:class:`_Columns`) is column-major, and a
block comes out of :func:`_next_block` column-major, so appending it is one
contiguous copy. What is computed is what the numpy expressions computed, in the
same order, to rounding; numpy's ``@`` on a column-major ``W`` and a row-major
right-hand side took twice as long (measured at n = 20 000, L = 384, one BLAS
thread: ``W @ S`` 24.6 ms against 8.8 ms, docs/solvers.md). Every call runs on the
caller's BLAS thread budget (``threads.blas_threads_for_driver`` for the solver:
threadpoolctl limits both numpy's and scipy's OpenBLAS).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.linalg
from scipy.linalg.blas import dgemm, dsyrk, dtrmm

__all__ = [
    "COND_CHOLQR",
    "_Columns",
    "_block_norm2",
    "_krylov_residuals",
    "_matmul",
    "_next_block",
    "_orth",
    "_rank_revealing_orth",
    "_subspace_residuals",
]


# ----------------------------------------------------------- BLAS-3 helpers
#: Rows per slice when a row-major panel is copied to column-major (:func:`_fortran`).
_TRANSPOSE_ROWS = 64


def _fortran(A: np.ndarray, copy: bool = False) -> np.ndarray:
    """``A`` as a column-major float64 array (copied only when it is not one, or
    when ``copy``).

    A row-major n x c panel (the products ``A Q`` are) is copied in slices of
    :data:`_TRANSPOSE_ROWS` rows, which stay in cache: numpy's one-piece transposing
    copy of a 20 000 x 32 panel took 3.5 ms, the slices 0.6 ms."""
    if A.flags.f_contiguous and A.dtype == np.float64 and not copy:
        return A
    if A.ndim == 2 and A.flags.c_contiguous and A.shape[1] > 1 and A.shape[0] > _TRANSPOSE_ROWS:
        out = np.empty(A.shape, dtype=np.float64, order="F")
        for i in range(0, A.shape[0], _TRANSPOSE_ROWS):
            out[i : i + _TRANSPOSE_ROWS] = A[i : i + _TRANSPOSE_ROWS]
        return out
    if copy:
        return np.array(A, dtype=np.float64, order="F", copy=True)
    return np.asfortranarray(A, dtype=np.float64)


def _tn(W: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``W^T R`` (L x c, column-major) for column-major ``W`` (n x L) and ``R`` (n x c)."""
    if W.shape[1] == 0 or R.shape[1] == 0 or W.shape[0] == 0:
        return np.zeros((W.shape[1], R.shape[1]), order="F")
    return dgemm(1.0, W, R, trans_a=1)


def _minus(W: np.ndarray, S: np.ndarray, R: np.ndarray) -> None:
    """``R -= W S`` in place (``R`` column-major float64, n x c)."""
    if W.shape[1] == 0 or R.shape[1] == 0 or R.shape[0] == 0:
        return
    out = dgemm(-1.0, W, _fortran(S), 1.0, R, overwrite_c=1)
    if out is not R:  # pragma: no cover - f2py works in place on a column-major R
        R[...] = out


def _matmul(W: np.ndarray, U: np.ndarray) -> np.ndarray:
    """``W @ U`` (column-major result) with ``W`` column-major: ``W @ U`` by numpy
    with a row-major ``U`` takes about twice as long."""
    if W.shape[1] == 0 or U.shape[1] == 0 or W.shape[0] == 0:
        return np.zeros((W.shape[0], U.shape[1]), order="F")
    return dgemm(1.0, _fortran(W), _fortran(U))


def _gram(R: np.ndarray) -> np.ndarray:
    """``R^T R`` for column-major ``R`` by ``dsyrk``: its lower triangle, the upper one
    zero (``eigvalsh`` and ``cholesky`` read the lower triangle)."""
    if R.shape[0] == 0:
        return np.zeros((R.shape[1], R.shape[1]), order="F")
    return dsyrk(1.0, R, trans=1, lower=1)


def _block_norm2(R: np.ndarray) -> Callable[[int, int], float]:
    """``(a, b) -> ||R[:, a:b]||_2`` from the small Gram matrix of ``R`` (n x c), computed
    once: the largest singular value from the largest Gram eigenvalue (relative error
    of a few ``eps``), instead of an SVD of an n-row slice per call."""
    G = _gram(_fortran(R)) if R.size else np.zeros((R.shape[1], R.shape[1]))

    def norm2(a: int, b: int) -> float:
        if b <= a or R.shape[0] == 0:
            return 0.0
        top = np.linalg.eigvalsh(G[a:b, a:b])[-1]
        return float(np.sqrt(max(top, 0.0)))

    return norm2


def _cholqr2(Q: np.ndarray, gram: np.ndarray | None) -> bool:
    """CholQR2 in place on the column-major float64 ``Q`` (n x c); ``gram``: its
    Gram matrix's lower triangle when the caller has it. True when the result is
    orthonormal to 1e-10; False (``Q`` then spans the same space, not orthonormal)
    when a Cholesky factorisation failed or the result is not orthonormal."""
    c = Q.shape[1]
    eye = np.eye(c)
    try:
        for it in range(2):
            C = np.linalg.cholesky(gram if it == 0 and gram is not None else _gram(Q))
            # Q C^-T as a product with the (tiny) inverse factor, in place (dtrmm):
            # a triangular solve with n right-hand sides is several times slower
            Cinv = scipy.linalg.solve_triangular(C, eye, lower=True, check_finite=False)
            out = dtrmm(1.0, Cinv, Q, side=1, lower=1, trans_a=1, overwrite_b=1)
            if out is not Q:  # pragma: no cover - f2py works in place on a column-major Q
                Q[...] = out
    except np.linalg.LinAlgError:
        return False
    return bool(np.abs(_gram(Q) - eye).max() < 1e-10)


def _householder(R: np.ndarray, overwrite: bool) -> np.ndarray:
    return scipy.linalg.qr(R, mode="economic", check_finite=False, overwrite_a=overwrite)[0]


def _orth(R: np.ndarray, gram: np.ndarray | None = None, overwrite: bool = False) -> np.ndarray:
    """Orthonormal basis of a tall-skinny, well-conditioned ``R`` (n x c), column-major.

    Cholesky QR, twice (CholQR2): two Gram matrices and two triangular products, an
    order of magnitude faster than Householder QR on n x c panels here.
    Falls back to Householder QR of ``R`` when ``R`` is too ill-conditioned for it.
    ``gram``: the lower triangle of ``R.T @ R`` when the caller has it.
    ``overwrite``: ``R`` is column-major float64 and may be overwritten (the result
    is then ``R`` itself, unless the fallback ran; the fallback then starts from what
    CholQR2 left in ``R``, which spans the same space: the solver only overwrites
    blocks it knows to be well conditioned, where the fallback does not run).
    """
    if R.shape[1] == 0:
        return R
    in_place = overwrite and R.dtype == np.float64 and R.flags.f_contiguous
    Q = R if in_place else _fortran(R, True)
    if _cholqr2(Q, gram):
        return Q
    if in_place:
        return _householder(Q, overwrite=True)
    Rf = _fortran(R)  # float64, the caller's R untouched
    return _householder(Rf, overwrite=Rf is not R)


#: Largest condition number of a block that :func:`_rank_revealing_orth` orthonormalises
#: by CholQR2 (its Gram matrix resolves the singular values down to ``1 / COND_CHOLQR``).
COND_CHOLQR = 1e4


def _rank_revealing_orth(
    R: np.ndarray, tau: float, overwrite: bool = False
) -> tuple[np.ndarray, float, bool]:
    """Orthonormal basis of the directions of ``R`` whose singular value exceeds ``tau``.

    Returns the basis (n x r, ``r <= c``, column-major), the largest dropped singular
    value (0 if none: ``R`` equals its projection on the basis up to that), and whether
    ``R`` was well conditioned. The singular values come from the small Gram matrix
    when it resolves them (condition number at most :data:`COND_CHOLQR` and every
    singular value above ``10 tau``: then the cheap CholQR2 path is taken, nothing is
    dropped and the flag is True), else from Householder QR plus the SVD of its factor.
    ``overwrite``: ``R`` (column-major float64) may be overwritten.
    """
    c = R.shape[1]
    if c == 0:
        return R, 0.0, True
    own = overwrite and R.dtype == np.float64 and R.flags.f_contiguous
    Rf = R if own else _fortran(R)
    scratch = own or Rf is not R  # Rf may be overwritten
    G = _gram(Rf)
    s2 = np.linalg.eigvalsh(G)
    smax = float(np.sqrt(max(s2[-1], 0.0)))
    if smax <= tau:
        return np.zeros((R.shape[0], 0), order="F"), smax, False
    if s2[0] > s2[-1] / COND_CHOLQR**2 and np.sqrt(max(s2[0], 0.0)) > 10.0 * tau:
        return _orth(Rf, gram=G, overwrite=scratch), 0.0, True
    Q0, Rt = scipy.linalg.qr(Rf, mode="economic", check_finite=False, overwrite_a=scratch)
    U, s, _ = np.linalg.svd(Rt)
    keep = s > tau
    dropped = float(s[~keep].max()) if (~keep).any() else 0.0
    return _matmul(Q0, U[:, keep]), dropped, False


def _next_block(
    W: np.ndarray, Y: np.ndarray, tau: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Deflated orthonormal basis of ``Y`` with ``W``'s span removed (column-major),
    ``W^T Y``, and the norm of what was dropped.

    Classical block Gram-Schmidt twice (CGS2), then rank-revealing
    orthonormalisation. After CGS2, ``W^T R`` is at the rounding level of ``R``
    itself, ``eps ||R||``, and normalising ``R`` scales that by ``||R|| /
    sigma_min(R)``: when ``R`` is well conditioned (CholQR2 path: condition number
    at most ``COND_CHOLQR``, every singular value above ``10 tau``, so ``||R||`` is
    not mostly rounding of ``Y``) the new block is orthogonal to ``W`` to ``1e4 eps``
    and is kept as is. Otherwise (directions kept just above ``tau`` amplify the
    rounding of the projection by up to ``||R|| / tau``) it is projected once more
    and re-orthonormalised. Skipping it where it is not needed saves about a third of
    this function's work (docs/tuning.md).

    Work: four ``dgemm`` of n x L x c (two per projection, the second accumulating
    in place), the block's ``dsyrk`` Gram matrices and two in-place ``dtrmm``; one
    copy of ``Y`` (into the column-major remainder ``R``, which becomes the block).
    """
    Wf = _fortran(W)  # the solver's basis is column-major already: no copy
    R = _fortran(Y, copy=True)  # Y is kept by the caller
    S = _tn(Wf, R)
    room = W.shape[0] - W.shape[1]
    if room <= 0:
        return np.zeros((W.shape[0], 0), order="F"), S, 0.0
    _minus(Wf, S, R)
    _minus(Wf, _tn(Wf, R), R)
    Q, dropped, well_conditioned = _rank_revealing_orth(R, tau, overwrite=True)
    if Q.shape[1] > room:  # pragma: no cover - rounding noise beyond the space
        Q = Q[:, :room]
    if Q.shape[1] and not well_conditioned:
        Q = _fortran(Q)
        _minus(Wf, _tn(Wf, Q), Q)
        Q = _orth(Q, overwrite=True)
    return Q, S, dropped


class _Columns:
    """An n x L array that grows by blocks of columns without copying old ones.

    Column-major storage: appending a block writes contiguous memory (one copy of
    contiguous memory when the block is column-major, as :func:`_next_block`'s are;
    a row-major block is transposed on the way, ten times slower) and the live part
    ``view`` is a Fortran-contiguous array BLAS takes as is.
    """

    def __init__(self, n: int, capacity: int):
        self._buf = np.empty((n, max(1, capacity)), dtype=np.float64, order="F")
        self.width = 0

    def append(self, block: np.ndarray) -> None:
        need = self.width + block.shape[1]
        if need > self._buf.shape[1]:
            grown = np.empty(
                (self._buf.shape[0], max(need, 2 * self._buf.shape[1])),
                dtype=np.float64,
                order="F",
            )
            grown[:, : self.width] = self._buf[:, : self.width]
            self._buf = grown
        self._buf[:, self.width : need] = block
        self.width = need

    def reset(self, block: np.ndarray) -> None:
        self.width = 0
        self.append(block)

    @property
    def view(self) -> np.ndarray:
        return self._buf[:, : self.width]


def _krylov_residuals(
    Q_next: np.ndarray, Y: np.ndarray, U_last: np.ndarray, drop2: float
) -> tuple[np.ndarray, Callable[[int, int], float]]:
    """Residual bounds of block Krylov's Ritz pairs, free: ``A W - W M = Q_next H +
    E`` with ``H = Q_next^T A Q_last`` and ``E`` the dropped directions, so pair i's
    residual is at most ``||H u_i(last block)|| + ||E||`` (``U_last``: the last
    block's rows of the Ritz coordinates). Memory: l x L."""
    B = (Q_next.T @ Y) @ U_last
    res = np.linalg.norm(B, axis=0) + np.sqrt(drop2)
    drop = float(np.sqrt(drop2))

    def block_res(a, b):
        return (np.linalg.norm(B[:, a:b], 2) if B.size else 0.0) + drop

    return res, block_res


def _subspace_residuals(
    Y: np.ndarray, W: np.ndarray, U: np.ndarray, theta: np.ndarray
) -> tuple[np.ndarray, Callable[[int, int], float]]:
    """Exact residuals of subspace iteration's Ritz pairs (``W`` is the block ``Q``,
    ``Y = A Q``). Memory: n x l."""
    Rm = Y @ U - W @ (U * theta)
    return np.linalg.norm(Rm, axis=0), _block_norm2(Rm)
