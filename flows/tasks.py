"""Prefect tasks: one per registered pipeline stage (pipeline/stages/), each a thin
driver of the stage's function.

A task runs in the flow's process and submits its Dask graphs to the cluster
the flow connected to (the default ``distributed`` client), so the heavy
parallelism lives in Dask, not in Prefect. Tasks pass small JSON descriptors
(paths, counts, fingerprints, checksums), never arrays.

Every stage task (:func:`stage_task`, built from the stage's declaration):

* is cached on its inputs' content and the config slice it receives
  (:mod:`flows.caching`), with results persisted as plain JSON; the stage's
  ``fingerprint`` adds content checksums to its result for that;
* retries only transient failures (:func:`is_transient`: I/O and network
  errors, lost Dask workers), never invalid input or configuration;
* withdraws the manifest of the version being written before it writes an artifact
  there (:func:`claim_output`; stages that declare ``publishes``), while a re-run that
  only rebuilds intermediate stores under ``work/`` with the same content (ingest of
  a touched but unchanged file, a deleted kernel store) or is fully cached publishes
  nothing new and leaves the published run in place.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.config import ChunkConfig, InputConfig, PipelineConfig
from pipeline.embed.transform import transform_to_store
from pipeline.errors import is_transient
from pipeline.output import begin_run, run_layout
from pipeline.stages import Stage

from .caching import jsonable, result_serializer, stage_cache_key

__all__ = [
    "RETRY_OPTIONS",
    "claim_output",
    "is_transient",
    "retry_transient",
    "stage_task",
    "transform",
]


# ------------------------------------------------------------------- retries
# is_transient (pipeline/errors.py) is the taxonomy the CLI's exit codes use too: I/O and
# network errors and lost Dask workers are retried; user errors and bugs fail at once.


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a failed run only for a transient error."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - we classify, not handle
        # a worker that stopped answering would be waited for again: not retried
        return is_transient(exc) and getattr(exc, "retry", True)
    return False


#: Retry policy of every stage task (tests override the delays).
RETRY_OPTIONS: dict[str, Any] = {
    "retries": 2,
    "retry_delay_seconds": [10, 60],
    "retry_jitter_factor": 0.2,
    "retry_condition_fn": retry_transient,
}


# ---------------------------------------------------------------- publishing
def claim_output(cfg: PipelineConfig) -> None:
    """Withdraw the manifest of the version being written (a copy of the published
    run's, pipeline/output/versions.py) before a stage writes one of its artifacts there.

    The flow checked ``output.overwrite`` before any task ran (``stage_begin``
    semantics); a task only gets here when it is about to write, so a re-run
    whose every stage is cached publishes nothing new. The published version itself
    is never touched: only the run's transaction publishes, by replacing the pointer.
    """
    layout = run_layout(cfg)
    if layout.version is None and layout.out != layout.root:
        return  # not under the run's transaction: a published version is never written
    if layout.manifest.exists():
        begin_run(layout.out, overwrite=True)


# -------------------------------------------------------------------- stages
@functools.cache
def stage_task(stage: Stage) -> Any:
    """The Prefect task of ``stage``: parameters ``cfg`` and the stage's inputs and run
    facts by name (the cache key reads them), named after the stage."""

    def body(cfg: PipelineConfig, **inputs: Any) -> Any:
        if stage.publishes:
            claim_output(cfg)
        return jsonable(stage.with_fingerprint(cfg, stage(cfg, **inputs)))

    params = [
        inspect.Parameter(
            "cfg", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=PipelineConfig
        )
    ]
    params += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Any)
        for name in stage.inputs + stage.run_info
    ]
    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    body.__name__ = body.__qualname__ = f"{stage.name}_stage"
    body.__doc__ = stage.doc or stage.run.__doc__
    return task(
        body,
        name=stage.name,
        cache_key_fn=stage_cache_key(stage),
        persist_result=True,
        result_serializer=result_serializer(),
        **RETRY_OPTIONS,
    )


# ----------------------------------------------------------------- transform
@task(name="transform", cache_policy=NO_CACHE, persist_result=False, **RETRY_OPTIONS)
def transform(
    model: str,
    input: InputConfig,
    output: str,
    chunks: ChunkConfig | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Embed a batch with a saved model (streaming); ``storage_options`` are the model's
    and the output's fsspec options.

    Not cached and its result not persisted (the output store is the result): the task
    writes nothing outside ``output``, whatever the Prefect server's default result
    storage, so a transform to ``s3://`` needs no result storage at all.

    The output is written as a new version and published only when complete (one atomic
    write of its pointer), so a failed attempt publishes nothing and a retry starts
    clean.
    """
    return jsonable(
        transform_to_store(
            model,
            input,
            output,
            chunks=chunks,
            overwrite=overwrite,
            storage_options=storage_options,
        )
    )
