"""Randomized eigensolvers on an implicit symmetric operator, with a certificate.

The operator ``A`` (here the centred kernel matrix) is only touched through
products ``A @ Z``; each product is one pass over the kernel blocks and is by
far the dominant cost, so the algorithms below are organised to get the most
out of every pass. Everything else (QR, small eigendecompositions, n x L
GEMMs on the driver) is cheap in comparison.

``method="block_krylov"`` (default; Musco and Musco 2015)
    Keeps every block ``W = [Q_0, Q_1, ...]`` with ``Q_{i+1} = orth(A Q_i``
    minus its projection on ``W)``. Gap-independent convergence: on flat
    spectra it reaches a given accuracy in far fewer passes than subspace
    iteration.
``method="subspace"`` (Halko, Martinsson and Tropp 2011)
    ``Q <- orth(A Q)``; memory stays at ``2 n l`` floats.

Deflation. Every new block is orthonormalised rank-revealingly: directions
whose singular value is below ``tau = eps * sqrt(n) * ||A||`` (the rounding
level of one product) are dropped, so a kernel whose numerical rank is below
the block size yields a smaller block, then an empty one (the Krylov space is
invariant: the result is exact). Nothing is ever solved with a singular
matrix.

Finish: Rayleigh-Ritz on the multiplied basis ``W``. ``M = W^T A W`` is
assembled exactly from the products (each ``W^T A Q_i`` computed once, and
mirrored), so the Ritz values are right in any orthonormal basis, however low
the rank.

Certificate (free, every pass): for block Krylov ``A W - W M = Q_next H +
E`` with ``H = Q_next^T A Q_last`` and ``E`` the dropped directions, so the
residual of a Ritz pair ``(theta, W u)`` is at most ``||H u_last|| +
||E||``; subspace iteration computes it from ``A Q`` directly. From the
residuals and the gaps between Ritz values, :func:`.certificate.certify` states
per pair what is proven (Weyl, Kato-Temple and Davis-Kahan bounds; isolated
eigenvalues to ``tol``, clusters of nearly equal ones to ``tol**0.75``, a flat
tail cut by ``k`` by its eigenvalues only, to ``tail_tol``): ``certified``
("vector", "subspace" or "eigenvalue only"), ``eigenvalue_levels`` and the bounds
reached, ``tail_start``.

Stopping: with ``n_power_iter="auto"`` the iteration stops as soon as the
certificate holds for every returned pair (docs/solvers.md). One last pass
computes ``A V`` for the returned vectors: Rayleigh-Ritz on them sharpens the
eigenvalues and gives their exact residuals (``residuals_``), and the certificate
is re-checked on them: ``converged`` is True only if it holds for every returned
pair, else a :class:`~kpca_dask.exceptions.ConvergenceWarning` (``warn=True``).

Only pairs that exist are returned: Ritz values above ``max(rank_rtol *
theta_1, tau)``; a kernel of numerical rank r < k gives r pairs. The test
matrix depends on the seed alone, never on the chunking.

Memory model: the driver holds the basis ``W`` (n x L float64, L = l * passes,
capped by ``max_basis`` with a restart), the latest product (n x l) and small
L x L matrices -- nothing of size n^2, and the products ``A W`` are not kept.
Each function below states what it adds to that.

Layout: :func:`randomized_eigh` runs :func:`_iterate` (multiply, project,
Rayleigh-Ritz), :func:`_certify_step` and :func:`_advance` per pass, then
:func:`_certification_pass`; settings and the first block are in
:mod:`.randomized_setup`, bases in :mod:`.krylov_basis`, the certificate in
:mod:`.certificate`.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..exceptions import ConvergenceWarning
from ..threads import blas_threads_for_driver
from ._common import EigResult, deterministic_signs
from .certificate import Certificate, certify, not_converged_message
from .krylov_basis import (
    _block_norm2,
    _Columns,
    _krylov_residuals,
    _matmul,
    _next_block,
    _orth,
    _rank_revealing_orth,
    _subspace_residuals,
)
from .randomized_setup import (
    DEFAULT_N_OVERSAMPLES,
    _first_block,
    _generator,  # noqa: F401  (kpca_dask._solve and _preimage_fit import it from here)
    _n_existing,
    _rayleigh_ritz,
    _Settings,
    _settings,
    _tail_level,
    default_max_basis,
    default_rank_rtol,
    default_tail_tol,
    escalation_plan,
)

__all__ = [
    "DEFAULT_N_OVERSAMPLES",
    "default_max_basis",
    "default_rank_rtol",
    "default_tail_tol",
    "randomized_eigh",
    "SymmetricOperator",
    "certify",
    "Certificate",
    "escalation_plan",
    "not_converged_message",
]

logger = logging.getLogger("kpca_dask")


class SymmetricOperator(Protocol):
    """What the solver needs from an operator: its size and products."""

    @property
    def n(self) -> int: ...

    def matmul(self, Z: np.ndarray) -> np.ndarray: ...


# --------------------------------------------------------------------- solver
def _driver_blas(fn):
    """Run ``fn`` with the driver's BLAS budget (``threads.blas_threads_for_driver``);
    the products over the kernel blocks set their own budget inside."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with blas_threads_for_driver():
            return fn(*args, **kwargs)

    return wrapper


