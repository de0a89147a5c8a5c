"""The kernel stage: plan the fit (pipeline/model/fitspec.py: solver, block rows, whether to
materialise K), build the upper kernel blocks when that pays, and carry the plan to the
solve. :func:`planned_fit` is the other end of that hand-off (the solve stage calls it),
so the plan, its gamma and its blocks are read in this one module."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import dask.array as da
import numpy as np

from kpca_dask.params import resolve_kernel
from kpca_dask.precision import centred_for_rows
from pipeline.data.ingest import IngestResult
from pipeline.data.scaling import scaler_id, scaler_of
from pipeline.model.fitspec import PLAN_FIELDS, Fit, plan_fit
from pipeline.model.kernel_store import build_kernel_store
from pipeline.output import run_layout
from pipeline.runner.registry import Stage, config_slice
from pipeline.runner.results import KernelResult, SplitResult

from ..config import ConfigError
from ..errors import InternalError
from .common import _same, _training_rows

__all__ = ["KERNEL", "planned_fit", "stage_kernel"]

logger = logging.getLogger("pipeline")


def stage_kernel(cfg: Any, ing: IngestResult, split: SplitResult) -> KernelResult:
    """Plan the fit (pipeline/model/fitspec.py: solver, block rows, whether to materialise K)
    and, if K is materialised, build the upper-block store (resumable). The result
    carries the plan to the solve."""
    X_train = _training_rows(cfg, ing, split)
    n_train, d = (int(s) for s in X_train.shape)
    if cfg.solver.n_components > n_train:
        raise ConfigError(
            f"solver.n_components={cfg.solver.n_components} exceeds the "
            f"{n_train} training rows; ask for fewer components."
        )
    fit = plan_fit(cfg, n_train, d, plans_only=True)  # reads no data
    r, solver = fit.block_rows, fit.solver
    logger.info(
        "plan: %d training rows in blocks of %d, %s solver, kernel %s (%s)",
        n_train,
        r,
        solver,
        "materialised" if fit.materialize else "recomputed per pass",
        fit.reason,
    )
    result = KernelResult(
        materialized=fit.materialize, reason=fit.reason, solver=solver, block_rows=r
    )
    if fit.materialize:
        X_train = X_train.rechunk({0: r, 1: -1})
        scaler = scaler_of(split)
        if scaler is not None:  # the kernel of the scaled rows, as the solve fits them
            X_train = scaler.transform(X_train)
        X_train = X_train.persist()
        # gamma="scale": resolved once, on a sample of the persisted rows; the solve
        # fits with this number (KernelResult.gamma), the store is built with it
        plan = resolve_kernel(fit.plan, fit.estimator.get_params(), X_train)
        store = run_layout(cfg).kernel
        ks = build_kernel_store(
            X_train,
            # distance kernels on rows minus their mean: exact far from the origin
            centred_for_rows(plan.kernel, X_train),
            cfg.solver.dtype,
            store,
            input_fingerprint=_kernel_input(ing.fingerprint, split),
            verify=cfg.kernel_store.verify,
        )
        built = {k: v for k, v in ks.to_dict().items() if k != "path"}
        result = replace(result, store=store, gamma=plan.gamma, **built)
    return result


def planned_fit(
    cfg: Any, ing: IngestResult, split: SplitResult, kernel: KernelResult
) -> tuple[da.Array, Fit]:
    """The solve's end of the hand-off: the training rows rechunked once into the kernel
    stage's blocks, and the fit planned with its solver, block rows and (when it built
    the store with ``gamma: scale``) the gamma it resolved, as an override."""
    overrides = {}
    if kernel.materialized and kernel.store is not None and cfg.kernel.gamma == "scale":
        overrides["gamma"] = float(kernel.gamma)  # the store was built with this gamma
    X_train = _training_rows(cfg, ing, split).rechunk({0: kernel.block_rows, 1: -1})
    n_train, d = (int(s) for s in X_train.shape)
    fit = plan_fit(cfg, n_train, d, overrides=overrides, block_rows=kernel.block_rows)
    if fit.solver != kernel.solver:
        raise InternalError(
            f"the solve planned the {fit.solver} solver, the kernel stage {kernel.solver}"
        )
    return X_train, fit


def _kernel_input(fingerprint: str, split: Any) -> str:
    """What a kernel store was built from: the input, the split and the scaling."""
    split_id = split["split_id"] if isinstance(split, dict) else split.split_id
    pre = scaler_id(split)
    return f"{fingerprint}:split={split_id}" + (f":scale={pre}" if pre else "")


def _fresh_kernel(cfg: Any, inputs: dict, res: dict) -> str | None:
    if not res.get("materialized"):
        return None  # nothing on disk: the solver evaluates blocks itself
    g = run_layout(cfg).kernel.open_group("r")
    ing, split = inputs["ing"], inputs["split"]
    expected = {
        "input_fingerprint": _kernel_input(ing["fingerprint"], split),
        "kernel": res["kernel"],
        "dtype": res["dtype"],
        "block_rows": res["block_rows"],
        "n": res["n"],
    }
    if not all(_same(g.attrs.get(k), v) for k, v in expected.items()):
        return "the kernel store belongs to another input or kernel"
    done = np.asarray(g["done"][...], dtype=np.uint64)
    upper = np.triu_indices(done.shape[0])
    if not np.all(done[upper] >> np.uint64(32)):
        return "the kernel store is missing blocks"
    return None


KERNEL = Stage(
    "kernel",
    stage_kernel,
    inputs=("ing", "split"),
    result="kernel",
    result_type=KernelResult,
    config=config_slice(*PLAN_FIELDS, "kernel_store"),
    fresh=_fresh_kernel,
    doc="plan the solve; materialise the upper kernel blocks when that pays",
)
