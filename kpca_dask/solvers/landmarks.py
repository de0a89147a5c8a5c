"""Landmark selection for the Nyström solver.

Three strategies, each a small function of a numpy sample and a seeded
generator (what to pick), separate from the blocked passes over the data
(:mod:`kpca_dask.solvers.nystroem`, how to use them):

``"uniform"``
    ``m`` distinct rows drawn uniformly from all ``n`` rows. Reads only those
    rows.
``"kmeans++"``
    k-means++ seeding (Arthur and Vassilvitskii 2007) in input space on a
    uniform sample: each new landmark is drawn with probability proportional
    to its squared Euclidean distance to the nearest landmark so far. Spreads
    the landmarks over the data; costs ``O(s m d)`` for a sample of ``s`` rows.
``"rpcholesky"``
    Randomly pivoted Cholesky (Chen, Epperly, Tropp and Webber 2022) on the
    kernel matrix of a uniform sample, in its accelerated blocked form
    (Epperly, Tropp and Webber 2024): each round proposes ``b`` pivots drawn
    i.i.d. from the residual diagonal and accepts them by rejection sampling
    against the residual ``b x b`` block, which yields exactly the
    distribution of sequential RPCholesky at the cost of a few large GEMMs
    per round. Points that the current landmarks explain badly (small
    clusters, outliers) keep a large residual diagonal and are picked;
    uniform sampling can miss them entirely.

Why a sample and not a pass over all of X (the issue leaves it open):
RPCholesky needs the residual diagonal of every candidate after every round,
which is either the ``n x m`` Cholesky factor (16 GB at n = 1M, m = 2048: the
thing the Nyström solver exists to avoid) or a recomputation costing
``O(n m^2)`` per round. On a uniform sample of ``s`` rows it costs
``O(s m^2)`` flops and ``8 s m`` bytes (``s = 20480``, ``m = 2048``: about
0.35 GB and one second), and reads X once. Any group of rows with a share
above ``1 / s`` of the data is present in the sample, so the adaptive choice
sees it; the approximation error of the resulting landmarks on all of X is
what the benchmarks measure.

Landmarks depend on the seed (and ``n``) only, never on the chunking: the
sample indices are drawn from the generator over ``range(n)`` and the rows
gathered by index. Returned landmark indices are sorted, so the landmarks
appear in the order of the rows of X (with ``m >= n`` they are X itself).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg
from threadpoolctl import threadpool_limits

from ..exceptions import KpcaWarning
from ..kernels import Kernel
from ..params import LANDMARK_METHODS
from ..threads import blas_threads_for_dask

__all__ = [
    "LANDMARK_METHODS",
    "Landmarks",
    "select_landmarks",
    "sample_indices",
    "gather_rows",
    "uniform_landmarks",
    "kmeanspp_landmarks",
    "rpcholesky_landmarks",
    "default_sample_size",
]

logger = logging.getLogger("kpca_dask")


class LandmarkMethodWarning(KpcaWarning):
    """The landmark method asked for cannot work with this kernel; another was used."""


#: Proposals per round of accelerated RPCholesky. Rejection wastes at most
#: ``b^2`` kernel entries per round, negligible next to the ``s x b`` columns;
#: larger blocks mean fewer, larger GEMMs.
RPC_BLOCK = 256


def default_sample_size(n: int, m: int) -> int:
    """``min(n, max(20000, 5 m))`` rows for kmeans++ / rpcholesky.

    RPCholesky holds an ``s x m`` float64 factor: 0.33 GB at m = 2048 and
    0.67 GB at m = 4096. Five rows per landmark keeps the adaptive choice
    well away from simply taking the whole sample.
    """
    return int(min(n, max(20000, 5 * m)))


@dataclass
class Landmarks:
    """Chosen landmarks.

    Attributes
    ----------
    indices : ndarray of shape (m,), int64
        Rows of X, sorted ascending.
    points : ndarray of shape (m, n_features), float64
        ``X[indices]``.
    column_means : ndarray of shape (m,) or None
        Estimate of ``mean_i k(x_i, z_j)`` from a uniform sample (used only to
        shift the kernel values before the covariance products, which keeps
        float32 accumulation accurate; any value is correct, a good one is
        more accurate). None: estimate it from ``k(Z, Z)``.
    info : dict
        Diagnostics (JSON-serialisable).
    """

    indices: np.ndarray
    points: np.ndarray
    column_means: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)


def sample_indices(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct row indices drawn uniformly from ``range(n)``, sorted."""
    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)