@_driver_blas
def randomized_eigh(
    op: SymmetricOperator,
    n_components: int,
    *,
    n_oversamples: int = DEFAULT_N_OVERSAMPLES,
    n_power_iter: int | str = "auto",
    method: str = "block_krylov",
    tol: float = 1e-7,
    max_passes: int = 20,
    max_basis: int | None = None,
    psd: bool = True,
    eps: float = float(np.finfo(np.float64).eps),
    random_state: Any = None,
    callback=None,
    centre: bool = True,
    rank_rtol: float | None = None,
    cluster_rtol: float | None = None,
    tail_tol: float | None = None,
    warn: bool = True,
    v0: np.ndarray | None = None,
    certification_pass: bool = True,
    tail_floor: bool = True,
) -> EigResult:
    """Leading eigenpairs of a symmetric operator by randomized iteration, certified.

    Parameters
    ----------
    op : object with ``n`` and ``matmul(Z) -> ndarray``
        The operator. Every ``matmul`` is one pass over the data.
    n_components : int
        Eigenpairs wanted (k). Fewer are returned when the operator has fewer
        (numerically non-zero) eigenvalues above ``rank_rtol``.
    n_oversamples : int, default=16
        Extra columns per block, ``l = k + n_oversamples``.
    n_power_iter : int or "auto", default="auto"
        Passes after the first. "auto" iterates until the certificate holds
        (at most ``max_passes``).
    method : {"block_krylov", "subspace"}, default="block_krylov"
    tol : float, default=1e-7
        Relative eigenvalue accuracy certified (``tol**0.75`` inside clusters of
        nearly equal eigenvalues); eigenvectors (or the invariant subspaces of
        clusters) are certified to an angle of ``sqrt(tol)``.
    max_passes : int, default=20
        Cap on the iteration passes for "auto" (the certification pass is extra).
    max_basis : int, optional
        Block Krylov restarts from its current best vectors before its basis
        would exceed this many columns (bounds driver memory at
        ``n * max_basis`` floats). Default :func:`default_max_basis`: a
        128 MB basis, between 512 and 2048 columns (a restart throws away
        the Krylov space: on a flat tail at n = 5000 it cost 6 more passes).
    psd : bool, default=True
        Whether the operator is positive semi-definite. Informational only:
        both cases use the Rayleigh-Ritz finish (top-k algebraic eigenvalues).
    eps : float
        Unit roundoff of the products (float32 kernels: ``finfo(float32).eps``);
        sets the rounding level ``tau = eps * sqrt(n) * ||A||`` below which
        directions are dropped and tolerances are not asked for.
    random_state : int, Generator, RandomState or None
        Seed of the Gaussian test matrix (drawn whole, n x l, so that results
        depend on the seed only, not on any chunking).
    callback : callable, optional
        Called as ``callback(pass_index, estimates)`` after every pass.
    centre : bool, default=True
        Centre the test matrix, restart blocks and certified vectors (remove
        their column means). Right for the centred kernel matrix, whose null
        vector ``1`` carries no information; turn it off for operators
        without that null vector (the Nyström feature covariance).
    rank_rtol : float, optional
        Ritz values at or below ``rank_rtol * theta_1`` count as zero and are
        not returned (default :func:`default_rank_rtol`).
    cluster_rtol : float, optional
        Ritz values closer than this (relative) form a cluster whose invariant
        subspace is certified instead of its individual vectors (default
        ``min(0.05, 100 * sqrt(tol))``: 1e-2 for tol=1e-8, 0.05 for 1e-5).
    tail_tol : float, optional
        When ``k`` cuts a run of Ritz values whose relative gaps are all below
        5 % (a flat tail), no gap defines those vectors or their subspace,
        and their eigenvalues are certified to ``tail_tol`` (relative) instead
        of ``tol`` (default :func:`default_tail_tol`: ``min(0.01, 100 *
        sqrt(tol))``, 0.01 for tol=1e-8 and 1e-5, 1e-4 for tol=1e-12). 0
        disables the tail rule (every eigenvalue to ``tol``).
    warn : bool, default=True
        Emit a ConvergenceWarning when the result is not certified.
    v0 : ndarray of shape (n, j), optional
        Starting vectors (a warm start): approximations of the leading
        eigenvectors, e.g. a previous fit's extended to new rows
        (:func:`kpca_dask.update.warm_start_vectors`). They take the first ``j``
        columns of the first block (at most ``l``; columns that are zero or
        linearly dependent are dropped); the seed's Gaussian columns fill the
        rest. The certificate and the stopping rule are the same as from a
        random start: a good start only makes it hold after fewer passes. The
        number of columns used is ``info["warm_start"]``.
    certification_pass : bool, default=True
        Spend one more pass on ``A V`` for the returned vectors, to measure their
        residuals (``residuals``) and re-check the certificate on them. False:
        return the last iteration's Ritz pairs with its certificate (the same
        proven bounds, from ``A W - W M = Q_next H + E``; the measured residuals
        differ from them by rounding) and one pass fewer; ``residuals`` are then
        those bounds (upper bounds of the measured ones).
    tail_floor : bool, default=True
        Whether the rounding level ``tau`` counts toward the flat tail's level, as it
        does toward every other level. False (mixed precision's float32 iteration,
        whose pairs a float64 pass then certifies without ``tau32``): the tail's
        eigenvalues stop at ``tail_tol - tau / theta_k`` (at least ``tail_tol / 2``),
        so that a bound the float32 run accepts meets ``tail_tol`` by itself.

    Memory (driver): the basis ``W`` (n x L float64, L <= ``max_basis`` + l),
    one product ``A Q`` (n x l) and its projection residual (n x l), and
    L x L matrices; the certification pass adds ``V`` and ``A V`` (n x k each).
    """
    # long: its numpydoc parameter list; the code below is about 60 lines
    s = _settings(
        op.n,
        n_components,
        n_oversamples=n_oversamples,
        n_power_iter=n_power_iter,
        method=method,
        tol=tol,
        max_passes=max_passes,
        max_basis=max_basis,
        eps=eps,
        centre=centre,
        rank_rtol=rank_rtol,
        cluster_rtol=cluster_rtol,
        tail_tol=tail_tol,
        tail_floor=tail_floor,
    )
    Q, n_warm = _first_block(s, random_state, v0)
    kry = _Krylov(s, Q)
    history: list[float] = []
    prev: np.ndarray | None = None
    t_start = time.perf_counter()
    p = 0
    for p in range(1, s.n_passes + 1):
        step = _iterate(op, kry, Q)
        cert = _certify_step(step, s)
        est = step.theta[: s.k]
        if prev is not None and len(prev) == len(est):
            scale = np.maximum(np.abs(est), np.finfo(float).tiny)
            history.append(float(np.max(np.abs(est - prev) / scale)))
        prev = est
        _log_pass(p, kry, step, cert)
        if callback is not None:
            callback(p, est.copy())
        if (not s.fixed and cert["ok"]) or p == s.n_passes or step.exhausted:
            break
        Q = _advance(kry, step)
    if certification_pass:
        fin, n_passes = _certification_pass(op, kry, step), p + 1
    else:
        fin, n_passes = _from_last_pass(kry, step, cert), p
    converged = bool(fin.cert["ok"])
    if not converged and warn:
        warnings.warn(
            not_converged_message(fin.cert, n_passes, tol), ConvergenceWarning, stacklevel=2
        )
    info = {
        "solver": "randomized",
        "method": method,
        "block_columns": s.l,
        "finish": "rayleigh_ritz" if certification_pass else "last_pass",
        "basis_columns": int(kry.M.shape[0]),
        "rank_found": int(fin.k),
        "exhausted": bool(step.exhausted),
        "relative_changes": history,
        "warm_start": int(n_warm),
        "certificate": dict(fin.cert),
        "seconds": time.perf_counter() - t_start,
    }
    return EigResult(
        eigenvalues=fin.theta,
        eigenvectors=fin.vectors,
        residuals=fin.residuals,
        n_passes=n_passes,
        converged=converged,
        info=info,
    )


