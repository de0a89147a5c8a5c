"""Solve stage: fit kernel PCA (exact or Nyström) via kpca_dask and save the model."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import dask
import dask.array as da
import numpy as np

from kpca_dask import KernelPCA
from kpca_dask import cost as _cost
from kpca_dask.cost import EXECUTION_CONFIG
from kpca_dask.exceptions import (
    ConstantKernelError,
    ConvergenceWarning,
    DroppedComponentsWarning,
    PrecisionWarning,
)
from pipeline.config import PipelineConfig
from pipeline.output import Location

from .fit_check import (
    CONSTANT_KERNEL,
    SolveError,
    certificate_record,
    check_fit,
)
from .fitspec import Fit, plan_fit

__all__ = [
    "save_model",
    "solve",
    "SolveError",
    "check_fit",
    "nystroem_rows",
    "memory_budget",
    "PERSIST_FRACTION",
]

logger = logging.getLogger("pipeline")


#: Share of the workers' memory (all workers' memory limits together; without a cluster,
#: the memory available now) that the Nyström solve may fill with the training rows, read
#: once from the ingest store, instead of re-reading the store at every pass.
PERSIST_FRACTION = 0.3


def memory_budget(fraction: float | None = None) -> int:
    """Bytes of training rows the solve may keep in memory: ``fraction`` of the memory
    limits of the current Dask client's workers (the memory available on this machine
    when there is no client, or a worker has no limit); ``fraction`` defaults to
    :data:`PERSIST_FRACTION`."""
    import psutil

    fraction = PERSIST_FRACTION if fraction is None else float(fraction)
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):
        client = None
    if client is not None:
        workers = client.scheduler_info(n_workers=-1).get("workers", {}).values()
        limits = [int(w.get("memory_limit") or 0) for w in workers]
        if limits and all(limits):
            return int(fraction * sum(limits))
    return int(fraction * psutil.virtual_memory().available)


def nystroem_rows(X: da.Array, *, budget: int | None = None) -> tuple[da.Array, dict[str, Any]]:
    """The training rows as the Nyström passes read them (in the planned blocks: the
    estimator's Nyström size, about 8192 rows, or ``chunks.block_rows``), and how.

    Read from the ingest store once into the workers' memory when they fit ``budget``
    (default :func:`memory_budget`): the fit otherwise re-reads the whole store for its
    NaN check, the gamma and landmark samples and every pass (11 reads of a 1.1 GB store
    at n = 2M). benchmarks/diag_pipeline_io.py measures both.
    """
    n, r = int(X.shape[0]), int(X.chunks[0][0])
    budget = memory_budget() if budget is None else int(budget)
    nbytes = int(X.nbytes)
    in_memory = nbytes <= budget
    if in_memory:
        X = X.persist()
    how = (
        "read once into memory (%.2f GB of a %.2f GB budget)"
        if in_memory
        else "re-read from the ingest store at every pass (%.2f GB > a %.2f GB memory budget)"
    )
    logger.info(
        "solve: Nyström passes over %d rows in blocks of %d, " + how,
        n,
        r,
        nbytes / 1e9,
        budget / 1e9,
    )
    return X, {"block_rows": r, "rows_in_memory": in_memory}


def save_model(est: KernelPCA, model_loc: Location) -> None:
    """Save a fitted model at ``model_loc``: a local folder, or a zarr store carrying the
    location's own storage options (an object store's endpoint is never assumed)."""
    est.save(
        model_loc.local_path if model_loc.is_local else model_loc.zarr_source(writable=True),
        overwrite=True,
    )


def solve(
    X_train: da.Array,
    cfg: PipelineConfig,
    model_loc: Location,
    *,
    fit: Fit | None = None,
    block_rows: int | str = "auto",
    block_reader: Any = None,
    features: dict[str, Any] | None = None,
    scaler: Any = None,
    v0: Any = None,
) -> tuple[KernelPCA, dict[str, Any]]:
    """Fit on the training rows and save the model to ``model_loc`` (arrays + JSON).

    ``fit``: the planned fit (:func:`pipeline.model.fitspec.plan_fit`: the estimator, its
    solver and block rows); None: planned here from ``cfg`` with ``block_rows`` and no
    kernel store. The estimator rechunks ``X_train`` into the planned blocks (a no-op
    when the caller already did, as the solve stage does).

    ``v0``: starting vectors for the exact randomized solver (an update's warm-started
    refit, pipeline/update/run.py); dropped, with a log line, when the fit resolves to
    Nyström.

    ``features``: the run's features block (pipeline/data/features.py), saved with the model
    (``KernelPCA.record_features``): its transform then selects columns by name.
    ``scaler``: the feature scaling the split stage fitted on these rows
    (:class:`kpca_dask.preprocess.Scaler`); the estimator applies it and keeps it in
    the model. ``X_train`` is in the original units.
    """
    t0 = time.perf_counter()
    if fit is None:
        n, d = (int(s) for s in X_train.shape)
        rows = None if block_rows == "auto" else min(int(block_rows), n)
        fit = plan_fit(cfg, n, d, kernel_store=False, block_rows=rows)
    est = fit.estimator  # its chunk_size is the planned block rows
    reading: dict[str, Any] = {}
    nystroem = fit.solver == "nystroem"
    if block_reader is None and nystroem:
        X_train, reading = nystroem_rows(X_train.rechunk({0: fit.block_rows, 1: -1}))
    predicted = _predict(est, X_train, block_reader, reading)
    fit_kw = _fit_kwargs(v0, nystroem, scaler, block_reader)
    caught = _fit_caught(est, X_train, fit_kw)
    del X_train  # rows kept in the workers' memory are released with it
    _report_warnings(caught)
    fit_s = time.perf_counter() - t0
    check_fit(est, cfg)
    if features is not None:
        info_ = {k: v for k, v in features.items() if k not in ("names", "dtypes")}
        est.record_features(features["names"], dtypes=features.get("dtypes"), **info_)
    save_model(est, model_loc)
    info = _solve_info(est, scaler, reading, fit_s, time.perf_counter() - t0)
    if predicted is not None:
        info["cost_model"] = _measured(predicted, est, fit_s)
    if "v0" in fit_kw:
        info["warm_start"] = est.solver_info_.get("warm_start")
    logger.info(
        "solve: %s solver, %d components, %d passes, max residual %.2e in %.1f s",
        info["solver"],
        info["n_components"],
        info["n_passes"],
        info["max_residual"] or 0.0,
        fit_s,
    )
    return est, info


def _fit_kwargs(v0: Any, nystroem: bool, scaler: Any, block_reader: Any) -> dict[str, Any]:
    """The estimator's ``fit`` keywords: the warm start (not for Nyström: logged), the
    scaler, the kernel store's block reader."""
    fit_kw: dict[str, Any] = {}
    if v0 is not None and nystroem:
        logger.info("solve: no warm start: the fit resolved to the Nyström solver")
    elif v0 is not None:
        fit_kw["v0"] = v0
    if scaler is not None:
        fit_kw["scaler"] = scaler
    if block_reader is not None:
        fit_kw["kernel_blocks"] = block_reader
    return fit_kw


