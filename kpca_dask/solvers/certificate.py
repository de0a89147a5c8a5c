"""The a-posteriori certificate of Ritz pairs (:func:`certify`).

Given Ritz values ``theta`` (descending) of a symmetric operator ``A``, their
residual norms ``r_i = ||A v_i - theta_i v_i||`` and the residual norms of
clusters of them, :func:`certify` states per returned pair what is proven and to
which level:

* eigenvalues: ``|theta - lambda| <= min(r, R_C^2 / gap_C)``, Weyl's residual
  bound (the Krylov-Bogoliubov bound: Parlett, *The Symmetric Eigenvalue
  Problem*, SIAM 1998, ch. 4) and the Kato-Temple quadratic bound for the cluster
  C of the pair (Kato 1949; Parlett ch. 10; ``R_C`` the cluster's residual norm,
  ``gap_C`` its distance to the rest of the spectrum). Isolated eigenvalues are
  certified to ``tol``, those inside a cluster of nearly equal ones to
  ``cluster_tol`` (the solver passes ``tol**0.75``).
* vectors: for a cluster C of nearly equal Ritz values (relative gaps below
  ``cluster_rtol``) only the invariant subspace is well defined, and
  ``sin angle <= R_C / gap_C`` (Davis and Kahan 1970, the sin-theta theorem)
  certifies it; a lone pair is a cluster of one. When ``k`` cuts a cluster, the
  returned part of it is not defined by the problem and only its eigenvalues are
  certified.
* the flat tail: when ``k`` cuts a run of Ritz values whose relative gaps are
  all below ``tail_rtol`` (5 %), no gap defines the vectors or a subspace of any
  part of it, and only Weyl's bound (linear in the residual) certifies its
  eigenvalues, to ``tail_tol``; their vectors are not certified ("eigenvalue
  only").

The gaps come from the Ritz values beyond the returned ones, each widened by its
own residual (an eigenvalue lies within ``r_j`` of ``theta_j``: the Ritz values
are matched to the eigenvalues in order, the assumption every a-posteriori
Krylov bound makes, as a direction the random start missed is invisible to
residuals; docs/solvers.md).

Cost: O(k) scalar work and one small spectral norm per cluster; no n-sized
memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["Certificate", "certify", "not_converged_message"]


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

    Cost: one ``block_residual`` call per cluster (a small spectral norm) and
    O(k) scalar work; no n-sized memory.
    """
    levels = _Levels(
        tol=tol,
        cluster=tol if cluster_tol is None else float(cluster_tol),
        tail=tail_tol,
        tail_start=_tail_start(theta, k, tail_rtol, below) if tail_tol is not None else k,
        floor=floor,
        angle=angle_tol,
    )
    table = _PairTable(k)
    for c, (a, b) in enumerate(_clusters(theta, cluster_rtol)):
        if a >= k:
            break
        gap = _cluster_gap(theta, res, a, b, below)
        R = float(block_residual(a, b))
        _certify_cluster(table, theta, res, c, a, b, gap, R, levels)
    return table.certificate(levels)


class _Levels(NamedTuple):
    """The levels :func:`certify` checks against: relative eigenvalue levels
    (``tol`` for a lone pair, ``cluster`` inside a cluster, ``tail`` from index
    ``tail_start`` on), the absolute rounding ``floor`` and the ``angle`` level."""

    tol: float
    cluster: float
    tail: float | None
    tail_start: int
    floor: float
    angle: float