class _Krylov:
    """The iteration's state: the basis ``W`` (its multiplied columns plus the
    block ``Q`` to multiply next), ``M = W^T A W`` over the multiplied columns, the
    squared norm of the directions dropped since the last restart, and the
    estimate of ``||A||``. Memory: ``W`` (n x L float64, grown in place) and M (L x L).
    """

    def __init__(self, s: _Settings, Q: np.ndarray):
        self.s = s
        blocks = s.n_passes + 1 if s.method == "block_krylov" else 1
        self.W = _Columns(s.n, min(s.l * blocks, s.max_basis + s.l))
        self.W.append(Q)
        self.M = np.zeros((0, 0))
        self.drop2 = 0.0
        self.normA = 0.0


class _Step(NamedTuple):
    """One pass's outcome: Ritz values and coordinates (in ``W``), residual bounds,
    the next block, and what is known of the spectrum below (:func:`_iterate`)."""

    theta: np.ndarray
    U: np.ndarray
    res: np.ndarray
    block_res: Callable[[int, int], float]
    Y: np.ndarray  # A Q (subspace iteration restarts from it)
    Q_next: np.ndarray
    tau: float
    exhausted: bool
    below: float | None


def _iterate(op: SymmetricOperator, kry: _Krylov, Q: np.ndarray) -> _Step:
    """One pass: ``Y = A Q``, the next block (``Y`` without ``W``'s span), ``M``
    grown by the new column block and its mirror, Rayleigh-Ritz and residuals.

    Memory: ``Y`` and its projection residual (n x l each) besides the basis.
    """
    s = kry.s
    Y = op.matmul(Q)
    L0 = kry.M.shape[0]
    W = kry.W.view  # multiplied columns plus Q (the last block)
    G = Y.T @ Y
    top = float(np.sqrt(max(np.linalg.eigvalsh((G + G.T) / 2)[-1], 0.0)))
    kry.normA = max(kry.normA, top)
    tau = s.noise * kry.normA
    Q_next, S, dropped = _next_block(W, Y, tau)
    kry.drop2 += dropped**2
    # grow M by the new column block S (rows: every column of W) and its mirror
    kry.M = np.block([[kry.M, S[:L0]], [S[:L0].T, (S[L0:] + S[L0:].T) / 2]])
    theta, U = _rayleigh_ritz(kry.M)
    if s.method == "block_krylov":
        res, block_res = _krylov_residuals(Q_next, Y, U[L0 : L0 + Y.shape[1]], kry.drop2)
        exhausted = Q_next.shape[1] == 0  # invariant subspace reached: exact to tau
        spans_range = exhausted
    else:
        res, block_res = _subspace_residuals(Y, W, U, theta)
        exhausted = Q_next.shape[1] == 0
        spans_range = Q.shape[1] < s.l  # A Q lost columns to deflation: rank below l
    # the rest of the spectrum is zero (to tau) once the basis holds range(A)
    below = tau if spans_range else None
    return _Step(theta, U, res, block_res, Y, Q_next, tau, exhausted, below)


