"""The Nyström eigensolve of a planned fit: the landmarks, the ``k(Z, Z)`` basis, the
passes over X (randomized, escalated to the covariance method under "auto"), and the
:class:`~kpca_dask._solution.Solution` the estimator keeps (``kpca_dask._solve``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import dask.array as da
import numpy as np

from ._solution import Solution
from .exceptions import InvalidParameterError
from .plan import FitPlan
from .solvers import EigResult
from .solvers.landmarks import select_landmarks
from .solvers.nystroem import choose_method, nystroem_basis, nystroem_eigh
from .solvers.randomized import _generator

__all__ = ["_solve_nystroem"]

logger = logging.getLogger("kpca_dask")


def _solve_nystroem(plan: FitPlan, params: Mapping[str, Any], Xb: da.Array) -> Solution:
    """Landmarks, the W eigendecomposition, the passes over X."""
    m = plan.n_landmarks
    if m > 16384:
        logger.warning(
            "Nyström with %d landmarks forms %.1f GB m x m matrices on the driver",
            m,
            8 * m * m / 1e9,
        )
    rng = _generator(params["random_state"])
    lm, basis, t_landmarks = _landmarks_basis(plan, params, Xb, rng)
    k = params["n_components"]
    method, keep, keep_stats, auto = _method(plan, params, basis)
    fit = nystroem_eigh(
        Xb,
        basis,
        k,
        method=method,
        n_oversamples=params["n_oversamples"],
        n_power_iter=plan.power_iter,
        randomized_method=params["randomized_method"],
        tol=plan.tol,
        max_passes=plan.max_passes,
        random_state=np.random.default_rng(rng.integers(2**63)),
        warn=not auto,
        keep_statistics=keep_stats,
        all_rows=lm.info.get("method") == "all",
    )
    if auto and not fit.converged:
        fit, method = _escalate(fit, Xb, basis, k, keep)
    return _solution(fit, lm, k, t_landmarks, method, params)


def _landmarks_basis(
    plan: FitPlan, params: Mapping[str, Any], Xb: da.Array, rng: np.random.Generator
) -> tuple[Any, Any, float]:
    """The landmarks, their ``k(Z, Z)`` basis and the seconds the selection took."""
    kernel, dtype = plan.kernel, plan.dtype
    size = params["landmark_sample_size"]
    t0 = time.perf_counter()
    lm = select_landmarks(
        Xb,
        plan.n_landmarks,
        params["landmark_method"],
        kernel,
        rng,
        sample_size=None if size == "auto" else int(size),
        dtype=dtype,
    )
    t_landmarks = time.perf_counter() - t0
    basis = nystroem_basis(lm.points, kernel, dtype, shift=lm.column_means)
    if not kernel.psd and basis.n_dropped:
        logger.info(
            "Nyström: the kernel is not positive semi-definite; %d non-positive "
            "eigenvalues of k(Z, Z) were dropped (the PSD part is used)",
            basis.n_dropped,
        )
    return lm, basis, t_landmarks


def _method(
    plan: FitPlan, params: Mapping[str, Any], basis: Any
) -> tuple[str, Any, bool, bool]:
    """The Nyström method, ``keep_statistics`` as given and as decided, and whether
    "auto" chose the randomized method (escalated when not certified)."""
    k = params["n_components"]
    l = (k or 0) + params["n_oversamples"]
    method = params["nystroem_method"]
    if method == "auto":
        method = choose_method(basis.m, plan.n_features, k, l)
    if k is None and method == "randomized":
        raise InvalidParameterError(
            "nystroem_method='randomized' needs an explicit n_components (None means "
            "all components: use nystroem_method='covariance')."
        )
    keep = params.get("keep_statistics", "auto")
    if keep is True and params["nystroem_method"] == "auto":
        # one covariance pass solves exactly and yields the statistics; the randomized
        # solve would need that pass on top of its own
        method = "covariance"
    keep_stats = keep is True or (keep == "auto" and method == "covariance")
    auto = params["nystroem_method"] == "auto" and method == "randomized"
    return method, keep, keep_stats, auto


def _escalate(fit: Any, Xb: da.Array, basis: Any, k: int | None, keep: Any) -> tuple[Any, str]:
    """The "auto" escalation: the covariance method is exact on the Nyström problem."""
    logger.info(
        "Nyström randomized eigensolve not certified after %d passes; "
        "using the covariance method",
        fit.n_passes,
    )
    first = {"n_passes": fit.n_passes, "certificate": fit.info.get("certificate")}
    fit = nystroem_eigh(Xb, basis, k, method="covariance", keep_statistics=keep is not False)
    fit.n_passes += first["n_passes"]
    fit.info["escalated_from"] = first
    return fit, "covariance"


def _solution(
    fit: Any,
    lm: Any,
    k: int | None,
    t_landmarks: float,
    method: str,
    params: Mapping[str, Any],
) -> Solution:
    """The fit's eigenpairs (zero-padded to ``k``) and what a Nyström model keeps."""
    lam, A, resid = fit.eigenvalues, fit.projection, fit.residuals
    if k is not None and lam.size < k:
        # The features have rank m' < k: pad with zero pairs, which
        # drop_nonpositive removes with its usual warning.
        pad = k - lam.size
        lam = np.concatenate([lam, np.zeros(pad)])
        A = np.hstack([A, np.zeros((A.shape[0], pad))])
        resid = np.concatenate([resid, np.full(pad, np.nan)])
    info = {
        "solver": "nystroem",
        "landmarks": lm.info,
        "landmark_seconds": t_landmarks,
        **fit.info,
    }
    res = EigResult(lam, A, resid, n_passes=fit.n_passes, converged=fit.converged, info=info)
    extra = {
        "landmark_indices_": lm.indices,
        "n_landmarks_": int(lm.indices.size),
        "landmark_method_": lm.info.get("method", params["landmark_method"]),
        "nystroem_method_": method,
        "mean_weights_": fit.mean_weights,
        # sufficient statistics for exact updates (kpca_dask.update); None: not kept
        "statistics_": fit.statistics,
    }
    return Solution(
        res, fit.column_means, fit.grand_mean, fit.kernel_trace, "nystroem", lm.points, extra
    )
