"""Nyström kernel PCA: cost linear in n, a model of m landmarks.

Notation (docs/design.md, docs/nystroem.md). X (n x d) row blocks, landmarks Z
(m x d), ``C = k(X, Z)`` (n x m), ``W = k(Z, Z) = U S U^T``. Keep the
eigenvalues ``S > rtol * max(S)`` (m' of them) and set ``T = U S^-1/2``
(m x m'). The Nyström features are ``F = C T`` (n x m'), their column mean
``f = T^T c`` with ``c = C^T 1 / n`` (the mean kernel value at each landmark),
and the centred feature covariance (not divided by n, so that its
eigenvalues approximate those of the centred kernel matrix ``Kc``) is::

    Sigma = F_c^T F_c = T^T (C^T C - n c c^T) T.

``Sigma = P diag(lambda) P^T``; the top k pairs give the model: a new row x
embeds as ``k(x, Z) A - c^T A`` with ``A = T P_k`` (m x k), i.e. m kernel
evaluations and an m x k product, independent of n. With all n rows as
landmarks this is exact kernel PCA (Williams and Seeger 2001).

Neither F nor C is ever formed for all rows. Two ways to get the top
eigenpairs of Sigma, both one pass over X per product:

``method="covariance"``
    One pass forms ``C'^T C'`` (m x m) by a tree reduction over row blocks
    (``n m^2`` flops with a symmetric rank-k update), then ``eigh``. Exact on
    Sigma; cheapest for small m.
``method="randomized"``
    Block Krylov (:func:`~kpca_dask.solvers.randomized.randomized_eigh`) on
    the m' x m' operator ``Y -> Sigma Y``: each product recomputes C block by
    block and costs ``4 n m l`` flops (``l = k + oversamples``) plus the kernel
    evaluations, so several passes still cost less than ``n m^2`` once m is
    in the thousands. A final pass with the k leading vectors certifies them.

Centring without cancellation: before the covariance products every kernel
value is shifted by an estimate ``c0`` of the column means (from the landmark
sample), ``C' = C - 1 c0^T``; with ``delta = c - c0`` (exact, from the first
pass) ``C_c^T C_c = C'^T C' - n delta delta^T``. The shifted values have
(nearly) zero mean, so float32 products keep their accuracy even when all
kernel values are close to a constant.

Memory model: a task holds its row block of X, one strip of kernel values
(``strip_rows x m`` in the compute dtype, a few MB) and its partial sum
(``m x l`` float64, or ``m x m`` for the covariance method); partial sums are
added in a tree with fan-in 8. The driver holds m x m matrices (W, U, T) and
the m' x L Krylov basis. Nothing of size n x m or n x d exists anywhere;
graphs are lazy with deterministic names and run on any Dask scheduler.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from scipy.linalg.blas import dsyrk, ssyrk

from ..kernels import Kernel
from ..threads import blas_threads_for_dask, blas_threads_for_driver
from ._common import EigResult
from .randomized import DEFAULT_N_OVERSAMPLES, randomized_eigh

__all__ = [
    "NystroemBasis",
    "nystroem_basis",
    "FeatureCovariance",
    "NystroemFit",
    "NystroemStatistics",
    "batch_statistics",
    "nystroem_eigh",
    "solve_statistics",
    "NYSTROEM_METHODS",
]

logger = logging.getLogger("kpca_dask")

NYSTROEM_METHODS = ("covariance", "randomized")

#: Strip of kernel values computed and consumed at once inside a task: the
#: covariance method's rank-k update gains from wider strips, the randomized
#: products do not (measurements: docs/nystroem.md, tuning constants).
STRIP_BYTES = {"randomized": 4 << 20, "covariance": 16 << 20}

#: Partial sums added per tree-reduction task.
SPLIT_EVERY = 8


def _strip_rows(m: int, itemsize: int, method: str) -> int:
    return int(max(16, min(8192, STRIP_BYTES[method] // max(1, m * itemsize))))


# -------------------------------------------------------------------- basis
@dataclass
class NystroemBasis:
    """The landmark side of the Nyström approximation.

    Attributes
    ----------
    landmarks : ndarray of shape (m, n_features), float64
    kernel : Kernel
    dtype : numpy dtype
        Precision of kernel evaluation and in-block products.
    T : ndarray of shape (m, m'), float64
        ``U S^-1/2`` over the kept eigenvalues of ``W = k(Z, Z)``.
    w_eigenvalues : ndarray of shape (m',)
        The kept eigenvalues of W, descending.
    shift : ndarray of shape (m,)
        ``c0``, the estimate of the column means subtracted before products.
    n_dropped : int
        Eigenvalues of W below the threshold (numerically dependent landmarks,
        or the negative part of an indefinite kernel).
    """

    landmarks: np.ndarray
    kernel: Kernel
    dtype: np.dtype
    T: np.ndarray
    w_eigenvalues: np.ndarray
    shift: np.ndarray
    n_dropped: int = 0

    @property
    def m(self) -> int:
        return int(self.landmarks.shape[0])

    @property
    def rank(self) -> int:
        return int(self.T.shape[1])

    def prepared(self) -> np.ndarray:
        """The landmarks prepared as the right-hand side of kernel blocks."""
        return self.kernel.prepare(self.landmarks, self.dtype, "right")


def default_w_rtol(dtype: Any) -> float:
    """Relative cut-off for the eigenvalues of W by evaluation precision.

    Maintenance note: a feature direction ``U_j / sqrt(S_j)`` amplifies the
    rounding error of the kernel values (relative ``eps`` of the dtype) by
    ``1 / sqrt(S_j / S_max)``. Below ``1e-6 S_max`` in float32 (``1e-12`` in
    float64) the direction is mostly rounding noise, and it carries at most
    that fraction of the kernel's energy, so dropping it costs nothing
    measurable while keeping T well conditioned.
    """
    return 1e-12 if np.dtype(dtype) == np.float64 else 1e-6


def nystroem_basis(
    landmarks: np.ndarray,
    kernel: Kernel,
    dtype: Any,
    shift: np.ndarray | None = None,
    rtol: float | None = None,
) -> NystroemBasis:
    """Eigendecompose ``W = k(Z, Z)`` (evaluated in ``dtype``, solved in float64).

    ``shift`` defaults to the column means of W (an unbiased estimate of
    ``c`` when Z is a uniform sample; exactly ``c`` when Z is all of X).
    """
    dtype = np.dtype(dtype)
    Z = np.ascontiguousarray(landmarks, dtype=np.float64)
    with blas_threads_for_driver():
        with np.errstate(over="ignore", invalid="ignore"):
            W = np.asarray(kernel(Z, Z, dtype=dtype), dtype=np.float64)
        from .landmarks import _check_finite_kernel

        _check_finite_kernel(W)  # NaN would reach LAPACK (and read as "no eigenvalue")
        W = (W + W.T) / 2
        S, U = scipy.linalg.eigh(W, check_finite=False)
    S, U = S[::-1], U[:, ::-1]
    tol = default_w_rtol(dtype) if rtol is None else rtol
    top = float(S[0]) if S.size else 0.0
    keep = S > max(top, 0.0) * tol
    if not top > 0 or not keep.any():
        from ..exceptions import ConstantKernelError

        raise ConstantKernelError(
            "The kernel matrix of the landmarks has no positive eigenvalue: the kernel is "
            "(nearly) zero on the data. Check the kernel parameters."
        )
    T = U[:, keep] / np.sqrt(S[keep])
    if shift is None:
        shift = W.mean(axis=0)
    return NystroemBasis(
        Z,
        kernel,
        dtype,
        np.ascontiguousarray(T),
        S[keep],
        np.asarray(shift, dtype=np.float64),
        int((~keep).sum()),
    )


# ------------------------------------------------------------ block products
def _block_stats(xb, consts, method, first, kernel, dtype_str):
    """One row block's share of a pass: ``C'^T C' M`` (or ``C'^T C'``) and, on the
    first pass, ``C'^T 1`` and ``sum k(x, x)``.

    ``consts = (Zp, M, shift)``; ``M`` is None for the covariance method.
    Returns ``(acc, colsum, diag_sum, rows)`` with float64 ``acc``.
    """
    Zp, M, shift = consts
    dtype = np.dtype(dtype_str)
    A = kernel.prepare(xb, dtype, "left")
    r, m = A.shape[0], Zp.shape[0]
    step = _strip_rows(m, dtype.itemsize, method)
    buf = np.empty(min(step, r) * m, dtype=dtype)
    shift_d = shift.astype(dtype)
    ones = np.ones(min(step, r), dtype=dtype)
    colsum = np.zeros(m, dtype=np.float64) if first else None
    if method == "covariance":
        syrk = ssyrk if dtype == np.float32 else dsyrk
        acc = np.zeros((m, m), dtype=dtype, order="F")
    else:
        acc = np.zeros((m, M.shape[1]), dtype=np.float64)
    for a in range(0, r, step):
        b = min(r, a + step)
        Ks = kernel.evaluate(A[a:b], Zp, out=buf[: (b - a) * m].reshape(b - a, m))
        if Ks.dtype != dtype:
            Ks = Ks.astype(dtype)
        Ks -= shift_d
        if first:
            colsum += ones[: b - a] @ Ks
        if method == "covariance":
            # acc += Ks^T Ks, upper triangle, in place (Ks.T is Fortran-ordered: no copy)
            syrk(1.0, Ks.T, beta=1.0, c=acc, trans=0, lower=0, overwrite_c=1)
        else:
            acc += Ks.T @ (Ks @ M)
    if method == "covariance":
        acc = acc.astype(np.float64)  # upper triangle only: symmetrised once, after the sum
    diag = float(kernel.diag(xb, np.float64).sum()) if first else 0.0
    return acc, colsum, diag, r


def _sum_stats(parts):
    """The sum of block statistics ``(acc, colsum, diag, rows)``, in order (``parts``
    may be a generator: one block's partial alive at a time)."""
    it = iter(parts)
    acc, colsum, diag, rows = next(it)
    acc = np.array(acc, dtype=np.float64, copy=True)
    colsum = None if colsum is None else np.array(colsum, copy=True)
    for a, c, dg, r in it:
        acc += a
        if colsum is not None:
            colsum += c
        diag += dg
        rows += r
    return acc, colsum, diag, rows


def _group_stats(xbs, consts, method, first, kernel, dtype_str):
    """``_sum_stats`` of the ``_block_stats`` of the blocks ``xbs``, computed in one
    task: the first level of the tree fused with its leaves. The same additions in the
    same order as the unfused tree (the same bits), but a worker holds one running sum
    instead of one m x m partial per block."""
    return _sum_stats(_block_stats(xb, consts, method, first, kernel, dtype_str) for xb in xbs)


def _fuse_leaves(n_blocks: int, split_every: int = SPLIT_EVERY) -> bool:
    """Fuse the tree's first level with its leaves when the fused tasks still give
    every thread of the scheduler two tasks: each unfused leaf returns an m x m float64
    partial (32 MiB at m = 2048), and a scheduler that runs leaves ahead of the sums
    held ~3 GiB of them at n = 2M."""
    from ..gram import _cluster_threads

    return n_blocks // split_every >= 2 * _cluster_threads()


def _tree_reduce(
    dsk: dict, leaves: list, name: str, split_every: int = SPLIT_EVERY, levels_done: int = 0
):
    """Add ``leaves`` in a tree of ``_sum_stats`` tasks; returns the root key.
    ``levels_done``: the leaves are sums already (at least one level is added
    otherwise, as a copy for a single leaf)."""
    level = 0
    keys = leaves
    while len(keys) > 1 or level + levels_done == 0:
        nxt = []
        for j in range(0, len(keys), split_every):
            key = (f"{name}-sum{level}", j // split_every)
            dsk[key] = (_sum_stats, keys[j : j + split_every])
            nxt.append(key)
        keys, level = nxt, level + 1
    return keys[0]


def block_stats_graph(
    X: da.Array,
    basis: NystroemBasis,
    Zp: np.ndarray,
    M: np.ndarray | None,
    first: bool,
    fuse: bool | None = None,
) -> Delayed:
    """Lazy pass over the row blocks of ``X``: one task per block plus a tree sum
    (``fuse``: the tree's first level computed inside its leaves, one task per
    ``SPLIT_EVERY`` blocks; default :func:`_fuse_leaves`; the same sums either way)."""
    method = "covariance" if M is None else "randomized"
    consts = (Zp, M, basis.shift)
    token = tokenize(X.name, basis.kernel, basis.dtype.str, Zp, M, basis.shift, first)
    cname = "kpca-nys-consts-" + token
    lname = "kpca-nys-block-" + token
    dsk: dict[Any, Any] = {cname: consts}
    leaves = []
    nb = len(X.chunks[0])
    if _fuse_leaves(nb) if fuse is None else fuse:
        for j in range(0, nb, SPLIT_EVERY):
            dsk[(lname, j)] = (
                _group_stats,
                [(X.name, i, 0) for i in range(j, min(nb, j + SPLIT_EVERY))],
                cname,
                method,
                first,
                basis.kernel,
                basis.dtype.str,
            )
            leaves.append((lname, j))
        # the fused tasks are the tree's first level: the tree goes on from the second
        root = _tree_reduce(dsk, leaves, "kpca-nys-" + token, levels_done=1)
    else:
        for i in range(nb):
            dsk[(lname, i)] = (
                _block_stats,
                (X.name, i, 0),
                cname,
                method,
                first,
                basis.kernel,
                basis.dtype.str,
            )
            leaves.append((lname, i))
        root = _tree_reduce(dsk, leaves, "kpca-nys-" + token)
    graph = HighLevelGraph.from_collections(root[0], dsk, dependencies=[X])
    return Delayed(root, graph, layer=root[0])


# --------------------------------------------------------- sufficient statistics
@dataclass
class NystroemStatistics:
    """Sums over rows that determine the Nyström eigenproblem for fixed landmarks.

    With ``C' = k(X, Z) - 1 shift^T`` (kernel values against the landmarks, shifted by a
    fixed vector to avoid cancellation): ``colsum = C'^T 1`` (m,), ``cross = C'^T C'``
    (m x m, symmetric), ``n_rows`` and ``kernel_trace = sum_i k(x_i, x_i)``, all float64.
    Every one is a sum over rows, so the statistics of a union of row sets are the sums
    of theirs (``a + b``): a model that keeps them updates exactly with new rows
    (:func:`solve_statistics` on the sum equals a fit on all rows with the same
    landmarks). ``Sigma = T^T (cross - colsum colsum^T / n) T``.
    """

    shift: np.ndarray
    n_rows: int
    colsum: np.ndarray
    cross: np.ndarray
    kernel_trace: float

    def __add__(self, other: NystroemStatistics) -> NystroemStatistics:
        if self.shift.shape != other.shift.shape or not np.array_equal(self.shift, other.shift):
            raise ValueError("statistics taken with different landmark shifts cannot be added")
        return NystroemStatistics(
            self.shift,
            self.n_rows + other.n_rows,
            self.colsum + other.colsum,
            self.cross + other.cross,
            self.kernel_trace + other.kernel_trace,
        )

    @property
    def delta(self) -> np.ndarray:
        """``c - shift`` with ``c`` the mean kernel value at each landmark."""
        return self.colsum / self.n_rows

    @property
    def column_means(self) -> np.ndarray:
        return self.shift + self.delta

    def sigma(self, basis: NystroemBasis) -> np.ndarray:
        """The centred feature covariance ``Sigma`` (m' x m') of the rows summed here."""
        R = self.cross - self.n_rows * np.outer(self.delta, self.delta)
        S = basis.T.T @ R @ basis.T
        return (S + S.T) / 2

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a saved model keeps (``n_rows`` and ``kernel_trace`` are scalars of
        the model already)."""
        return {"stat_shift": self.shift, "stat_colsum": self.colsum, "stat_cross": self.cross}


def batch_statistics(X: da.Array, basis: NystroemBasis) -> NystroemStatistics:
    """The statistics of the rows of ``X`` (row-chunked dask array): one pass with an
    m x m tree reduction over row blocks, on the current Dask scheduler."""
    op = FeatureCovariance(X, basis)
    with blas_threads_for_driver():
        return op.statistics()


def solve_statistics(
    basis: NystroemBasis, stats: NystroemStatistics, n_components: int | None
) -> NystroemFit:
    """The top eigenpairs of ``Sigma`` from statistics (no pass over rows): the covariance
    method's solve, the same arithmetic as :func:`nystroem_eigh` with
    ``method="covariance"``."""
    mp = basis.rank
    k = mp if n_components is None else min(int(n_components), mp)
    with blas_threads_for_driver():
        res = _eigh_sigma(stats.sigma(basis), k, 0)
        fit = _fit_from(res, basis, stats.column_means, stats.kernel_trace, "covariance", 0.0)
    fit.statistics = stats
    return fit


def _eigh_sigma(Sigma: np.ndarray, k: int, n_passes: int) -> EigResult:
    """The top ``k`` eigenpairs of the formed ``Sigma`` (descending) and their residuals."""
    mp = Sigma.shape[0]
    lam, P = scipy.linalg.eigh(Sigma, subset_by_index=(mp - k, mp - 1), check_finite=False)
    lam, P = lam[::-1], P[:, ::-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        residuals = np.linalg.norm(Sigma @ P - P * lam, axis=0) / np.abs(lam)
    return EigResult(
        lam, P, residuals, n_passes=n_passes, converged=True, info={"finish": "eigh"}
    )


# ------------------------------------------------------------------ operator
@dataclass
class FeatureCovariance:
    """``Sigma = T^T C_c^T C_c T`` (m' x m') as an operator: one pass over X per product.

    The first product also yields ``delta = c - c0`` (hence the column means
    ``c``) and ``trace(K)``. Implements the ``n``/``matmul`` protocol of
    :func:`~kpca_dask.solvers.randomized.randomized_eigh`.
    """

    X: da.Array
    basis: NystroemBasis
    delta: np.ndarray | None = None
    kernel_trace: float | None = None
    n_passes: int = 0
    pass_seconds: list[float] = field(default_factory=list)

    def __post_init__(self):
        self._Zp = self.basis.prepared()

    @property
    def n(self) -> int:
        return self.basis.rank

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])

    def _pass(self, M: np.ndarray | None) -> np.ndarray:
        return self._run(M, sums=self.delta is None)[0]

    def _run(self, M: np.ndarray | None, sums: bool) -> tuple:
        """One pass over the rows: ``(acc, colsum, diag, rows)`` of block_stats_graph
        (column sums and the kernel trace when ``sums``); the first pass sets ``delta``
        and ``kernel_trace``."""
        first = self.delta is None
        t0 = time.perf_counter()
        with blas_threads_for_dask():
            (out,) = dask.compute(block_stats_graph(self.X, self.basis, self._Zp, M, sums))
        acc, colsum, diag, rows = out
        if rows != self.n_rows:  # pragma: no cover - a graph bug, never data
            raise RuntimeError(f"pass covered {rows} of {self.n_rows} rows")
        if first:
            self.delta = colsum / self.n_rows
            self.kernel_trace = diag
        self.n_passes += 1
        self.pass_seconds.append(time.perf_counter() - t0)
        logger.debug(
            "Nyström pass %d (%s) took %.2f s",
            self.n_passes,
            "covariance" if M is None else f"{M.shape[1]} columns",
            self.pass_seconds[-1],
        )
        return out

    def matmul(self, Y: np.ndarray) -> np.ndarray:
        """``Sigma @ Y`` for Y of shape (m', l): one pass."""
        M = (self.basis.T @ np.asarray(Y, dtype=np.float64)).astype(self.basis.dtype)
        R = self._pass(M)
        M64 = M.astype(np.float64)
        R -= self.n_rows * np.outer(self.delta, self.delta @ M64)
        return self.basis.T.T @ R

    def covariance(self) -> np.ndarray:
        """The whole ``Sigma`` (m' x m'): one pass with an m x m reduction."""
        return self.statistics().sigma(self.basis)

    def statistics(self) -> NystroemStatistics:
        """The rows' :class:`NystroemStatistics`: one pass with an m x m reduction (sets
        ``delta`` and ``kernel_trace`` when this is the first pass)."""
        acc, colsum, diag, rows = self._run(None, sums=True)
        acc += np.triu(acc, 1).T  # upper triangle of C'^T C' (the lower one is zero)
        return NystroemStatistics(
            np.array(self.basis.shift, dtype=np.float64), int(rows), colsum, acc, float(diag)
        )

    @property
    def column_means(self) -> np.ndarray:
        """``c = mean_i k(x_i, z_j)`` (after the first pass)."""
        return self.basis.shift + self.delta


# --------------------------------------------------------------------- solve
@dataclass
class NystroemFit:
    """Result of :func:`nystroem_eigh`.

    Attributes
    ----------
    eigenvalues : ndarray of shape (k,)
        Top eigenvalues of Sigma, descending (approximate those of Kc).
    projection : ndarray of shape (m, k)
        ``A = T P_k``: ``embedding(x) = k(x, Z) A - offset``.
    offset : ndarray of shape (k,)
        ``c^T A``.
    column_means : ndarray of shape (m,)
        ``c = mean_i k(x_i, z_j)``.
    mean_weights : ndarray of shape (m,)
        ``W^+ c``: ``k(x, Z) . mean_weights`` is the Nyström estimate of
        ``mean_i k(x, x_i)``.
    grand_mean : float
        ``c^T W^+ c``, the Nyström estimate of the grand mean of K.
    kernel_trace : float
        ``trace(K)`` (exact).
    residuals : ndarray of shape (k,)
        ``||Sigma p - lambda p|| / lambda`` of each pair.
    """

    eigenvalues: np.ndarray
    projection: np.ndarray
    offset: np.ndarray
    column_means: np.ndarray
    mean_weights: np.ndarray
    grand_mean: float
    kernel_trace: float
    residuals: np.ndarray
    n_passes: int
    converged: bool
    info: dict[str, Any] = field(default_factory=dict)
    #: the rows' sufficient statistics (covariance method, or ``keep_statistics``)
    statistics: NystroemStatistics | None = None


def nystroem_eigh(
    X: da.Array,
    basis: NystroemBasis,
    n_components: int | None,
    *,
    method: str = "randomized",
    n_oversamples: int = DEFAULT_N_OVERSAMPLES,
    n_power_iter: int | str = "auto",
    randomized_method: str = "block_krylov",
    tol: float = 1e-7,
    max_passes: int = 20,
    random_state: Any = None,
    warn: bool = True,
    keep_statistics: bool = False,
) -> NystroemFit:
    """Top eigenpairs of the centred Nyström feature covariance of ``X``.

    Parameters
    ----------
    X : dask array of shape (n_samples, n_features)
        Row-chunked, one chunk along the features; read once per pass.
    basis : NystroemBasis
    n_components : int or None
        k; None keeps every component (covariance method only).
    method : {"covariance", "randomized"}
    n_oversamples, n_power_iter, randomized_method, tol, max_passes, random_state, warn
        As for :func:`~kpca_dask.solvers.randomized.randomized_eigh` (the
        randomized method is certified the same way; ``converged`` says
        whether the certificate holds, and a ConvergenceWarning is emitted
        when it does not and ``warn``).
    keep_statistics : bool
        Return the rows' :class:`NystroemStatistics` (``fit.statistics``) for exact
        updates. Free with the covariance method; one more pass with the randomized one.
    """
    if method not in NYSTROEM_METHODS:
        raise ValueError(f"Unknown Nyström method {method!r}; use one of {NYSTROEM_METHODS}.")
    with blas_threads_for_driver():
        return _nystroem_eigh(
            X,
            basis,
            n_components,
            method,
            n_oversamples,
            n_power_iter,
            randomized_method,
            tol,
            max_passes,
            random_state,
            warn,
            keep_statistics,
        )


def _nystroem_eigh(
    X,
    basis,
    n_components,
    method,
    n_oversamples,
    n_power_iter,
    randomized_method,
    tol,
    max_passes,
    random_state,
    warn,
    keep_statistics=False,
) -> NystroemFit:
    op = FeatureCovariance(X, basis)
    stats = None
    mp = basis.rank
    k = mp if n_components is None else min(int(n_components), mp)
    t0 = time.perf_counter()
    if method == "covariance":
        stats = op.statistics()
        res = _eigh_sigma(stats.sigma(basis), k, op.n_passes)
    else:
        if n_components is None:
            raise ValueError("The randomized Nyström method needs n_components.")
        res = randomized_eigh(
            op,
            k,
            n_oversamples=n_oversamples,
            n_power_iter=n_power_iter,
            method=randomized_method,
            tol=tol,
            max_passes=max_passes,
            psd=True,
            eps=float(np.finfo(basis.dtype).eps),
            random_state=random_state,
            centre=False,
            warn=warn,
        )
    if keep_statistics and stats is None:
        stats = op.statistics()  # one more pass: the m x m sums the randomized solve avoids
    fit = _fit_from(res, basis, op.column_means, float(op.kernel_trace), method, t0)
    fit.n_passes = op.n_passes
    fit.info["pass_seconds"] = list(op.pass_seconds)
    fit.statistics = stats if keep_statistics else None
    return fit


def _fit_from(
    res: EigResult,
    basis: NystroemBasis,
    c: np.ndarray,
    kernel_trace: float,
    method: str,
    t0: float,
) -> NystroemFit:
    """The model of eigenpairs ``res`` of Sigma: projection, offset, centring vectors."""
    lam, P = np.asarray(res.eigenvalues, dtype=np.float64), np.asarray(res.eigenvectors)
    f = basis.T.T @ c
    A = basis.T @ P
    # Deterministic signs on the landmark coefficients: with all rows as
    # landmarks these are the exact solver's eigenvectors times a positive
    # scale, so both solvers then agree on every sign.
    idx = np.argmax(np.abs(A), axis=0) if A.size else np.zeros(0, dtype=int)
    signs = np.sign(A[idx, np.arange(A.shape[1])]) if A.size else np.ones(0)
    signs[signs == 0] = 1.0
    A = A * signs
    info = {
        "method": method,
        "n_landmarks": basis.m,
        "rank": basis.rank,
        "w_dropped": basis.n_dropped,
        "w_condition": float(basis.w_eigenvalues[0] / basis.w_eigenvalues[-1]),
        "pass_seconds": [],
        "seconds": time.perf_counter() - t0 if t0 else 0.0,
        **{k_: v for k_, v in res.info.items() if k_ not in ("seconds",)},
    }
    return NystroemFit(
        eigenvalues=lam,
        projection=np.ascontiguousarray(A),
        offset=c @ A,
        column_means=c,
        mean_weights=basis.T @ f,
        grand_mean=float(f @ f),
        kernel_trace=float(kernel_trace),
        residuals=np.asarray(res.residuals, dtype=np.float64),
        n_passes=res.n_passes,
        converged=bool(res.converged),
        info=info,
    )


def estimated_cost(m: int, d: int, l: int, method: str, passes: int = 6) -> float:
    """Cost per row of X used by ``nystroem_method="auto"``, in units of about 0.01 ns
    (one float32 flop of the covariance update on this machine's two cores).

    Measured here (float32, d = 64, m = 2048, l = 40, two Dask threads; see
    docs/nystroem.md): a randomized pass costs 3.0 ns per row and landmark,
    of which 1.4 ns is the kernel evaluation (GEMM with the landmarks, clip,
    exp), and the covariance pass 22 ns. Hence per row and landmark: kernel
    ``kappa = 60 + 1.2 (d + 2)``, covariance ``kappa + m``, randomized
    ``passes * (kappa + 4 l)`` with about 6 passes (Krylov iterations to
    float32 tolerance plus the certification pass).
    """
    kappa = 60.0 + 1.2 * (d + 2)
    if method == "covariance":
        return m * (kappa + m)
    return m * passes * (kappa + 4.0 * l)


def choose_method(m: int, d: int, k: int | None, l: int) -> str:
    """ "auto": the covariance method when the cost model says it is cheaper (m below
    about 1700 for d = 64 and 16 components), when all components are wanted, or
    when the feature space is small next to the Krylov block."""
    if k is None or m <= 2 * l:
        return "covariance"
    if estimated_cost(m, d, l, "covariance") <= estimated_cost(m, d, l, "randomized"):
        return "covariance"
    return "randomized"