class _PairTable:
    """Per-pair results of :func:`certify` (k entries each), filled cluster by cluster."""

    def __init__(self, k: int):
        self.eig_b = np.full(k, np.inf)
        self.ang_b = np.full(k, np.inf)
        self.cid = np.zeros(k, dtype=int)
        self.eig_ok = np.zeros(k, dtype=bool)
        self.vec_ok = np.zeros(k, dtype=bool)
        self.kind = [""] * k
        self.sizes: list[int] = []
        self.cut: int | None = None

    def certificate(self, lv: _Levels) -> Certificate:
        k = len(self.kind)
        return Certificate(
            ok=bool(self.eig_ok.all() and self.vec_ok.all()),
            eigenvalue_ok=self.eig_ok.tolist(),
            vector_ok=self.vec_ok.tolist(),
            eigenvalue_bounds=[float(x) for x in self.eig_b],
            angle_bounds=[float(x) for x in self.ang_b],
            clusters=self.cid.tolist(),
            cluster_sizes=self.sizes,
            cut_cluster=self.cut,
            tail_start=int(lv.tail_start) if lv.tail_start < k else None,
            certified=self.kind,
            eigenvalue_levels=[
                float(
                    lv.tail
                    if i >= lv.tail_start
                    else lv.tol
                    if self.sizes[self.cid[i]] == 1
                    else lv.cluster
                )
                for i in range(k)
            ],
            rounding_level=float(lv.floor),
        )


def _cluster_gap(
    theta: np.ndarray, res: np.ndarray, a: int, b: int, below: float | None
) -> float:
    """Distance of the cluster ``[a, b)`` to the rest of the spectrum: to the Ritz
    values next to it, each shrunk by its residual (an eigenvalue lies within it), or
    to ``below`` past the last known one (0 when nothing is known there)."""
    m = len(theta)
    up = np.inf if a == 0 else (theta[a - 1] - res[a - 1]) - theta[a]
    if b < m:
        down = theta[b - 1] - (theta[b] + res[b])
    else:
        down = 0.0 if below is None else theta[b - 1] - below
    return max(0.0, min(up, down))


def _certify_cluster(
    t: _PairTable,
    theta: np.ndarray,
    res: np.ndarray,
    c: int,
    a: int,
    b: int,
    gap: float,
    R: float,
    lv: _Levels,
) -> None:
    """Fill ``t`` for the returned pairs of cluster ``c = [a, b)`` (block residual
    ``R``, ``gap`` to the rest of the spectrum).

    Eigenvalues: ``min(r_i, R^2 / gap)`` (Weyl; Kato-Temple), Weyl alone in the flat
    tail. Vectors: ``sin angle <= R / gap`` (Davis-Kahan) for the cluster's subspace.
    """
    k = len(t.kind)
    t.sizes.append(b - a)
    tail = lv.tail_start
    for i in range(a, min(b, k)):
        quad = R * R / gap if gap > 0 else np.inf
        # the flat tail: Weyl's bound, the residual itself (its gaps are too small
        # to trust R^2 / gap, and a published pair's residual is what the
        # pipeline's solver.max_residual judges: tail_tol <= max_residual by default)
        bound = float(res[i]) if i >= tail else min(float(res[i]), quad)
        scale = abs(float(theta[i]))
        t.eig_b[i] = bound / scale if scale > 0 else np.inf
        level = lv.tail if i >= tail else lv.tol if b - a == 1 else lv.cluster
        t.eig_ok[i] = bound <= level * scale + lv.floor
        t.ang_b[i] = min(1.0, R / gap) if gap > 0 else 1.0
        # a cluster cut by k: the returned vectors are an arbitrary part of its
        # subspace, not defined by the problem: only their eigenvalues are
        # certified (which bounds their distance to that subspace too)
        # the angle moves the embedding (v sqrt(theta)) by angle * sqrt(theta):
        # measured against the leading component's scale sqrt(theta_1)
        weight = np.sqrt(abs(float(theta[a])) / abs(float(theta[0]))) if theta[0] else 1.0
        vec_certified = R * weight <= lv.angle * gap + lv.floor and gap > 0
        t.vec_ok[i] = b > k or i >= tail or vec_certified
        if i >= tail or b > k:
            t.kind[i] = "eigenvalue only"
        else:
            t.kind[i] = "vector" if b - a == 1 else "subspace"
        t.cid[i] = c
    if a < k < b:
        t.cut = c


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
