"""Prefect tasks: one per pipeline stage, each a thin driver of a ``pipeline.run`` function.

A task runs in the flow's process and submits its Dask graphs to the cluster
the flow connected to (the default ``distributed`` client), so the heavy
parallelism lives in Dask, not in Prefect. Tasks pass small JSON descriptors
(paths, counts, fingerprints, checksums), never arrays.

Every stage task:

* is cached on its inputs' content and the config fields it reads
  (:mod:`flows.caching`), with results persisted as plain JSON;
* retries only transient failures (:func:`is_transient`: I/O and network
  errors, lost Dask workers), never invalid input or configuration;
* un-publishes the run's manifest before it writes a published artifact
  (:func:`claim_output`; split, solve, project, denoise, evaluate, export), so a reader
  never trusts a folder being rewritten, while a re-run that only rebuilds
  intermediate stores under ``work/`` with the same content (ingest of a
  touched but unchanged file, a deleted kernel store) or is fully cached
  leaves the published run in place.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline import run as stages
from pipeline.config import ChunkConfig, InputConfig, PipelineConfig
from pipeline.export import begin_run
from pipeline.transform import transform_to_store

from .caching import (_PROJECT_ARRAYS, _SPLIT_ARRAYS, checksums, files_under,
                      jsonable, result_serializer, stage_cache_key)

__all__ = ["is_transient", "retry_transient", "RETRY_OPTIONS", "claim_output", "ingest",
           "split", "kernel", "centre", "solve", "project", "denoise", "evaluate", "export",
           "transform",
           "STAGE_TASKS", "FLOW_ONLY_KEYS"]


# ------------------------------------------------------------------- retries
def _not_transient() -> tuple[type[BaseException], ...]:
    from kpca_dask.exceptions import KpcaError
    from pipeline.cluster import ClusterError
    from pipeline.kernel import KernelStoreError

    # ValueError covers ConfigError, InputError, RunError and pydantic's
    # ValidationError; the OSError subclasses listed here are user errors.
    return (ValueError, TypeError, KeyError, KpcaError, KernelStoreError, ClusterError,
            MemoryError, FileNotFoundError, FileExistsError, PermissionError,
            IsADirectoryError, NotADirectoryError)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: I/O and network errors, timeouts, lost Dask workers.

    Invalid input, parameters or artifacts fail at once, whatever else they
    subclass (``RunExistsError`` is also a ``FileExistsError``).
    """
    if isinstance(exc, _not_transient()):
        return False
    if isinstance(exc, OSError):  # ConnectionError, TimeoutError, distributed CommClosedError
        return True
    try:
        from distributed.scheduler import KilledWorker
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, KilledWorker)


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a failed run only for a transient error."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - we classify, not handle
        return is_transient(exc)
    return False


#: Retry policy of every stage task (tests override the delays).
RETRY_OPTIONS: dict[str, Any] = {
    "retries": 2,
    "retry_delay_seconds": [10, 60],
    "retry_jitter_factor": 0.2,
    "retry_condition_fn": retry_transient,
}


def _stage_options(stage: str) -> dict[str, Any]:
    return {"name": stage, "cache_key_fn": stage_cache_key(stage), "persist_result": True,
            "result_serializer": result_serializer(), **RETRY_OPTIONS}


# ---------------------------------------------------------------- publishing
def claim_output(cfg: PipelineConfig) -> None:
    """Un-publish the run before a stage writes one of its published artifacts.

    The flow checked ``output.overwrite`` before any task ran (``stage_begin``
    semantics); a task only gets here when it is about to write, so a re-run
    whose every stage is cached keeps its published manifest.
    """
    out = stages.stage_locations(cfg)["out"]
    if out.child("manifest.json").exists():
        begin_run(out, overwrite=True)


#: Keys the tasks add to stage descriptors for cache checks; they are not
#: passed on to the manifest.
FLOW_ONLY_KEYS = frozenset({"model_checksums"})


# -------------------------------------------------------------------- stages
@task(**_stage_options("ingest"))
def ingest(cfg: PipelineConfig) -> dict[str, Any]:
    """Input -> ``work/ingest.zarr`` in row chunks, validated, with a content fingerprint."""
    return jsonable(stages.stage_ingest(cfg))