def _fit_caught(est: KernelPCA, X_train: da.Array, fit_kw: dict[str, Any]) -> list[Any]:
    """``est.fit`` on the pipeline's cluster; the warnings it raised (SolveError for a
    constant kernel)."""
    with warnings.catch_warnings(record=True) as caught:
        # fewer components than asked is an error here (check_fit), not a warning;
        # an uncertified solve is logged and then judged by check_fit (its certificate)
        warnings.filterwarnings("ignore", category=DroppedComponentsWarning)
        warnings.simplefilter("always", ConvergenceWarning)
        warnings.simplefilter("always", PrecisionWarning)
        try:
            # the pipeline's cluster is the one its config names: every fit runs there
            with dask.config.set({EXECUTION_CONFIG: "cluster"}):
                est.fit(X_train, **fit_kw)
        except ConstantKernelError as e:
            raise SolveError(CONSTANT_KERNEL) from e
    return caught


def _report_warnings(caught: list[Any]) -> None:
    """An uncertified solve, or a precision the data/kernel cannot support: the log's
    warning line (the run goes on; check_fit judges the certificate); others re-emitted."""
    for w in caught:
        if issubclass(w.category, (ConvergenceWarning, PrecisionWarning)):
            logger.warning("solve: %s", w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _solve_info(
    est: KernelPCA, scaler: Any, reading: dict[str, Any], fit_s: float, seconds: float
) -> dict[str, Any]:
    """The fitted model's record in the manifest (solver, passes, residual, kernel...)."""
    return {
        "solver": est.eigen_solver_,
        "n_components": int(est.n_components_),
        "n_passes": int(getattr(est, "n_passes_", 0)),
        "converged": bool(getattr(est, "converged_", True)),
        "max_residual": float(np.max(est.residuals_)) if est.residuals_ is not None else None,
        "certificate": certificate_record(est),
        "gamma": est.gamma_,
        "kernel": est.kernel_.to_dict(),
        "preprocess": None if scaler is None else scaler.method,
        "fit_seconds": fit_s,
        "seconds": seconds,
        **reading,
    }


def _predict(
    est: KernelPCA, X_train: da.Array, block_reader: Any, reading: dict[str, Any]
) -> tuple | None:
    """The cost model's prediction of this fit on the active cluster (None when it cannot
    be made: the run goes on without it)."""
    try:
        from distributed import default_client

        cluster = _cost.Cluster.from_client(default_client())
    except (ImportError, ValueError):
        cluster = _cost.Cluster.local()
    try:
        plan = est.plan(X_train, kernel=False)
        kw = {
            "kernel_cache": "store" if block_reader is not None else "auto",
            "input_in_memory": bool(reading.get("rows_in_memory", True)),
        }
        machine = _cost.load_machine()
        return plan, cluster, machine, kw, plan.estimate(cluster, machine, **kw)
    except Exception as exc:  # the model must never fail a run
        logger.info("solve: no cost prediction (%s)", exc)
        return None


def _measured(predicted: tuple, est: KernelPCA, fit_s: float) -> dict[str, Any]:
    """The prediction beside what happened: the manifest's ``cost_model`` block."""
    plan, cluster, machine, kw, est0 = predicted
    passes = int(getattr(est, "n_passes_", 0) or 0)
    out: dict[str, Any] = {
        "predicted": est0.to_dict(),
        "measured": {
            "fit_seconds": fit_s,
            "passes": passes,
            "pass_seconds": list(est.solver_info_.get("pass_seconds") or []),
            "solver": est.eigen_solver_,
        },
    }
    if passes and est0.solver == est.eigen_solver_:
        try:
            re = plan.estimate(cluster, machine, passes=passes, **kw)
            out["predicted_at_measured_passes"] = {"seconds": re.seconds, "bound": re.bound}
            out["measured_over_predicted"] = fit_s / re.seconds if re.seconds else None
        except Exception as exc:  # pragma: no cover - the first estimate worked
            logger.info("solve: no re-priced prediction (%s)", exc)
    return out
