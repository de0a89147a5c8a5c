"""The ``kpca_update`` flow: a published run plus a batch of new rows -> a new run.

    ingest -> base -> drift -> update -> project -> export

Thin: the stages are pipeline/update/run.py's registry, one cached, retried task per stage
(:func:`flows.tasks.stage_task`), as the ``kpca_pipeline`` flow runs the full pipeline.
It holds the new run's lock, connects to the configured Dask cluster, verifies the
published run and records a markdown artifact with the drift report's verdict: which
action the policy chose and why. deploy/prefect.yaml schedules it nightly.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from pipeline.config import PipelineConfig, with_absolute_paths
from pipeline.errors import UserError
from pipeline.output import run_layout, verify_run
from pipeline.runner.run import run_lock, run_stages, stage_begin
from pipeline.runtime import check_visibility, dask_client
from pipeline.update import UPDATE_REGISTRY, run_update, update_config

from . import tasks
from .caching import result_storage, with_result_storage
from .pipeline_flow import FlowRunSummary
from .runtime import check_prefect_api, dashboard_line, forward_library_logs

__all__ = ["kpca_update", "kpca_update_from", "run_update_flow_or_plain"]


def _drift_markdown(manifest: dict[str, Any]) -> str:
    upd = manifest["update"]
    lines = [
        f"# kpca update v{upd['version']}",
        "",
        f"* base: `{upd['base']}`",
        f"* batch: {upd['batch_rows']} rows, {upd['n_rows']} rows in all",
        f"* action: **{upd['action']}** because {upd['reason']}",
        f"* drift checks flagged: {', '.join(upd['flagged']) or 'none'}",
        f"* report: `{upd['report']}`",
    ]
    return "\n".join(lines)


@flow(
    name="kpca-update",
    validate_parameters=True,
    persist_result=False,  # the summary goes back to the caller, never to result storage
    description="Add a batch of new rows to a published kernel PCA run: drift report, "
    "exact Nyström merge or refit, the union's embedding, a new verified run.",
)
def kpca_update(config: PipelineConfig) -> dict[str, Any]:
    """Run the update ``config`` describes (``update.base`` set: see update_config)."""
    from prefect.artifacts import create_markdown_artifact

    cfg = with_absolute_paths(config)  # relative paths: against this process's folder
    log = get_run_logger()
    t_run = time.perf_counter()
    storage = result_storage(cfg)
    states: dict[str, str] = {}
    timings: dict[str, float] = {}

    def call(stage, args: dict[str, Any]) -> Any:
        # any fsspec output: an unsaved remote storage, see flows/caching.py
        bound = with_result_storage(tasks.stage_task(stage), storage)
        state = bound(cfg, **args, return_state=True)
        states[stage.name] = state.name
        return state.result()

    out = run_layout(cfg).root
    with forward_library_logs(), run_lock(cfg) as txn, dask_client(cfg.cluster) as client:
        log.info(dashboard_line(client))
        check_visibility(cfg, client)  # the batch, base run, output and work, or refuse
        stage_begin(cfg)
        run_stages(UPDATE_REGISTRY, call, timings=timings, t_run=t_run)
        manifest = verify_run(run_layout(cfg).out)  # the version about to be published
    md = _drift_markdown(manifest)
    log.info(md.splitlines()[4].lstrip("* "))
    create_markdown_artifact(md, key="kpca-update", description="drift report and action")
    return {
        "out": str(out),
        "manifest": manifest,
        "states": states,
        "timings": timings,
        "version": txn.version,
    }


@flow(name="kpca-update-from", validate_parameters=True, persist_result=False)
def kpca_update_from(
    run: str,
    new_data: str,
    output: str | None = None,
    policy: str | None = None,
    storage_options: dict[str, Any] | None = None,
    input_storage_options: dict[str, Any] | None = None,
    logical_date: str | None = None,
) -> dict[str, Any]:
    """The deployment's entry point: parameters as on the command line (kpca update;
    storage options without credentials, which come from the pod's environment).

    One night of the series ``run`` (pipeline/series/night.py): every batch ``new_data``
    names that the series has not merged, oldest first, each a new version of ``run``
    (one ``kpca-update`` subflow each). ``new_data`` may be a template on the logical
    date, ``{date:%Y-%m-%d}``: the flow run's scheduled time unless ``logical_date`` is
    given. A night with nothing new publishes nothing and succeeds; a refused batch fails
    the run after the other batches are published, naming it."""
    from prefect.runtime import flow_run

    from pipeline.series.night import parse_logical_date, run_night

    log = get_run_logger()
    when = parse_logical_date(logical_date) or parse_logical_date(flow_run.scheduled_start_time)

    def make(base: str, batch: str, out: str | None) -> PipelineConfig:
        return update_config(
            base,
            batch,
            out,
            policy=policy,
            storage_options=storage_options,
            input_storage_options=input_storage_options,
        )

    night = run_night(
        run,
        new_data,
        make,
        kpca_update,
        output=output,
        storage_options=storage_options,
        input_storage_options=input_storage_options,
        logical_date=when,
    )
    for path, vid in night.skipped:
        log.info("the batch %s is already merged (version %s); nothing published", path, vid)
    if not (night.merged or night.skipped or night.refused):
        log.info("no batch in %s (logical date %s); nothing published", new_data, when)
    if night.refused:
        raise NightRefused(night.refused)
    last = night.summaries[-1] if night.summaries else {}
    return {
        **last,
        "logical_date": when.isoformat() if when else None,
        "merged": night.merged,
        "skipped": night.skipped,
    }


class NightRefused(UserError, RuntimeError):
    """A night whose batches were refused (the others published); one line each."""

    def __init__(self, refused: list[tuple[str, str]]):
        self.refused = refused
        super().__init__("; ".join(f"the batch {p} was refused: {line}" for p, line in refused))


def run_update_flow_or_plain(cfg: PipelineConfig, *, use_prefect: bool = True) -> Any:
    """The flow (default), or the plain stage sequence on the configured cluster."""
    if use_prefect:
        check_prefect_api()
        res = kpca_update(cfg)
        return FlowRunSummary(
            out=res["out"],
            manifest=res["manifest"],
            timings=res["timings"],
            states=res["states"],
            version=res.get("version"),
        )
    with dask_client(cfg.cluster):
        return run_update(cfg)
