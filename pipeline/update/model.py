"""The ``update`` stage of ``kpca update`` (pipeline/update/run.py): the new model, the batch's
sufficient statistics merged into the base model's (exact Nyström update) or a refit on
every row of the lineage (warm-started when it can be), and which of the base model's
kernel parameter and solver it changed, and why."""

from __future__ import annotations

import logging
import time
from typing import Any

import dask.array as da
import numpy as np

from pipeline.data.ingest import IngestResult, load_ingested
from pipeline.model.fitspec import plan_fit
from pipeline.output import run_layout
from pipeline.runner.results import SolveResult
from pipeline.update.base import _load_base_model, _sample, _training_rows

logger = logging.getLogger("pipeline")


def stage_update(
    cfg: Any, ing: IngestResult, base: dict[str, Any], drift: dict[str, Any]
) -> SolveResult:
    """The new model: merged (exact Nyström update) or refitted on every row."""
    from kpca_dask.update import update
    from pipeline.model.solve import check_fit, save_model, solve

    layout = run_layout(cfg)
    t0 = time.perf_counter()
    X_new = load_ingested(ing).X
    action = drift["action"]
    if action == "merge":
        model = _load_base_model(base)
        update(model, X_new)
        check_fit(model, cfg)
        save_model(model, layout.model)
        info = {
            "solver": model.eigen_solver_,
            "n_components": int(model.n_components_),
            "n_passes": 1,
            "converged": True,
            "max_residual": float(np.max(model.residuals_)),
            "gamma": model.gamma_,
            "kernel": model.kernel_.to_dict(),
            "n_samples_fit": int(model.n_samples_fit_),
            "seconds": time.perf_counter() - t0,
        }
        logger.info(
            "update: merged %d rows into the model: %d training rows, %d components",
            X_new.shape[0],
            model.n_samples_fit_,
            model.n_components_,
        )
    else:
        base_model = _load_base_model(base)
        overrides, why = _fit_overrides(cfg, base_model, action)
        X = _training_rows(base["lineage"], X_new)
        # (a slice: the drift stage's graph of the lineage alone has the same keys)
        X_old = X[: X.shape[0] - X_new.shape[0]]
        v0 = None if action == "refresh_landmarks" else _warm_start(base, X_old, X_new)
        # the features are the base run's (the batch's columns were matched to them by
        # name): the new model records the base's block, selection rule included
        features = base.get("features") or ing.features
        if features is not None and features.get("selection") == "positions":
            features = None
        # the scaling is fitted again on every row (preprocess), as a full run would
        n, d = (int(s) for s in X.shape)
        fit = plan_fit(cfg, n, d, overrides=overrides, kernel_store=False)
        _, info = solve(X, cfg, layout.model, fit=fit, features=features, v0=v0)
        info = {**info, "n_samples_fit": int(X.shape[0])}
        info["changes"] = _changes(base_model, info, why)
        if info.get("warm_start"):
            logger.info(
                "update: refit warm-started from the base model's %d eigenvectors: %d passes",
                info["warm_start"],
                info["n_passes"],
            )
    if action == "merge":
        info["changes"] = _changes(model, info, _KEPT_BY_MERGE)
    for name, c in info["changes"].items():
        logger.info(
            "update: %s %s (%s -> %s): %s",
            name,
            "CHANGED" if c["changed"] else "kept",
            c["base"],
            c["new"],
            c["why"],
        )
    info["action"] = action
    return SolveResult(model=layout.model, info=info)


_KEPT_BY_MERGE = {
    "gamma": "a merge keeps the base model's kernel (its statistics are sums under it)",
    "solver": "a merge keeps the base model's landmarks and solver",
}

#: the solvers a config can name (an ARPACK model is refitted with solver "auto")
_CONFIG_SOLVERS = ("dense", "randomized", "nystroem")


def _fit_overrides(
    cfg: Any, base_model: Any, action: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The refit's estimator parameters that differ from the config's
    (pipeline/model/fitspec.py; the config is not changed): the base model's kernel parameters
    (``update.kernel_params: keep``; gamma resolved once, at the first fit) and its
    solver, unless the policy changes them (``refresh_landmarks``: a Nyström fit;
    ``kernel_params: resolve``); and why each is what it is."""
    overrides: dict[str, Any] = {}
    why: dict[str, str] = {}
    gamma = getattr(base_model, "gamma_", None)
    if cfg.update.kernel_params == "keep" and gamma is not None:
        overrides["gamma"] = float(gamma)
        why["gamma"] = "update.kernel_params is 'keep': the base model's gamma"
    else:
        why["gamma"] = (
            f"update.kernel_params is 'resolve': kernel.gamma={cfg.kernel.gamma!r} resolved "
            "again on every row"
        )
    solver = str(getattr(base_model, "eigen_solver_", "") or "")
    if action == "refresh_landmarks":
        overrides["eigen_solver"] = "nystroem"
        why["solver"] = (
            "update.policy/on_drift chose refresh_landmarks: a Nyström fit with new landmarks"
        )
    elif solver in _CONFIG_SOLVERS:
        overrides["eigen_solver"] = solver
        why["solver"] = "a refit keeps the base model's solver"
    else:
        why["solver"] = f"the base model's solver {solver!r} is chosen by solver.eigen_solver"
    return overrides, why


def _changes(base_model: Any, info: dict[str, Any], why: dict[str, str]) -> dict[str, Any]:
    """Which of the base model's kernel parameter and solver the new model changed."""
    g0 = getattr(base_model, "gamma_", None)
    s0 = getattr(base_model, "eigen_solver_", None)
    g1, s1 = info.get("gamma"), info.get("solver")
    same_gamma = g0 == g1 or (g0 is not None and g1 is not None and np.isclose(g0, g1, 0, 0))
    return {
        "gamma": {
            "base": None if g0 is None else float(g0),
            "new": None if g1 is None else float(g1),
            "changed": not same_gamma,
            "why": why["gamma"],
        },
        "solver": {"base": s0, "new": s1, "changed": s0 != s1, "why": why["solver"]},
    }


def _warm_start(base: dict[str, Any], X_old: da.Array, X_new: da.Array) -> Any:
    """Starting vectors for an exact refit: the base model's eigenvectors on its rows,
    extended to the batch (kpca_dask.update.warm_start_vectors); None (cold start,
    logged) for a Nyström base or when the lineage's training rows are not the
    model's, in its order (checked on a seeded sample of rows)."""
    from kpca_dask.solvers.landmarks import gather_rows
    from kpca_dask.update import warm_start_vectors

    model = _load_base_model(base)
    if getattr(model, "eigen_solver_", None) == "nystroem" or model.X_fit_.shape[1] == 0:
        return None
    n = int(model.n_samples_fit_)
    why = None
    if int(X_old.shape[0]) != n:
        why = f"the lineage has {X_old.shape[0]} training rows, the model {n}"
    else:
        idx = _sample(n, 64, 0)
        rows = gather_rows(X_old, idx)
        scaler = getattr(model, "preprocess_", None)
        rows = rows if scaler is None else scaler.transform(rows)
        fitted = np.asarray(model.X_fit_[idx], dtype=np.float64)
        if not np.allclose(rows, fitted, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(fitted).max())):
            why = "the lineage's training rows are not the model's (order or values)"
    if why is not None:
        logger.info("update: refit from a cold start: %s", why)
        return None
    return warm_start_vectors(model, X_new)
