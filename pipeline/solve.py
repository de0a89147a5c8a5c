"""Solve stage: fit kernel PCA (exact or Nyström) via kpca_dask and save the model."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import dask.array as da
import numpy as np

from kpca_dask import KernelPCA
from kpca_dask.exceptions import (ConstantKernelError, ConvergenceWarning,
                                  DroppedComponentsWarning)

from .errors import UserError
from .config import PipelineConfig
from .denoise import estimator_params
from .store import Location

__all__ = ["make_estimator", "make_planner", "solve", "SolveError", "check_fit"]

logger = logging.getLogger("pipeline")


class SolveError(UserError, ValueError):
    """The fit is not good enough to publish; the message says why and what to change."""


# One message for a constant centred kernel, whichever code path notices it: the solver
# (no positive eigenvalue at all, kpca_dask's ConstantKernelError) or check_fit (eigenvalues
# that are rounding noise). Which one fires depends on the CPU's rounding, not on the data.
CONSTANT_KERNEL = (
    "the centred kernel matrix is zero to rounding: the data are constant in feature "
    "space (every row identical, or kernel.gamma so large or small that the kernel is "
    "constant); check the input and kernel.gamma.")


def check_fit(est: KernelPCA, cfg: PipelineConfig) -> None:
    """Refuse a fit that is not what was asked for, or not accurate, before it is saved.

    - fewer components than ``solver.n_components`` (the estimator drops
      non-positive eigenvalues with a warning; a run must not publish k-1
      columns to a downstream job that expects k);
    - a certified residual above ``solver.max_residual``.
    """
    k_req, k = int(cfg.solver.n_components), int(est.n_components_)
    trace = float(getattr(est, "kernel_trace_", 0.0) or 0.0)
    # rounding noise of the kernel's dtype: float32 leaves ~1e-9 * trace of noise eigenvalues
    # on a constant kernel, float64 ~1e-16; a real signal is far above either bound
    noise = max(1e-10, 100 * float(np.finfo(np.dtype(cfg.solver.dtype)).eps))
    if trace > 0 and float(np.max(est.eigenvalues_)) <= noise * trace:
        raise SolveError(CONSTANT_KERNEL)
    if k < k_req:
        if cfg.kernel.name == "sigmoid":
            why = (f"the sigmoid kernel is not positive semi-definite and only {k} eigenvalues "
                   "of the centred kernel matrix are clearly positive")
        else:
            why = (f"the centred kernel matrix has only {k} clearly positive eigenvalues "
                   "(duplicate rows or rank-deficient data)")
        raise SolveError(f"solver.n_components={k_req} but {why}; set solver.n_components to "
                         f"{k} or less.")
    lim = cfg.solver.max_residual
    res = getattr(est, "residuals_", None)
    if lim is not None and res is not None and len(res) and float(np.max(res)) > lim:
        raise SolveError(
            f"the {est.eigen_solver_} solver's certified residual {float(np.max(res)):.2g} "
            f"exceeds solver.max_residual={lim:g}: the eigenpairs are not accurate (too few "
            "passes for this spectrum); use eigen_solver: dense (n up to ~20k), set "
            "solver.n_power_iter: auto, raise solver.n_oversamples or solver.max_iter, or ask "
            "for fewer components.")


def make_estimator(cfg: PipelineConfig, block_rows: int | str = "auto") -> KernelPCA:
    """The estimator the config describes (parameters are validated by it at fit)."""
    s, k = cfg.solver, cfg.kernel
    params: dict[str, Any] = dict(
        n_components=s.n_components, kernel=k.name, gamma=k.gamma, degree=k.degree,
        coef0=k.coef0, eigen_solver=s.eigen_solver, n_oversamples=s.n_oversamples,
        n_power_iter=s.n_power_iter, tol=s.tol, max_iter=s.max_iter,
        random_state=s.random_state, dtype=s.dtype, chunk_size=block_rows,
        # the pipeline's contract: only positive components (check_fit says when fewer)
        remove_zero_eig=True)
    if s.n_landmarks is not None:
        params["n_landmarks"] = s.n_landmarks
    params["landmark_method"] = s.landmark_method
    params.update(estimator_params(cfg.denoise))  # the pre-image map, when denoising
    est = KernelPCA()
    return est.set_params(**params)


def make_planner(cfg: Any) -> KernelPCA:
    """The estimator the kernel stage plans with: the kernel and the fields that choose the
    solver and its kernel partition (no stopping rule, no pre-image: those only matter to
    the fit, and the kernel stage's cache key must not depend on them)."""
    s, k = cfg.solver, cfg.kernel
    params: dict[str, Any] = dict(
        n_components=s.n_components, kernel=k.name, gamma=k.gamma, degree=k.degree,
        coef0=k.coef0, eigen_solver=s.eigen_solver, n_oversamples=s.n_oversamples,
        random_state=s.random_state, dtype=s.dtype, remove_zero_eig=True,
        landmark_method=s.landmark_method)
    if s.n_landmarks is not None:
        params["n_landmarks"] = s.n_landmarks
    return KernelPCA().set_params(**params)


def solve(X_train: da.Array, cfg: PipelineConfig, model_loc: Location, *,
          block_rows: int | str = "auto", block_reader: Any = None
          ) -> tuple[KernelPCA, dict[str, Any]]:
    """Fit on the training rows and save the model to ``model_loc`` (arrays + JSON)."""
    t0 = time.perf_counter()
    est = make_estimator(cfg, block_rows)
    fit_kw: dict[str, Any] = {}
    if block_reader is not None:
        fit_kw["kernel_blocks"] = block_reader
    with warnings.catch_warnings(record=True) as caught:
        # fewer components than asked is an error here (check_fit), not a warning;
        # an uncertified solve is logged and then judged by check_fit (max_residual)
        warnings.filterwarnings("ignore", category=DroppedComponentsWarning)
        warnings.simplefilter("always", ConvergenceWarning)
        try:
            est.fit(X_train, **fit_kw)
        except ConstantKernelError as e:
            raise SolveError(CONSTANT_KERNEL) from e
    for w in caught:
        if issubclass(w.category, ConvergenceWarning):
            logger.warning("solve: %s", w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    fit_s = time.perf_counter() - t0
    check_fit(est, cfg)
    est.save(model_loc.url if not model_loc.is_local else model_loc.local_path, overwrite=True)
    info = {"solver": est.eigen_solver_, "n_components": int(est.n_components_),
            "n_passes": int(getattr(est, "n_passes_", 0)),
            "converged": bool(getattr(est, "converged_", True)),
            "max_residual": float(np.max(est.residuals_)) if est.residuals_ is not None else None,
            "gamma": est.gamma_, "kernel": est.kernel_.to_dict(), "fit_seconds": fit_s,
            "seconds": time.perf_counter() - t0}
    logger.info("solve: %s solver, %d components, %d passes, max residual %.2e in %.1f s",
                info["solver"], info["n_components"], info["n_passes"],
                info["max_residual"] or 0.0, fit_s)
    return est, info
