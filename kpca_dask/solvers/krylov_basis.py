"""Orthonormal bases for the randomized solver (:mod:`.randomized`).

Cholesky QR twice (CholQR2) for well-conditioned panels, Householder QR plus an
SVD of its small factor when a block must be deflated (directions below the
rounding level ``tau`` dropped), block Gram-Schmidt twice against the basis, and
the growing column store of the block Krylov basis.

Memory: every function works on n x c panels (c a block's columns) and the basis
``W`` (n x L) it is given; the small Gram and triangular factors are c x c. No
n x n array is ever formed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.linalg

__all__ = [
    "COND_CHOLQR",
    "_Columns",
    "_krylov_residuals",
    "_next_block",
    "_orth",
    "_rank_revealing_orth",
    "_subspace_residuals",
]


def _orth(R: np.ndarray, gram: np.ndarray | None = None) -> np.ndarray:
    """Orthonormal basis of a tall-skinny, well-conditioned ``R`` (n x c).

    Cholesky QR, twice (CholQR2): two GEMMs and two triangular solves, an
    order of magnitude faster than Householder QR on n x c panels here.
    Falls back to Householder QR when ``R`` is too ill-conditioned for it.
    ``gram``: ``R.T @ R`` when the caller has it already.
    """
    if R.shape[1] == 0:
        return R
    Q = R
    try:
        for it in range(2):
            C = np.linalg.cholesky(gram if it == 0 and gram is not None else Q.T @ Q)
            # Q C^-T as a GEMM with the (tiny) inverse factor: a triangular
            # solve with n right-hand sides is ~10x slower here.
            Cinv = scipy.linalg.solve_triangular(C, np.eye(C.shape[0]), lower=True)
            Q = Q @ Cinv.T
        err = np.abs(Q.T @ Q - np.eye(Q.shape[1])).max()
        if err < 1e-10:
            return np.ascontiguousarray(Q)
    except np.linalg.LinAlgError:
        pass
    return scipy.linalg.qr(R, mode="economic", check_finite=False)[0]


#: Largest condition number of a block that :func:`_rank_revealing_orth` orthonormalises
#: by CholQR2 (its Gram matrix resolves the singular values down to ``1 / COND_CHOLQR``).
COND_CHOLQR = 1e4


def _rank_revealing_orth(R: np.ndarray, tau: float) -> tuple[np.ndarray, float, bool]:
    """Orthonormal basis of the directions of ``R`` whose singular value exceeds ``tau``.

    Returns the basis (n x r, ``r <= c``), the largest dropped singular value (0 if
    none: ``R`` equals its projection on the basis up to that), and whether ``R`` was
    well conditioned. The singular values come from the small Gram matrix when it
    resolves them (condition number at most :data:`COND_CHOLQR` and every singular
    value above ``10 tau``: then the cheap CholQR2 path is taken, nothing is dropped
    and the flag is True), else from Householder QR plus the SVD of its factor.
    """
    c = R.shape[1]
    if c == 0:
        return R, 0.0, True
    G = R.T @ R
    s2 = np.linalg.eigvalsh((G + G.T) / 2)
    smax = float(np.sqrt(max(s2[-1], 0.0)))
    if smax <= tau:
        return np.zeros((R.shape[0], 0)), smax, False
    if s2[0] > s2[-1] / COND_CHOLQR**2 and np.sqrt(max(s2[0], 0.0)) > 10.0 * tau:
        return _orth(R, gram=G), 0.0, True
    Q0, Rf = scipy.linalg.qr(R, mode="economic", check_finite=False)
    U, s, _ = np.linalg.svd(Rf)
    keep = s > tau
    dropped = float(s[~keep].max()) if (~keep).any() else 0.0
    return np.ascontiguousarray(Q0 @ U[:, keep]), dropped, False


def _next_block(
    W: np.ndarray, Y: np.ndarray, tau: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Deflated orthonormal basis of ``Y`` with ``W``'s span removed, ``W^T Y``, and
    the norm of what was dropped.

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
    """
    S = W.T @ Y
    room = W.shape[0] - W.shape[1]
    if room <= 0:
        return np.zeros((W.shape[0], 0)), S, 0.0
    R = Y - W @ S
    R -= W @ (W.T @ R)
    Q, dropped, well_conditioned = _rank_revealing_orth(R, tau)
    if Q.shape[1] > room:  # pragma: no cover - rounding noise beyond the space
        Q = Q[:, :room]
    if Q.shape[1] and not well_conditioned:
        Q -= W @ (W.T @ Q)
        Q = _orth(Q)
    return Q, S, dropped


class _Columns:
    """An n x L array that grows by blocks of columns without copying old ones.

    Column-major storage: appending a block writes contiguous memory and the
    live part ``view`` is a Fortran-contiguous array BLAS takes as is.
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

    def block_res(a, b):
        return np.linalg.norm(Rm[:, a:b], 2)

    return np.linalg.norm(Rm, axis=0), block_res