@task(**_stage_options("split"))
def split(cfg: PipelineConfig, ing: dict[str, Any]) -> dict[str, Any]:
    """Held-out rows (labelled input), and labels/ids/split next to the embedding."""
    claim_output(cfg)
    res = stages.stage_split(cfg, ing)
    res["checksums"] = checksums(stages.stage_locations(cfg)["out"].open_group("r"),
                                 _SPLIT_ARRAYS)
    return jsonable(res)


@task(**_stage_options("kernel"))
def kernel(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any]) -> dict[str, Any]:
    """Plan the exact path; materialise the upper kernel blocks when that pays (resumable)."""
    return jsonable(stages.stage_kernel(cfg, ing, split))


@task(**_stage_options("centre"))
def centre(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any],
           kernel: dict[str, Any]) -> dict[str, Any]:
    """Row means and grand mean of the kernel matrix: fused into the solve's first pass."""
    return jsonable(stages.stage_centre(cfg, ing, split, kernel))


@task(**_stage_options("solve"))
def solve(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any],
          kernel: dict[str, Any], centre: dict[str, Any]) -> dict[str, Any]:
    """Fit on the training rows; the model goes to ``<out>/model``."""
    claim_output(cfg)
    res = stages.stage_solve(cfg, ing, split, kernel, centre)
    attrs = dict(stages.stage_locations(cfg)["model"].open_group("r").attrs)
    res["model_checksums"] = attrs.get("checksums")
    return jsonable(res)


@task(**_stage_options("project"))
def project(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any],
            solved: dict[str, Any]) -> dict[str, Any]:
    """Embedding of every row (zarr, optional Parquet) and the spectrum."""
    claim_output(cfg)
    res = stages.stage_project(cfg, ing, split, solved)
    res["checksums"] = checksums(stages.stage_locations(cfg)["out"].open_group("r"),
                                 _PROJECT_ARRAYS)
    res["files"] = files_under(cfg, "embedding.parquet")
    return jsonable(res)


@task(**_stage_options("denoise"))
def denoise(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any],
            solved: dict[str, Any]) -> dict[str, Any]:
    """Pre-images of the embedding (``denoise.enabled``), written next to it."""
    claim_output(cfg)
    res = stages.stage_denoise(cfg, ing, split, solved)
    if res.get("enabled"):
        res["checksums"] = checksums(stages.stage_locations(cfg)["out"].open_group("r"),
                                     tuple(res["arrays"]))
    return jsonable(res)


@task(**_stage_options("evaluate"))
def evaluate(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any],
             solved: dict[str, Any], projected: dict[str, Any]) -> dict[str, Any] | None:
    """Classifier on the embedding vs linear PCA, and the report (labelled input only).

    The stage reads the ingested rows, the model and the embedding from the run
    folder: ``ing``, ``solved`` and ``projected`` are parameters so that the
    cache key and the run graph see them.
    """
    claim_output(cfg)
    res = stages.stage_evaluate(cfg, split)
    if res is not None and res.get("status") != "skipped":
        # for the cache check; the manifest keeps only the scalar metrics, not this
        res = {**res, "report_files": files_under(cfg, "report")}
    return jsonable(res)


@task(**_stage_options("export"))
def export(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any],
           kernel: dict[str, Any], solved: dict[str, Any], projected: dict[str, Any],
           evaluation: dict[str, Any] | None, timings: dict[str, float],
           denoised: dict[str, Any] | None = None) -> dict[str, Any]:
    """Checksums and the manifest, written last and atomically: the run is now a result.

    ``timings`` are this run's and are not part of the cache key.
    """
    claim_output(cfg)
    model = {k: v for k, v in solved.items() if k not in FLOW_ONLY_KEYS}
    if denoised:
        denoised = {k: v for k, v in denoised.items() if k != "checksums"}
    return jsonable(stages.stage_export(cfg, ing, kernel, model, timings, evaluation, denoised))


STAGE_TASKS = {"ingest": ingest, "split": split, "kernel": kernel, "centre": centre,
               "solve": solve, "project": project, "denoise": denoise, "evaluate": evaluate,
               "export": export}


# ----------------------------------------------------------------- transform
@task(name="transform", cache_policy=NO_CACHE, **RETRY_OPTIONS)
def transform(model: str, input: InputConfig, output: str,
              chunks: ChunkConfig | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Embed a batch with a saved model (streaming).

    The output is written beside its final name and swapped in only when complete, so a
    failed attempt leaves nothing behind and a retry starts clean.
    """
    return jsonable(transform_to_store(model, input, output, chunks=chunks,
                                       overwrite=overwrite))
