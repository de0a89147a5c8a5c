"""The evaluate stage: a classifier on the embedding vs linear PCA, and the report
(labelled input only; the work is pipeline/evaluate/)."""

from __future__ import annotations

from typing import Any

from pipeline.data.ingest import IngestResult
from pipeline.output import REPORT, read_json, run_layout
from pipeline.runner.registry import Stage
from pipeline.runner.results import ProjectResult, SolveResult, SplitResult

from .common import _same, files_under

__all__ = ["EVALUATE", "stage_evaluate"]


def stage_evaluate(
    cfg: Any,
    ing: IngestResult,
    split: SplitResult,
    solved: SolveResult,
    projected: ProjectResult,
) -> dict[str, Any] | None:
    """Classifier on the embedding vs linear PCA, and the report (labelled input only).

    Reads the ingested rows, the model and the embedding from the run folder: ``ing``,
    ``solved`` and ``projected`` are inputs so that the cache key and the run graph see
    them.
    """
    if not split.held_out:
        return None
    from ..evaluate import evaluate_run

    # the run folder with its storage options (evaluate_run takes a Location)
    return evaluate_run(run_layout(cfg).out, cfg.evaluate)


def _fingerprint_evaluate(cfg: Any, res: dict | None) -> dict | None:
    if res is None or res.get("status") == "skipped":
        return res
    # for the freshness check; the manifest keeps only the scalar metrics, not this
    return {**res, "report_files": files_under(run_layout(cfg), REPORT)}


def _fresh_evaluate(cfg: Any, inputs: dict, res: dict | None) -> str | None:
    if res is None or res.get("status") == "skipped":
        return None  # nothing was written
    layout = run_layout(cfg)
    metrics = {k: v for k, v in res.items() if k != "report_files"}
    if not layout.metrics.exists() or not _same(read_json(layout.metrics), metrics):
        return "report/metrics.json changed"
    if files_under(layout, REPORT) != res.get("report_files", {}):
        return "the report changed"
    return None


EVALUATE = Stage(
    "evaluate",
    stage_evaluate,
    inputs=("ing", "split", "solved", "projected"),
    result="evaluation",
    config=("evaluate",),
    publishes=(REPORT,),
    fingerprint=_fingerprint_evaluate,
    fresh=_fresh_evaluate,
    doc="classifier on the embedding vs linear PCA, and the report",
)