def _certify_step(step: _Step, s: _Settings) -> Certificate:
    """The certificate of a pass's Ritz pairs (:func:`certify`)."""
    return _certify(step.theta, step.res, step.block_res, step, s)


def _certify(
    theta: np.ndarray,
    res: np.ndarray,
    block_res: Callable[[int, int], float],
    step: _Step,
    s: _Settings,
) -> Certificate:
    """:func:`certify` with the solver's levels, for the returned pairs of ``step``."""
    return certify(
        theta,
        res,
        _n_existing(step.theta, s.k, s.rank_rtol, step.tau),
        block_res,
        tol=s.tol,
        floor=step.tau,
        cluster_rtol=s.cluster_rtol,
        angle_tol=s.angle_tol,
        below=step.below,
        cluster_tol=s.tol**0.75,
        tail_tol=_tail_level(theta, step.tau, s),
    )


def _log_pass(p: int, kry: _Krylov, step: _Step, cert: Certificate) -> None:
    logger.info(
        "randomized solver: pass %d, %d basis columns, top eigenvalue %.6g, "
        "max eigenvalue bound %.2e, max angle bound %.2e%s",
        p,
        kry.M.shape[0],
        step.theta[0],
        max(cert["eigenvalue_bounds"], default=0.0),
        max(cert["angle_bounds"], default=0.0),
        " (exhausted)" if step.exhausted else "",
    )