def gather_rows(X: da.Array, idx: np.ndarray) -> np.ndarray:
    """``X[idx]`` as float64 numpy (``idx`` sorted); reads only the chunks holding them."""
    if idx.size == X.shape[0]:
        sel = X
    else:
        sel = X[idx]
    with blas_threads_for_dask():
        (out,) = dask.compute(sel)
    return np.ascontiguousarray(out, dtype=np.float64)


# ---------------------------------------------------------------- strategies
def uniform_landmarks(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` distinct rows of ``n``, uniformly at random (sorted indices)."""
    return sample_indices(n, m, rng)


def kmeanspp_landmarks(S: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding on the rows of ``S`` (s x d): indices of ``m`` distinct rows.

    Squared distances are maintained incrementally (one GEMV per landmark). If
    fewer than ``m`` distinct rows exist, every distinct row is returned.
    """
    s = S.shape[0]
    S = np.asarray(S, dtype=np.float64)
    S = S - S.mean(axis=0)  # translation invariant: no cancellation at large offsets
    sq = np.einsum("ij,ij->i", S, S)
    chosen = [int(rng.integers(s))]
    d2 = np.maximum(sq - 2.0 * S @ S[chosen[0]] + sq[chosen[0]], 0.0)
    d2[chosen[0]] = 0.0
    for _ in range(1, m):
        cum = np.cumsum(d2)
        total = cum[-1]
        if not total > 0:
            break  # every row coincides with a landmark
        # first index whose cumulative weight exceeds the draw: its weight is > 0
        j = min(int(np.searchsorted(cum, rng.random() * total, side="right")), s - 1)
        chosen.append(j)
        np.minimum(d2, np.maximum(sq - 2.0 * S @ S[j] + sq[j], 0.0), out=d2)
        d2[j] = 0.0
    return np.asarray(chosen, dtype=np.int64)


def _rejection_cholesky(
    H: np.ndarray, proposal: np.ndarray, lmax: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Accept pivots among the proposals by rejection; Cholesky factor of the accepted block.

    ``H`` (b x b) is the residual kernel matrix at the proposals, ``proposal``
    their residual diagonal when they were drawn. Proposal ``j`` is accepted
    with probability ``H_jj / proposal_j`` where ``H`` has been reduced by the
    pivots accepted so far in this round (a Schur complement step per
    acceptance), which makes the accepted sequence distributed as sequential
    RPCholesky (Epperly, Tropp and Webber 2024, Alg. 2). Repeated proposals
    have a zero residual once accepted and are rejected. Returns the accepted
    positions and the lower Cholesky factor ``L`` of ``H[acc, acc]``.
    """
    H = np.array(H, dtype=np.float64, copy=True)
    b = H.shape[0]
    accepted: list[int] = []
    for j in range(b):
        hjj = H[j, j]
        if not hjj > 0 or proposal[j] * rng.random() > hjj:
            continue
        accepted.append(j)
        H[j:, j] /= np.sqrt(hjj)
        H[j + 1 :, j + 1 :] -= np.outer(H[j + 1 :, j], H[j + 1 :, j])
        if len(accepted) == lmax:
            break
    acc = np.asarray(accepted, dtype=np.int64)
    L = np.tril(H[np.ix_(acc, acc)])
    return acc, L


#: consecutive RPCholesky rounds that accept no pivot before the search stops
MAX_EMPTY_ROUNDS = 50


def _check_finite_kernel(K: np.ndarray) -> None:
    if not np.isfinite(K).all():
        from ..exceptions import InvalidInputError

        raise InvalidInputError(
            "The kernel returned NaN or infinity on the data (values so large that their "
            "products overflow, e.g. near 1e300?); scale the data (e.g. standardise the "
            "columns) or choose kernel parameters that keep the kernel finite."
        )


def _rpc_extend(
    S: np.ndarray,
    F: np.ndarray,
    d: np.ndarray,
    i: int,
    T: np.ndarray,
    L: np.ndarray,
    kernel: Kernel,
) -> np.ndarray:
    """One RPCholesky round's accepted pivots ``T`` (rows of ``S``) added to the factor:
    ``F[:, i : i + len(T)]`` and the residual diagonal ``d`` updated in place, ``L`` the
    Cholesky factor of their residual block. Returns the column means of ``k(S, S[T])``."""
    with np.errstate(over="ignore", invalid="ignore"):
        G = kernel(S, S[T], np.float64)
    _check_finite_kernel(G)
    means = G.mean(axis=0)
    G -= F[:, :i] @ F[T, :i].T
    # G L^-T as a GEMM with the small inverse factor: a triangular solve
    # with s right-hand sides is several times slower here.
    Linv = scipy.linalg.solve_triangular(L, np.eye(L.shape[0]), lower=True, check_finite=False)
    Fnew = F[:, i : i + T.size]
    np.matmul(G, Linv.T, out=Fnew)
    d -= np.einsum("ij,ij->i", Fnew, Fnew)
    np.maximum(d, 0.0, out=d)
    d[T] = 0.0
    return means


def rpcholesky_landmarks(
    S: np.ndarray,
    m: int,
    kernel: Kernel,
    rng: np.random.Generator,
    *,
    block_size: int = RPC_BLOCK,
    stop_rtol: float = 1e-12,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Accelerated randomly pivoted Cholesky on the kernel matrix of the rows of ``S``.

    Returns the pivot indices (rows of ``S``, in the order chosen) and
    diagnostics: the relative residual trace ``tr(K - F F^T) / tr(K)`` of the
    sample after the last round (the trace-norm error of the Nyström
    approximation on the sample), the column means of ``k(S, pivots)``, and
    the number of rounds. Stops early when the residual trace falls below
    ``stop_rtol`` of the initial trace (the sample's kernel matrix is then
    reproduced to rounding; more pivots would only add noise).

    Kernel columns are evaluated in float64 (``s m`` entries in all, a small
    cost) so the residual diagonal that drives the sampling is accurate.
    Memory: the ``s x m`` float64 factor plus one ``s x b`` block.
    """
    s = S.shape[0]
    m = min(m, s)
    diag = np.asarray(kernel.diag(S, np.float64), dtype=np.float64)
    d = np.maximum(diag, 0.0)
    trace0 = float(d.sum())
    # Column-major: the growing block F[:, :i] is then contiguous for BLAS.
    F = np.zeros((s, m), dtype=np.float64, order="F")
    pivots: list[int] = []
    col_means: list[np.ndarray] = []
    rounds = proposals = empty = 0
    i = 0
    while i < m:
        total = float(d.sum())
        if not total > stop_rtol * trace0:
            break
        b = int(min(block_size, max(16, 2 * (m - i))))
        cum = np.cumsum(d)
        # first index whose cumulative weight exceeds the draw: its weight is > 0
        prop = np.minimum(np.searchsorted(cum, rng.random(b) * cum[-1], side="right"), s - 1)
        Fp = F[prop, :i]
        Sp = S[prop]
        with np.errstate(over="ignore", invalid="ignore"):
            H = kernel(Sp, Sp, np.float64) - Fp @ Fp.T
        _check_finite_kernel(H)
        acc, L = _rejection_cholesky(H, d[prop], m - i, rng)
        rounds += 1
        proposals += b
        if acc.size == 0:
            # Rejection only accepts with positive probability; a round accepting nothing
            # many times over means the residual is rounding noise: stop, never spin.
            empty += 1
            if empty >= MAX_EMPTY_ROUNDS:
                break
            continue
        empty = 0
        T = prop[acc]
        col_means.append(_rpc_extend(S, F, d, i, T, L, kernel))
        pivots.extend(int(t) for t in T)
        i += T.size
    piv = np.asarray(pivots, dtype=np.int64)
    info = {
        "sample_trace_error": float(d.sum() / trace0) if trace0 > 0 else 0.0,
        "rounds": rounds,
        "proposals": proposals,
        "acceptance": float(len(pivots) / proposals) if proposals else 0.0,
    }
    cm = np.concatenate(col_means) if col_means else np.zeros(0)
    return piv, {**info, "_column_means": cm}


# ----------------------------------------------------------------- front end
def select_landmarks(
    X: da.Array,
    m: int,
    method: str,
    kernel: Kernel,
    rng: np.random.Generator,
    *,
    sample_size: int | None = None,
    dtype: Any = np.float64,
) -> Landmarks:
    """Choose ``m`` landmark rows of ``X`` (dask, row-chunked) with ``method``.

    With ``m >= n`` every row is a landmark, in order (the Nyström solver is
    then exact kernel PCA). ``sample_size`` rows (default
    :func:`default_sample_size`) are drawn uniformly for kmeans++ and
    rpcholesky; uniform landmarks read only their own rows. ``dtype`` is the
    precision of the later passes: rpcholesky stops once the sample's
    residual trace is below what that precision resolves.
    """
    n = int(X.shape[0])
    if method not in LANDMARK_METHODS:
        raise ValueError(f"Unknown landmark method {method!r}; use one of {LANDMARK_METHODS}.")
    if m >= n:
        idx = np.arange(n, dtype=np.int64)
        return Landmarks(idx, gather_rows(X, idx), info={"method": "all", "n_landmarks": n})
    if method == "uniform":
        idx = uniform_landmarks(n, m, rng)
        return Landmarks(idx, gather_rows(X, idx), info={"method": method, "n_landmarks": m})
    s = default_sample_size(n, m) if sample_size is None else int(min(n, sample_size))
    s = max(s, m)
    sidx = sample_indices(n, s, rng)
    S = gather_rows(X, sidx)
    info: dict[str, Any] = {"method": method, "sample_size": s}
    col_means = None
    if kernel.translation_invariant:
        # the same kernel centred on the sample's own mean: that centre depends on the
        # seed alone, so the chaotic pivoting sees the same bits whatever the chunking
        # (the fit's centre, summed per row block, differs in its last bits)
        kernel = kernel.with_center(np.asarray(S, dtype=np.float64).mean(axis=0))
    method = _method_for_diagonal(method, S, kernel, info)
    # One BLAS thread on the driver: see kpca_dask.threads.blas_threads_for_driver.
    with threadpool_limits(limits=1, user_api="blas"):
        if method == "kmeans++":
            piv = kmeanspp_landmarks(S, m, rng)
        else:
            stop = 1e-12 if np.dtype(dtype) == np.float64 else 1e-6
            piv, extra = rpcholesky_landmarks(S, m, kernel, rng, stop_rtol=stop)
            col_means = extra.pop("_column_means")
            info.update(extra)
        order = np.argsort(piv, kind="stable")
        piv = piv[order]
        if col_means is not None:
            col_means = col_means[order]
        else:
            col_means = _sample_column_means(S, S[piv], kernel)
    info["n_landmarks"] = int(piv.size)
    if piv.size < m:
        logger.info(
            "landmarks: %s chose %d of %d landmarks: the kernel matrix of the "
            "%d-row sample is reproduced to rounding by them",
            method,
            piv.size,
            m,
            s,
        )
    return Landmarks(sidx[piv], S[piv].copy(), column_means=col_means, info=info)


def _method_for_diagonal(method: str, S: np.ndarray, kernel: Kernel, info: dict) -> str:
    """``method``, or "kmeans++" (one warning line; ``info`` says so) when it is
    rpcholesky and the kernel's diagonal on the sample has no positive mass.

    Issue 36: a kernel with k(x, x) = 0 (scikit-learn's additive_chi2, through a
    callable) gives RPCholesky nothing to sample: it chose no landmark and the next step
    called the kernel on an empty block. kmeans++ needs no diagonal."""
    if method != "rpcholesky" or _positive_diagonal(S, kernel):
        return method
    warnings.warn(
        "landmark_method='rpcholesky' needs a kernel with a positive diagonal k(x, x), "
        "and this kernel's diagonal sums to zero or less on the landmark sample "
        "(a conditionally positive kernel such as additive_chi2?): the landmarks "
        "are chosen by 'kmeans++' instead; pass landmark_method='kmeans++' or "
        "'uniform' to choose them yourself.",
        LandmarkMethodWarning,
        stacklevel=5,
    )
    info["method"] = "kmeans++"
    info["requested_method"] = "rpcholesky"
    return "kmeans++"


def _positive_diagonal(S: np.ndarray, kernel: Kernel) -> bool:
    """Whether the kernel's diagonal on the sample has a positive, finite sum (what
    RPCholesky samples pivots from)."""
    with np.errstate(over="ignore", invalid="ignore"):
        diag = np.asarray(kernel.diag(S, np.float64), dtype=np.float64)
    total = float(np.maximum(diag, 0.0).sum()) if np.all(np.isfinite(diag)) else np.nan
    return bool(np.isfinite(total) and total > 0)


def _sample_column_means(
    S: np.ndarray, Z: np.ndarray, kernel: Kernel, rows: int = 4096
) -> np.ndarray:
    """``mean_i k(s_i, z_j)`` over the sample, a strip of rows at a time (float64)."""
    acc = np.zeros(Z.shape[0], dtype=np.float64)
    B = kernel.prepare(Z, np.dtype(np.float64), "right")
    for a in range(0, S.shape[0], rows):
        A = kernel.prepare(S[a : a + rows], np.dtype(np.float64), "left")
        acc += np.asarray(kernel.evaluate(A, B), dtype=np.float64).sum(axis=0)
    return acc / S.shape[0]
