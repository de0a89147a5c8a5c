"""The ``kpca_pipeline`` flow: the pipeline's stages as cached, retried Prefect tasks on Dask.

    ingest -> split -> kernel -> solve -> project -> denoise -> evaluate -> export

(the registered stages, pipeline/stages/: the flow walks the same registry as the
plain ``run_pipeline``, one task per stage).

The flow's one parameter is the validated :class:`~pipeline.config.PipelineConfig`
(the Prefect UI renders it as a form; deployments pass it as JSON). The flow
takes the output's run lock (one writer per output), connects to the Dask
scheduler the config names (``tcp://`` or ``tls://`` with the configured
certificates) or starts a local cluster on 127.0.0.1, logs the dashboard
link, and runs one task per stage in this process; each task submits
its Dask graphs to that cluster. At the end it verifies the published run
(manifest and checksums) and records Prefect artifacts: a markdown summary,
the spectrum as a table, links to the output and, for labelled input, the
evaluation.

An unchanged re-run is a no-op: every task is a cache hit (see
:mod:`flows.caching`), the published run is left as it is and only verified.
A changed parameter re-runs the stages that depend on it and no others.

``run_flow_or_plain`` is what ``kpca run`` and ``kpca demo`` call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, get_run_logger

from pipeline import stages
from pipeline.config import PipelineConfig, with_absolute_paths
from pipeline.output import run_layout, verify_run
from pipeline.runner.run import (
    RunSummary,
    run_lock,
    run_pipeline,
    run_stages,
    stage_begin,
    start_version,
)
from pipeline.runtime import check_visibility, dask_client

from . import tasks
from .artifacts import publish_run_artifacts
from .caching import result_storage, with_result_storage
from .runtime import announce_flow_run, check_prefect_api, dashboard_line, forward_library_logs

__all__ = ["FlowRunSummary", "begin", "kpca_pipeline", "run_flow", "run_flow_or_plain"]


def begin(cfg: PipelineConfig) -> str:
    """Refuse to clobber a complete run unless ``output.overwrite`` (``stage_begin``).

    With ``overwrite`` and a published run, un-publishing waits until a stage
    actually has to write (``tasks.claim_output``): a fully cached re-run must
    leave the published run in place.
    """
    if cfg.output.overwrite and run_layout(cfg).pointer.exists():
        start_version(cfg)  # a copy of the published run: cached stages keep their artifacts
        return "deferred"
    stage_begin(cfg)
    return "begun"


@flow(
    name="kpca-pipeline",
    validate_parameters=True,
    # the summary goes back to the caller in process; never to Prefect's default result
    # storage (a server-side default would otherwise persist it there, pickled)
    persist_result=False,
    description="Kernel PCA batch job: ingest, exact/Nyström fit, embedding, evaluation and "
    "a verified manifest, on a Dask cluster.",
)
def kpca_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Run every stage of the pipeline ``config`` describes; returns the run summary."""
    cfg = with_absolute_paths(config)  # relative paths: against this process's folder
    log = get_run_logger()
    announce_flow_run()  # the run's address in the Prefect UI, when a server records it
    t_run = time.perf_counter()
    registry = stages.REGISTRY
    out = run_layout(cfg).root
    storage = result_storage(cfg)
    states: dict[str, str] = {}
    timings: dict[str, float] = {}

    def call(stage: stages.Stage, args: dict[str, Any]) -> Any:
        bound = with_result_storage(tasks.stage_task(stage), storage)
        state = bound(cfg, **args, return_state=True)
        states[stage.name] = state.name
        return state.result()  # raises the stage's error when it failed

    # the output's run lock first: a second run to the same output is refused at once
    with forward_library_logs(), run_lock(cfg) as txn, dask_client(cfg.cluster) as client:
        cluster = dashboard_line(client)
        log.info(cluster)
        check_visibility(cfg, client)  # every worker sees the run's locations, or refuse
        t0 = time.perf_counter()
        how = begin(cfg)
        timings["begin"] = time.perf_counter() - t0
        log.info("output %s (%s); task results cached in %s", out, how, storage)
        results = run_stages(registry, call, timings=timings, t_run=t_run)
        # what a reader checks (complete, checksums match), on the version to publish
        manifest = verify_run(run_layout(cfg).out)
    ran = [s for s in registry.names if states[s] != "Cached"]
    log.info(
        "run verified at %s: %s",
        out,
        f"ran {', '.join(ran)}" if ran else "every stage cached, nothing recomputed",
    )
    artifacts = publish_run_artifacts(
        out, manifest, states, timings, results.get("evaluation"), cluster
    )
    return {
        "out": str(out),
        "manifest": manifest,
        "states": states,
        "timings": timings,
        "cluster": cluster,
        "artifacts": artifacts,
        "version": txn.version,
    }


@dataclass
class FlowRunSummary(RunSummary):
    """``RunSummary`` plus what Prefect recorded: task states per stage."""

    states: dict[str, str] = field(default_factory=dict)


def run_flow(cfg: PipelineConfig) -> FlowRunSummary:
    """Run ``kpca_pipeline`` against ``PREFECT_API_URL`` or an ephemeral local API."""
    check_prefect_api()
    res = kpca_pipeline(cfg)
    return FlowRunSummary(
        out=res["out"],
        manifest=res["manifest"],
        timings=res["timings"],
        states=res["states"],
        version=res.get("version"),
    )


def run_flow_or_plain(cfg: PipelineConfig, *, use_prefect: bool = True) -> RunSummary:
    """The flow (default), or the plain stage sequence on the configured cluster."""
    if use_prefect:
        return run_flow(cfg)
    with dask_client(cfg.cluster):
        return run_pipeline(cfg)
