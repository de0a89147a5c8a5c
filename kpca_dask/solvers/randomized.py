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
assembled exactly from the products (each ``W^T A Q_i`` is computed once, and
mirrored), so the Ritz values are right in any orthonormal basis, however low
the rank. (The randomized Nyström finish used before needed a Cholesky factor
of ``W^T A W``, singular for low-rank kernels: it returned wrong pairs.)

Certificate (free, every pass): for block Krylov ``A W - W M = Q_next H +
E`` with ``H = Q_next^T A Q_last`` and ``E`` the dropped directions, so the
residual of a Ritz pair ``(theta, W u)`` is at most ``||H u_last|| +
||E||``; subspace iteration computes it from ``A Q`` directly. From the
residuals and the gaps between Ritz values (:func:`certify`):

* eigenvalues: ``|theta - lambda| <= min(r, R_C^2 / gap_C)`` (Weyl;
  Kato-Temple / quadratic residual bound for the cluster C of the pair);
  isolated eigenvalues are certified to ``tol``, those inside a cluster of
  nearly equal ones to ``tol**0.75`` (1e-6 for tol=1e-8, a ten-thousandth of
  the cluster's width at most), which keeps flat tails cheaper;
* vectors: for a cluster C of nearly equal Ritz values (relative gaps below
  ``cluster_rtol``) only the invariant subspace is well defined, and
  ``sin angle <= R_C / gap_C`` (Davis-Kahan) certifies it; a lone pair is a
  cluster of one. A flat spectral tail is thus certified as a subspace, not
  vector by vector; when ``k`` cuts a cluster, the returned part of it is not
  defined by the problem and only its eigenvalues are certified.
* the flat tail (issue 17): when ``k`` cuts a run of Ritz values whose
  relative gaps are all below ``tail_rtol`` (5 %), no gap defines the vectors
  or a subspace of any part of it, and only Weyl's bound (linear in the
  residual) certifies its eigenvalues: they are certified to ``tail_tol``
  (default ``min(0.01, 100 * sqrt(tol))``: 1 % for the default tolerances,
  the pipeline's default ``solver.max_residual``), their vectors not at all
  ("eigenvalue only"). Chasing them to ``tol**0.75`` cost 20 passes instead
  of 11 on clustered data (10 blobs, k = 16; docs/solvers.md).

The certificate records per pair what was certified (``certified``: "vector",
"subspace" or "eigenvalue only"), the eigenvalue level asked
(``eigenvalue_levels``) and bound reached, the angle bound, and the tail's
first index (``tail_start``, None without a tail).

Stopping: with ``n_power_iter="auto"`` the iteration stops as soon as the
certificate holds for every returned pair: eigenvalue bound ``<= tol * theta
+ tau`` (``tol**0.75`` inside a cluster, ``tail_tol`` in the tail) and angle
bound, weighted by the embedding scale ``sqrt(theta / theta_1)``, ``<= sqrt(tol)``
(up to the rounding level ``tau``; docs/solvers.md). One last pass computes
``A V`` for the returned vectors: a Rayleigh-Ritz step on them sharpens the
eigenvalues and gives their exact residuals (``residuals_``), and the certificate
is re-checked on them: ``converged`` is True only if it holds for every returned
pair. Otherwise a :class:`~kpca_dask.exceptions.ConvergenceWarning` is emitted
(``warn=True``).

Only pairs that exist are returned: Ritz values above ``max(rank_rtol *
theta_1, tau)``; a kernel of numerical rank r < k gives r pairs.

The random test matrix is drawn from the seed alone (never from the
chunking), so results depend only on ``random_state``.

Memory model: the driver holds the basis ``W`` (n x L float64, L = l * passes,
capped by ``max_basis`` with a restart), the latest product (n x l) and small
L x L matrices -- nothing of size n^2, and the products ``A W`` are not kept.

Threads: the driver's algebra runs on one BLAS thread
(``threads.blas_threads_for_driver``); the products set their own budget.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import scipy.linalg

from ..exceptions import ConvergenceWarning
from ..threads import blas_threads_for_driver
from ..validation import check_start_vectors
from ._common import EigResult, deterministic_signs

__all__ = [
    "randomized_eigh",
    "SymmetricOperator",
    "certify",
    "Certificate",
    "escalation_plan",
    "not_converged_message",
]

logger = logging.getLogger("kpca_dask")

#: Default extra columns of the randomized block (``l = k + n_oversamples``), shared by
#: the estimator and the solvers; chosen by whole-fit timings (docs/solvers.md, "The
#: block size").
DEFAULT_N_OVERSAMPLES = 16


class SymmetricOperator(Protocol):
    """What the solver needs from an operator: its size and products."""

    @property
    def n(self) -> int: ...

    def matmul(self, Z: np.ndarray) -> np.ndarray: ...


# ------------------------------------------------------------ orthogonalisation
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


def _centre(Z: np.ndarray) -> np.ndarray:
    return Z - Z.mean(axis=0, keepdims=True)


def _identity(Z: np.ndarray) -> np.ndarray:
    return Z


def _rayleigh_ritz(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ritz values of A on span(W) from ``M = W^T A W``, descending, and their coordinates."""
    M = (M + M.T) / 2
    theta, U = np.linalg.eigh(M)
    order = np.argsort(theta)[::-1]
    return theta[order], U[:, order]


# ------------------------------------------------------------------ certificate
class Certificate(dict):
    """The a-posteriori certificate of a set of Ritz pairs (a JSON-ready dict).

    Keys: ``ok`` (every returned pair certified), ``eigenvalue_bounds``
    (relative bound on ``|theta - lambda| / theta`` per returned pair),
    ``angle_bounds`` (bound on the sine of the angle between the pair's
    cluster's Ritz subspace and the invariant subspace it approximates),
    ``clusters`` (cluster index per returned pair), ``cluster_sizes``,
    ``cut_cluster`` (index of the cluster that ``n_components`` cuts, whose
    vectors are not certified individually nor as a subspace, or None),
    ``rounding_level`` (``tau``, absolute), ``eigenvalue_ok``/``vector_ok``.
    """


def _clusters(theta: np.ndarray, rtol: float) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of consecutive (descending) values with relative gaps below ``rtol``."""
    out, a = [], 0
    for i in range(1, len(theta) + 1):
        if i == len(theta) or theta[i - 1] - theta[i] > rtol * max(
            abs(theta[i - 1]), abs(theta[i])
        ):
            out.append((a, i))
            a = i
    return out


def _tail_start(theta: np.ndarray, k: int, rtol: float, below: float | None) -> int:
    """First index of the flat tail that ``k`` cuts (``k`` if there is none).

    The tail is the run of Ritz values ending at ``k - 1`` with consecutive
    relative gaps below ``rtol``; it exists only if the gap below ``k - 1`` is
    below ``rtol`` too (or unknown: no Ritz value beyond ``k`` and no bound on
    the rest of the spectrum).
    """

    def close(i: int) -> bool:  # theta[i] and theta[i + 1] closer than rtol
        return theta[i] - theta[i + 1] <= rtol * max(abs(theta[i]), abs(theta[i + 1]))

    if k == 0:
        return 0
    if k < len(theta):
        if not close(k - 1):
            return k
    elif below is not None and theta[k - 1] - below > rtol * abs(theta[k - 1]):
        return k
    t = k - 1
    while t > 0 and close(t - 1):
        t -= 1
    return t


def certify(
    theta: np.ndarray,
    res: np.ndarray,
    k: int,
    block_residual: Callable[[int, int], float],
    *,
    tol: float,
    floor: float,
    cluster_rtol: float,
    angle_tol: float,
    below: float | None = None,
    cluster_tol: float | None = None,
    tail_tol: float | None = None,
    tail_rtol: float = 0.05,
) -> Certificate:
    """Certify the first ``k`` of the Ritz pairs ``theta`` (descending, all known
    ones: those beyond ``k`` give the gaps) with residual norms ``res``.

    ``block_residual(a, b)`` returns the spectral norm of the residual matrix
    ``A V_C - V_C diag(theta_C)`` of pairs ``a..b-1`` (a bound is fine).
    ``floor`` is the rounding level added to every tolerance. The gap of a
    cluster is the distance of its Ritz values to the nearest other Ritz value,
    each shrunk by that value's residual (a Ritz value within r of an
    eigenvalue). Below the last known Ritz value nothing is assumed (no gap)
    unless ``below`` bounds the rest of the spectrum (an exhausted, invariant
    basis: the rest is zero to the rounding level). Eigenvalues of pairs in a
    cluster of more than one are certified to ``cluster_tol`` (default ``tol``).

    The flat tail (``tail_tol`` None: none): the run of returned Ritz values
    ending at ``k`` whose consecutive relative gaps are below ``tail_rtol``,
    when ``k`` cuts it (the next Ritz value is within ``tail_rtol`` too, or
    nothing is known below). No gap there is wide enough to define vectors or
    subspaces (an angle bound ``R / gap`` with ``R`` at the tail's residual
    level is far above ``angle_tol``), so its pairs are certified by their
    eigenvalues only, to ``tail_tol``.
    """
    ctol = tol if cluster_tol is None else float(cluster_tol)
    m = len(theta)
    eig_b = np.full(k, np.inf)
    ang_b = np.full(k, np.inf)
    cid = np.zeros(k, dtype=int)
    eig_ok = np.zeros(k, dtype=bool)
    vec_ok = np.zeros(k, dtype=bool)
    kind = [""] * k
    sizes = []
    cut = None
    tail = _tail_start(theta, k, tail_rtol, below) if tail_tol is not None else k
    for c, (a, b) in enumerate(_clusters(theta, cluster_rtol)):
        if a >= k:
            break
        sizes.append(b - a)
        up = np.inf if a == 0 else (theta[a - 1] - res[a - 1]) - theta[a]
        if b < m:
            down = theta[b - 1] - (theta[b] + res[b])
        else:
            down = 0.0 if below is None else theta[b - 1] - below
        gap = max(0.0, min(up, down))
        R = float(block_residual(a, b))
        for i in range(a, min(b, k)):
            quad = R * R / gap if gap > 0 else np.inf
            # the flat tail: Weyl's bound, the residual itself (its gaps are too small
            # to trust R^2 / gap, and a published pair's residual is what the
            # pipeline's solver.max_residual judges: tail_tol <= max_residual by default)
            bound = float(res[i]) if i >= tail else min(float(res[i]), quad)
            scale = abs(float(theta[i]))
            eig_b[i] = bound / scale if scale > 0 else np.inf
            level = tail_tol if i >= tail else tol if b - a == 1 else ctol
            eig_ok[i] = bound <= level * scale + floor
            ang_b[i] = min(1.0, R / gap) if gap > 0 else 1.0
            # a cluster cut by k: the returned vectors are an arbitrary part of its
            # subspace, not defined by the problem: only their eigenvalues are
            # certified (which bounds their distance to that subspace too)
            # the angle moves the embedding (v sqrt(theta)) by angle * sqrt(theta):
            # measured against the leading component's scale sqrt(theta_1)
            weight = np.sqrt(abs(float(theta[a])) / abs(float(theta[0]))) if theta[0] else 1.0
            vec_ok[i] = (
                b > k or i >= tail or (R * weight <= angle_tol * gap + floor and gap > 0)
            )
            if i >= tail or b > k:
                kind[i] = "eigenvalue only"
            else:
                kind[i] = "vector" if b - a == 1 else "subspace"
            cid[i] = c
        if a < k < b:
            cut = c
    cert = Certificate(
        ok=bool(eig_ok.all() and vec_ok.all()),
        eigenvalue_ok=eig_ok.tolist(),
        vector_ok=vec_ok.tolist(),
        eigenvalue_bounds=[float(x) for x in eig_b],
        angle_bounds=[float(x) for x in ang_b],
        clusters=cid.tolist(),
        cluster_sizes=sizes,
        cut_cluster=cut,
        tail_start=int(tail) if tail < k else None,
        certified=kind,
        eigenvalue_levels=[
            float(tail_tol if i >= tail else tol if sizes[cid[i]] == 1 else ctol)
            for i in range(k)
        ],
        rounding_level=float(floor),
    )
    return cert


def default_max_basis(n: int, budget_bytes: int = 128 << 20) -> int:
    """Columns of the block Krylov basis before a restart: ``budget_bytes`` of float64,
    at least 512 (the earlier fixed cap) and at most 2048."""
    return int(max(512, min(2048, budget_bytes // (8 * max(1, n)))))


def default_tail_tol(tol: float) -> float:
    """Relative eigenvalue accuracy certified in a flat tail cut by ``k``.

    ``min(0.01, 100 * sqrt(tol))``: 1 % for the default tolerances (float64
    and float32), 1e-4 for tol=1e-12. In a tail with no gap below it only
    Weyl's bound ``|theta - lambda| <= r`` holds, linear in the residual (the
    true error is about quadratic in it: measured 40x below the bound,
    docs/solvers.md); scikit-learn's fixed schedule leaves errors of 2-3 %
    there. 1 % keeps the certified residuals within the pipeline's default
    ``solver.max_residual`` (0.01); 5 % would save 3 of 11 passes on the
    clustered data. A smaller ``tol`` buys more.
    """
    return float(min(0.01, 100.0 * np.sqrt(tol)))


def default_rank_rtol(eps: float) -> float:
    """Ritz values below this fraction of the largest are not returned (numerically zero).

    The same levels as the estimator's removal of non-positive eigenvalues:
    1e-12 for float64 kernel evaluation, 1e-6 for float32.
    """
    return 1e-12 if eps < 1e-10 else 1e-6


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
    """
    if method not in ("block_krylov", "subspace"):
        raise ValueError(f"Unknown randomized method {method!r}")
    n = op.n
    k = int(n_components)
    l = min(n, k + int(n_oversamples))
    max_basis = default_max_basis(n) if max_basis is None else int(max_basis)
    fixed = n_power_iter != "auto"
    n_passes_target = int(n_power_iter) + 1 if fixed else int(max_passes)
    rank_rtol = default_rank_rtol(eps) if rank_rtol is None else float(rank_rtol)
    cluster_rtol = (
        min(0.05, 100.0 * np.sqrt(tol)) if cluster_rtol is None else float(cluster_rtol)
    )
    angle_tol = float(np.sqrt(tol))
    tail_tol = default_tail_tol(tol) if tail_tol is None else float(tail_tol)
    tail_tol = tail_tol if tail_tol > 0 else None
    noise = float(eps) * np.sqrt(n)  # rounding level of a product, relative to ||A||
    rng = _generator(random_state)
    Omega = rng.standard_normal((n, l))  # drawn whole whatever v0 is: same seed, same rest
    n_warm = 0
    if v0 is not None:
        V0 = _start_vectors(v0, n, l)
        n_warm = V0.shape[1]
        Omega[:, :n_warm] = V0 * np.sqrt(n)  # the Gaussian columns' scale
    # The test matrix is centred: Kc's null vector 1 carries no information.
    prep = _centre if centre else _identity
    Q = _orth(prep(Omega))
    capacity = l * (n_passes_target + 1) if method == "block_krylov" else l
    Wbuf = _Columns(n, min(capacity, max_basis + l))
    Wbuf.append(Q)
    M = np.zeros((0, 0))  # W^T A W over the multiplied columns of W
    drop2 = 0.0  # sum of squared norms of the dropped directions (since the last restart)
    normA = 0.0
    history: list[float] = []
    prev: np.ndarray | None = None
    cert: Certificate | None = None
    t_start = time.perf_counter()
    p = 0
    for p in range(1, n_passes_target + 1):
        Y = op.matmul(Q)
        L0 = M.shape[0]
        W = Wbuf.view  # multiplied columns plus Q (the last block)
        G = Y.T @ Y
        normA = max(normA, float(np.sqrt(max(np.linalg.eigvalsh((G + G.T) / 2)[-1], 0.0))))
        tau = noise * normA
        Q_next, S, dropped = _next_block(W, Y, tau)
        drop2 += dropped**2
        # grow M by the new column block S (rows: every column of W) and its mirror
        c = Y.shape[1]
        M = np.block([[M, S[:L0]], [S[:L0].T, (S[L0:] + S[L0:].T) / 2]])
        theta, U = _rayleigh_ritz(M)
        if method == "block_krylov":
            Hn = Q_next.T @ Y  # A W - W M = Q_next Hn (last block column) + dropped
            B = Hn @ U[L0 : L0 + c]
            res = np.linalg.norm(B, axis=0) + np.sqrt(drop2)

            drop = float(np.sqrt(drop2))

            def block_res(a, b, B=B, d=drop):
                return (np.linalg.norm(B[:, a:b], 2) if B.size else 0.0) + d
        else:
            Rm = Y @ U - W @ (U * theta)  # W is Q: exact residuals
            res = np.linalg.norm(Rm, axis=0)

            def block_res(a, b, Rm=Rm):
                return np.linalg.norm(Rm[:, a:b], 2)

        exhausted = Q_next.shape[1] == 0  # invariant subspace reached: exact to tau
        # the rest of the spectrum is zero (to tau) once the basis holds range(A):
        # block Krylov found no new direction, or subspace iteration's block lost
        # columns to deflation (A Q has rank below l)
        below = tau if (exhausted if method == "block_krylov" else Q.shape[1] < l) else None
        k_ret = _n_existing(theta, k, rank_rtol, tau)
        cert = certify(
            theta,
            res,
            k_ret,
            block_res,
            tol=tol,
            floor=tau,
            cluster_rtol=cluster_rtol,
            angle_tol=angle_tol,
            below=below,
            cluster_tol=tol**0.75,
            tail_tol=tail_tol,
        )
        est = theta[:k]
        if prev is not None and len(prev) == len(est):
            scale = np.maximum(np.abs(est), np.finfo(float).tiny)
            history.append(float(np.max(np.abs(est - prev) / scale)))
        prev = est
        logger.info(
            "randomized solver: pass %d, %d basis columns, top eigenvalue %.6g, "
            "max eigenvalue bound %.2e, max angle bound %.2e%s",
            p,
            M.shape[0],
            theta[0],
            max(cert["eigenvalue_bounds"], default=0.0),
            max(cert["angle_bounds"], default=0.0),
            " (exhausted)" if exhausted else "",
        )
        if callback is not None:
            callback(p, est.copy())
        if (not fixed and cert["ok"]) or p == n_passes_target or exhausted:
            break
        if method == "subspace":
            Q, d, _ = _rank_revealing_orth(Y, tau)
            Wbuf.reset(Q)
            M, drop2 = np.zeros((0, 0)), d**2
        elif (
            Wbuf.width + Q_next.shape[1] + l > max_basis + l
            or Wbuf.width + Q_next.shape[1] > max_basis
        ):
            # Restart from the current best approximations.
            Q = _orth(prep(W @ U[:, :l]))
            Wbuf.reset(Q)
            M, drop2 = np.zeros((0, 0)), 0.0
            logger.info("randomized solver: restart (basis would exceed %d columns)", max_basis)
        else:
            Wbuf.append(Q_next)
            Q = Q_next
    # Certification pass: Rayleigh-Ritz on the returned vectors (sharper
    # eigenvalues) and their exact residuals.
    k_ret = _n_existing(theta, k, rank_rtol, tau)
    Wm = Wbuf.view[:, : M.shape[0]]
    V = prep(Wm @ U[:, :k_ret])
    V = _orth(V) if k_ret else V
    AV = op.matmul(V) if k_ret else np.zeros((n, 0))
    th2, U2 = _rayleigh_ritz(V.T @ AV)
    Vr, AVr = V @ U2, AV @ U2
    Rf = AVr - Vr * th2
    r2 = np.linalg.norm(Rf, axis=0)
    # the certificate on the final pairs, with the iteration's Ritz values beyond
    # them (and their residual bounds) for the gaps
    th_all = np.concatenate([th2, theta[k_ret:]])
    res_all = np.concatenate([r2, res[k_ret:]])

    def final_block_res(a, b):
        inner = np.linalg.norm(Rf[:, a : min(b, k_ret)], 2) if a < k_ret else 0.0
        outer = block_res(max(a, k_ret), b) if b > k_ret else 0.0
        return float(np.hypot(inner, outer))

    cert = certify(
        th_all,
        res_all,
        k_ret,
        final_block_res,
        tol=tol,
        floor=tau,
        cluster_rtol=cluster_rtol,
        angle_tol=angle_tol,
        below=below,
        cluster_tol=tol**0.75,
        tail_tol=tail_tol,
    )
    converged = bool(cert["ok"])
    with np.errstate(divide="ignore", invalid="ignore"):
        residuals = r2 / np.abs(th2)
    Vr = deterministic_signs(Vr)
    if not converged and warn:
        warnings.warn(not_converged_message(cert, p + 1, tol), ConvergenceWarning, stacklevel=2)
    info = {
        "solver": "randomized",
        "method": method,
        "block_columns": l,
        "finish": "rayleigh_ritz",
        "basis_columns": int(M.shape[0]),
        "rank_found": int(k_ret),
        "exhausted": bool(exhausted),
        "relative_changes": history,
        "warm_start": int(n_warm),
        "certificate": dict(cert),
        "seconds": time.perf_counter() - t_start,
    }
    return EigResult(
        eigenvalues=th2,
        eigenvectors=Vr,
        residuals=residuals,
        n_passes=p + 1,
        converged=converged,
        info=info,
    )


def _start_vectors(v0: Any, n: int, l: int) -> np.ndarray:
    """The usable starting vectors of ``v0`` (n x j, checked as ``fit`` checks them):
    at most ``l`` columns, orthonormal, zero and numerically dependent columns dropped."""
    V0 = check_start_vectors(v0, n, "randomized")[:, :l]
    # rank-revealing: pivoted QR, columns below 1e-8 of the largest diagonal dropped
    Qv, R, _ = scipy.linalg.qr(V0, mode="economic", pivoting=True)
    d = np.abs(np.diag(R))
    keep = int(np.sum(d > 1e-8 * d[0])) if d.size and d[0] > 0 else 0
    return Qv[:, :keep]


def escalation_plan(n: int, k: int, kwargs: dict, dense_max: int) -> dict:
    """What ``eigen_solver="auto"`` does when a randomized solve is not certified.

    Dense ``eigh`` when ``n <= dense_max``; otherwise one more randomized
    solve with twice the oversampling (at least k), twice the pass cap and
    the automatic stopping rule (a fixed ``n_power_iter`` is what failed).
    """
    if n <= dense_max:
        return {"solver": "dense"}
    kw = dict(kwargs)
    kw["n_oversamples"] = 2 * max(int(kw.get("n_oversamples", 0)), k)
    kw["max_passes"] = 2 * int(kw.get("max_passes", 20))
    kw["n_power_iter"] = "auto"
    return {"solver": "randomized", "kwargs": kw}


def not_converged_message(cert: dict, passes: int, tol: float, escalated: bool = False) -> str:
    """One line: what is not certified, and what to change."""
    eb = [b for b, ok in zip(cert["eigenvalue_bounds"], cert["eigenvalue_ok"]) if not ok]
    ab = [b for b, ok in zip(cert["angle_bounds"], cert["vector_ok"]) if not ok]
    what = []
    if eb:
        what.append(f"{len(eb)} eigenvalue(s) with relative error bound up to {max(eb):.1e}")
    if ab:
        what.append(
            f"{len(ab)} eigenvector(s)/subspace(s) with angle bound up to {max(ab):.1e}"
        )
    how = " (after escalating to a larger block)" if escalated else ""
    return (
        f"The randomized eigensolver did not certify its result to tol={tol:g} in "
        f"{passes} passes{how} ({'; '.join(what) or 'no pair'}). The result is returned with "
        "its residuals (residuals_, solver_info_['certificate']); raise max_iter or "
        "n_oversamples, or use eigen_solver='dense' for small problems."
    )


def _n_existing(theta: np.ndarray, k: int, rank_rtol: float, tau: float) -> int:
    """How many of the leading k Ritz values are (numerically) non-zero eigenvalues."""
    if theta.size == 0 or theta[0] <= 0:
        return 0
    cut = max(rank_rtol * theta[0], tau)
    return int(min(k, np.count_nonzero(theta > cut)))


def _generator(random_state: Any) -> np.random.Generator:
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    return np.random.default_rng(random_state)
