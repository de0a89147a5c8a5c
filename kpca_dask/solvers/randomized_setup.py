"""What :func:`.randomized.randomized_eigh` starts from: its settings with their
defaults resolved, the first block (seeded Gaussian, optionally warm-started), and
what ``eigen_solver="auto"`` does when a solve is not certified.

Memory: the first block is n x l (drawn whole, so results depend on the seed only,
not on any chunking); everything else is scalars.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg

from ..validation import check_start_vectors
from .krylov_basis import _orth

__all__ = [
    "DEFAULT_N_OVERSAMPLES",
    "default_max_basis",
    "default_rank_rtol",
    "default_tail_tol",
    "escalation_plan",
]


def _centre(Z: np.ndarray) -> np.ndarray:
    return Z - Z.mean(axis=0, keepdims=True)


def _identity(Z: np.ndarray) -> np.ndarray:
    return Z


#: Default extra columns of the randomized block (``l = k + n_oversamples``), shared by
#: the estimator and the solvers; chosen by whole-fit timings (docs/solvers.md, "The
#: block size").
DEFAULT_N_OVERSAMPLES = 16


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


class _Settings(NamedTuple):
    """The solver's parameters with their defaults resolved (:func:`_settings`)."""

    n: int
    k: int
    l: int
    method: str
    fixed: bool  # a fixed number of passes (n_power_iter an int)
    n_passes: int  # passes to make (fixed) or the cap ("auto")
    max_basis: int
    tol: float
    rank_rtol: float
    cluster_rtol: float
    angle_tol: float
    tail_tol: float | None
    noise: float  # rounding level of a product, relative to ||A||
    tail_floor: bool  # the rounding level counts toward the flat tail's level
    prep: Callable[[np.ndarray], np.ndarray]  # centring of blocks and vectors


def _settings(
    n: int,
    n_components: int,
    *,
    n_oversamples: int,
    n_power_iter: int | str,
    method: str,
    tol: float,
    max_passes: int,
    max_basis: int | None,
    eps: float,
    centre: bool,
    rank_rtol: float | None,
    cluster_rtol: float | None,
    tail_tol: float | None,
    tail_floor: bool = True,
) -> _Settings:
    """Check ``method`` and resolve every default of :func:`randomized_eigh`."""
    if method not in ("block_krylov", "subspace"):
        raise ValueError(f"Unknown randomized method {method!r}")
    k = int(n_components)
    fixed = n_power_iter != "auto"
    tail = default_tail_tol(tol) if tail_tol is None else float(tail_tol)
    return _Settings(
        n=n,
        k=k,
        l=min(n, k + int(n_oversamples)),
        method=method,
        fixed=fixed,
        n_passes=int(n_power_iter) + 1 if fixed else int(max_passes),
        max_basis=default_max_basis(n) if max_basis is None else int(max_basis),
        tol=tol,
        rank_rtol=default_rank_rtol(eps) if rank_rtol is None else float(rank_rtol),
        cluster_rtol=(
            min(0.05, 100.0 * np.sqrt(tol)) if cluster_rtol is None else float(cluster_rtol)
        ),
        angle_tol=float(np.sqrt(tol)),
        tail_tol=tail if tail > 0 else None,
        noise=float(eps) * np.sqrt(n),
        tail_floor=bool(tail_floor),
        # The test matrix is centred: Kc's null vector 1 carries no information.
        prep=_centre if centre else _identity,
    )


def _first_block(s: _Settings, random_state: Any, v0: Any) -> tuple[np.ndarray, int]:
    """The first block (orthonormal, n x l) and how many warm-start columns it holds.

    The Gaussian test matrix is drawn whole (n x l) whatever ``v0`` is: the same
    seed gives the same rest. Memory: n x l twice (draw and its orthonormal basis).
    """
    Omega = _generator(random_state).standard_normal((s.n, s.l))
    n_warm = 0
    if v0 is not None:
        V0 = _start_vectors(v0, s.n, s.l)
        n_warm = V0.shape[1]
        Omega[:, :n_warm] = V0 * np.sqrt(s.n)  # the Gaussian columns' scale
    return _orth(s.prep(Omega)), n_warm


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


def _generator(random_state: Any) -> np.random.Generator:
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    return np.random.default_rng(random_state)


def _n_existing(theta: np.ndarray, k: int, rank_rtol: float, tau: float) -> int:
    """How many of the leading k Ritz values are (numerically) non-zero eigenvalues."""
    if theta.size == 0 or theta[0] <= 0:
        return 0
    cut = max(rank_rtol * theta[0], tau)
    return int(min(k, np.count_nonzero(theta > cut)))


def _tail_level(theta: np.ndarray, tau: float, s: _Settings) -> float | None:
    """The flat tail's level: ``tail_tol``, less ``tau / theta_k`` when the rounding
    level must not count toward it (``tail_floor=False``): then a pair accepted at
    ``b lambda <= level lambda + tau`` has ``b lambda <= tail_tol lambda`` (``lambda >=
    theta_k``)."""
    if s.tail_tol is None or s.tail_floor:
        return s.tail_tol
    last = float(theta[min(s.k, len(theta)) - 1]) if len(theta) else 0.0
    if last <= 0.0:
        return s.tail_tol / 2
    return max(s.tail_tol - tau / last, s.tail_tol / 2)


def _rayleigh_ritz(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ritz values of A on span(W) from ``M = W^T A W``, descending, and their coordinates."""
    M = (M + M.T) / 2
    theta, U = np.linalg.eigh(M)
    order = np.argsort(theta)[::-1]
    return theta[order], U[:, order]
