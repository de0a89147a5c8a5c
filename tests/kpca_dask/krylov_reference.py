"""The block-Krylov basis as plain numpy expressions (the code before the BLAS-3 basis of
issue 29), and a dense operator: the reference of tests/kpca_dask/test_krylov_basis.py
and the "before" of benchmarks/bench_krylov_basis.py (one copy for both).

The ``overwrite`` keywords are accepted and ignored, so that these can stand in for
``kpca_dask.solvers.krylov_basis``'s functions."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from kpca_dask.solvers import krylov_basis as kb


class Dense:
    """A symmetric matrix as the solvers' operator (``n``, ``matmul``)."""

    def __init__(self, A):
        self.A = A

    @property
    def n(self):
        return self.A.shape[0]

    def matmul(self, Z):
        return self.A @ Z


def orth_ref(R, gram=None, overwrite=False):
    """CholQR2 as numpy expressions, Householder QR when it fails."""
    if R.shape[1] == 0:
        return R
    Q = R
    try:
        for it in range(2):
            C = np.linalg.cholesky(gram if it == 0 and gram is not None else Q.T @ Q)
            Cinv = scipy.linalg.solve_triangular(C, np.eye(C.shape[0]), lower=True)
            Q = Q @ Cinv.T
        if np.abs(Q.T @ Q - np.eye(Q.shape[1])).max() < 1e-10:
            return np.ascontiguousarray(Q)
    except np.linalg.LinAlgError:
        pass
    return scipy.linalg.qr(R, mode="economic", check_finite=False)[0]


def rank_revealing_ref(R, tau, overwrite=False):
    if R.shape[1] == 0:
        return R, 0.0, True
    G = R.T @ R
    s2 = np.linalg.eigvalsh((G + G.T) / 2)
    smax = float(np.sqrt(max(s2[-1], 0.0)))
    if smax <= tau:
        return np.zeros((R.shape[0], 0)), smax, False
    if s2[0] > s2[-1] / kb.COND_CHOLQR**2 and np.sqrt(max(s2[0], 0.0)) > 10.0 * tau:
        return orth_ref(R, gram=G), 0.0, True
    Q0, Rf = scipy.linalg.qr(R, mode="economic", check_finite=False)
    U, s, _ = np.linalg.svd(Rf)
    keep = s > tau
    dropped = float(s[~keep].max()) if (~keep).any() else 0.0
    return np.ascontiguousarray(Q0 @ U[:, keep]), dropped, False


def next_block_ref(W, Y, tau):
    S = W.T @ Y
    room = W.shape[0] - W.shape[1]
    if room <= 0:
        return np.zeros((W.shape[0], 0)), S, 0.0
    R = Y - W @ S
    R -= W @ (W.T @ R)
    Q, dropped, well = rank_revealing_ref(R, tau)
    if Q.shape[1] and not well:
        Q = Q - W @ (W.T @ Q)
        Q = orth_ref(Q)
    return Q, S, dropped
