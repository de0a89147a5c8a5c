"""The export stage: checksums and the manifest, written last and atomically (the run
is then a result)."""

from __future__ import annotations

from typing import Any

from pipeline.data.ingest import IngestResult
from pipeline.output import MODEL, read_json, run_layout, write_manifest
from pipeline.runner.registry import Stage
from pipeline.runner.results import KernelResult, ProjectResult, SolveResult, SplitResult

from ..config import PipelineConfig
from .common import _same

__all__ = ["EXPORT", "stage_export"]


def stage_export(
    cfg: Any,
    ing: IngestResult,
    split: SplitResult,
    kernel: KernelResult,
    solved: SolveResult,
    projected: ProjectResult,
    evaluation: dict | None,
    denoised: dict | None,
    timings: dict[str, float],
) -> dict[str, Any]:
    """Checksums and the manifest, written last and atomically: the run is now a result.

    ``timings`` are this run's and not part of any cache key.
    """
    # the manifest records where the stores are, not how they were opened (as before)
    model = dict(solved.info)
    cost_model = model.pop("cost_model", None)  # its own manifest key (docs/scaling.md)
    denoised = (
        {k: v for k, v in denoised.items() if k != "checksums"}
        if denoised and denoised.get("enabled")
        else None
    )
    return write_manifest(
        run_layout(cfg).out,
        config=cfg.to_json_dict(),
        ingest=_without_options(ing.to_dict()),
        model={**model, "path": MODEL},
        timings=timings,
        arrays=tuple(denoised["arrays"]) if denoised else (),
        extra={
            "kernel_store": _without_options(kernel.to_dict()),
            "evaluation": _summary(evaluation) if evaluation else None,
            "denoise": denoised,
            "cost_model": cost_model,
        },
    )


def _without_options(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "storage_options"}


def _summary(evaluation: dict) -> dict:
    return {
        k: v
        for k, v in evaluation.items()
        if isinstance(v, (int, float, str, bool)) or v is None
    }


def _fresh_export(cfg: Any, inputs: dict, res: dict) -> str | None:
    m = run_layout(cfg).manifest
    if not m.exists():
        return "the manifest is not published"
    if not _same(read_json(m), res):
        return "the published manifest is another run's"
    return None


# The manifest records the whole config; run control stays out of its key (RUN_CONTROL).
EXPORT = Stage(
    "export",
    stage_export,
    inputs=("ing", "split", "kernel", "solved", "projected", "evaluation", "denoised"),
    result="manifest",
    config=tuple(PipelineConfig.model_fields),
    run_info=("timings",),
    publishes=("manifest.json",),
    fresh=_fresh_export,
    doc="checksums and the manifest, written last and atomically",
)
