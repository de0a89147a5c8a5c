"""The solve stage: fit on the training rows with the plan the kernel stage carried
(:func:`~pipeline.stages.kernel_stage.planned_fit`); the model goes to ``<out>/model``."""

from __future__ import annotations

from typing import Any

from pipeline.data.ingest import IngestResult
from pipeline.data.scaling import scaler_of
from pipeline.model.fitspec import FIT_FIELDS
from pipeline.model.kernel_store import KernelBlockReader
from pipeline.model.solve import solve
from pipeline.output import MODEL, run_layout
from pipeline.runner.registry import Stage, config_slice
from pipeline.runner.results import KernelResult, SolveResult, SplitResult
from pipeline.runtime import release_worker_memory

from .common import _same
from .kernel_stage import planned_fit

__all__ = ["MODEL_CHECKSUMS", "SOLVE", "stage_solve"]


def stage_solve(
    cfg: Any, ing: IngestResult, split: SplitResult, kernel: KernelResult
) -> SolveResult:
    """Fit on the training rows; the model goes to ``<out>/model``.

    The kernel matrix's row means and grand mean come out of the solver's first
    product (one more column of ones), so centring costs no pass of its own; they are
    saved with the model.
    """
    layout = run_layout(cfg)
    release_worker_memory()  # what the kernel build's buffers left on the workers' heaps
    reader = None
    if kernel.materialized and kernel.store is not None:
        # the store as the kernel stage wrote it (its storage options included)
        reader = KernelBlockReader(kernel.store.url, kernel.store.storage_options)
    # the kernel stage's plan: its solver, block rows (the partition of the store), gamma
    X_train, fit = planned_fit(cfg, ing, split, kernel)
    # the model records the table's column names (its transform then selects a DataFrame's
    # columns by name); NPY/zarr columns have none, and neither has an ingest result
    # written before the features block
    features = ing.features
    if features is not None and features.get("selection") == "positions":
        features = None
    _, info = solve(
        X_train,
        cfg,
        layout.model,
        fit=fit,
        block_reader=reader,
        features=features,
        scaler=scaler_of(split),
    )
    return SolveResult(model=layout.model, info=dict(info))


#: the key the flow adds to the solve's result (content of the saved model)
MODEL_CHECKSUMS = "model_checksums"


def _fingerprint_solve(cfg: Any, res: dict) -> dict:
    attrs = dict(run_layout(cfg).model.open_group("r").attrs)
    return {**res, MODEL_CHECKSUMS: attrs.get("checksums")}


def _fresh_solve(cfg: Any, inputs: dict, res: dict) -> str | None:
    attrs = dict(run_layout(cfg).model.open_group("r").attrs)
    if not _same(attrs.get("checksums"), res.get(MODEL_CHECKSUMS)):
        return "the saved model changed"
    return None


SOLVE = Stage(
    "solve",
    stage_solve,
    inputs=("ing", "split", "kernel"),
    result="solved",
    result_type=SolveResult,
    config=config_slice(*FIT_FIELDS),
    publishes=(MODEL,),
    fingerprint=_fingerprint_solve,
    fresh=_fresh_solve,
    doc="fit on the training rows; the model goes to <out>/model",
)