def _advance(kry: _Krylov, step: _Step) -> np.ndarray:
    """The block to multiply next, with the basis updated: subspace iteration
    restarts from ``orth(A Q)``; block Krylov appends the new block, or restarts
    from its current best ``l`` vectors when the basis would exceed ``max_basis``
    columns (which bounds the driver's memory at ``n (max_basis + l)`` floats)."""
    s = kry.s
    if s.method == "subspace":
        Q, d, _ = _rank_revealing_orth(step.Y, step.tau)
        kry.W.reset(Q)
        kry.M, kry.drop2 = np.zeros((0, 0)), d**2
        return Q
    if kry.W.width + step.Q_next.shape[1] > s.max_basis:
        # Restart from the current best approximations.
        Q = _orth(s.prep(_matmul(kry.W.view, step.U[:, : s.l])), overwrite=True)
        kry.W.reset(Q)
        kry.M, kry.drop2 = np.zeros((0, 0)), 0.0
        logger.info("randomized solver: restart (basis would exceed %d columns)", s.max_basis)
        return Q
    kry.W.append(step.Q_next)
    return step.Q_next


class _Final(NamedTuple):
    """The certification pass's outcome (:func:`_certification_pass`)."""

    k: int
    theta: np.ndarray
    vectors: np.ndarray
    residuals: np.ndarray  # relative: ||A v - theta v|| / |theta|
    cert: Certificate


def _certification_pass(op: SymmetricOperator, kry: _Krylov, step: _Step) -> _Final:
    """One more pass, ``A V`` for the returned vectors ``V``: Rayleigh-Ritz on them
    (sharper eigenvalues), their exact residuals, and the certificate on the final
    pairs, with the iteration's Ritz values beyond them (and their residual bounds)
    for the gaps. Memory: ``V``, ``A V`` and the residuals (n x k each)."""
    s = kry.s
    k_ret = _n_existing(step.theta, s.k, s.rank_rtol, step.tau)
    Wm = kry.W.view[:, : kry.M.shape[0]]
    V = s.prep(_matmul(Wm, step.U[:, :k_ret]))
    V = _orth(V, overwrite=True) if k_ret else V
    AV = op.matmul(V) if k_ret else np.zeros((s.n, 0))
    th2, U2 = _rayleigh_ritz(V.T @ AV)
    Vr, AVr = V @ U2, AV @ U2
    Rf = AVr - Vr * th2
    r2 = np.linalg.norm(Rf, axis=0)
    th_all = np.concatenate([th2, step.theta[k_ret:]])
    res_all = np.concatenate([r2, step.res[k_ret:]])
    rf_norm2 = _block_norm2(Rf)

    def final_block_res(a, b):
        inner = rf_norm2(a, min(b, k_ret)) if a < k_ret else 0.0
        outer = step.block_res(max(a, k_ret), b) if b > k_ret else 0.0
        return float(np.hypot(inner, outer))

    cert = _certify(th_all, res_all, final_block_res, step, s)
    with np.errstate(divide="ignore", invalid="ignore"):
        residuals = r2 / np.abs(th2)
    return _Final(k_ret, th2, deterministic_signs(Vr), residuals, cert)


def _from_last_pass(kry: _Krylov, step: _Step, cert: Certificate) -> _Final:
    """The last pass's Ritz pairs as the result, without a certification pass: the
    vectors ``W u_i``, their Ritz values, and as residuals the proven bounds
    ``||H u_i(last block)|| + ||E||`` that ``cert`` was computed from. Memory: V
    (n x k)."""
    s = kry.s
    k_ret = _n_existing(step.theta, s.k, s.rank_rtol, step.tau)
    V = kry.W.view[:, : kry.M.shape[0]] @ step.U[:, :k_ret]  # row-major, as returned
    theta = step.theta[:k_ret].copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        residuals = step.res[:k_ret] / np.abs(theta)
    return _Final(k_ret, theta, deterministic_signs(V), residuals, cert)
