"""Cache keys for the pipeline's Prefect tasks, and the check that a cache hit is still true.

Prefect's default cache policy includes the flow run id, so nothing is reused
across runs, and hashing task inputs sees object identity rather than data. A
stage's key is instead built from what determines its output:

* the stage name, a cache schema number, the kpca-dask version and a hash of the
  code that computes results: every source file of ``kpca_dask`` and ``pipeline``,
  plus the stage function's own source (new code, new key: an upgrade that changes
  results is never served from the old cache);
* the config slice the stage receives (its declaration in pipeline/stages/, the
  only config it can read; the export stage writes the config into the manifest, so
  it receives all of it), minus run control such as ``output.overwrite`` and
  ``cluster`` (:data:`pipeline.stages.RUN_CONTROL`);
* the *identity* of each upstream result: the small JSON descriptor the
  upstream task returned, minus run statistics such as ``seconds``, ``reused``
  or ``computed`` (:data:`VOLATILE`). Descriptors carry content fingerprints
  (ingest fingerprint, split id, model and array checksums), so a stage that
  re-runs and produces the same content leaves its dependants cached;
* for ingest, the state of the source files (names, sizes, modification times
  or ETags), since its input is outside the run.

Changing ``kernel.gamma`` therefore changes the keys of kernel, solve and export
(and, through the new model's checksums, project, denoise and evaluate), but not
those of ingest and split.

A key says what a stage *would* produce; the stores on disk may have changed
since (deleted, half rewritten by a killed run, or overwritten by a run with
another config at the same output path). Before Prefect looks the key up,
:func:`stage_cache_key` reads the cached record and checks it against the
stores (each stage's ``fresh`` check in the registry: completion markers, content
fingerprints, checksums, the published manifest). A record that no longer describes
what is on disk is expired in place, so the stage runs again and its fresh record replaces the
stale one under the same key: a cache hit never points at missing or foreign
artifacts.

Results are persisted as plain JSON (no pickle, no class hooks) next to the
artifacts, in ``<out>/work/flow-cache/``: deleting a run's folder deletes its
cache, and a run whose output is on an object store keeps its cache there too.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import json
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import kpca_dask
import pipeline
from pipeline.config import InputConfig, PipelineConfig
from pipeline.data.ingest_store import file_stats
from pipeline.output import Location, json_default, run_layout
from pipeline.stages import RUN_CONTROL, VOLATILE, Stage, identity

__all__ = [
    "CACHE_SCHEMA",
    "CODE_PACKAGES",
    "RUN_CONTROL",
    "VOLATILE",
    "code_version",
    "encode_result_object",
    "identity",
    "jsonable",
    "result_serializer",
    "result_storage",
    "source_hash",
    "source_state",
    "stage_cache_key",
    "stage_key",
    "with_result_storage",
]

logger = logging.getLogger("flows")

#: Bump when the meaning of a cached descriptor changes.
CACHE_SCHEMA = 2

#: Packages whose code computes the artifacts: a change to any file is a new key.
CODE_PACKAGES = (kpca_dask, pipeline)


# ------------------------------------------------------------------ key parts
def jsonable(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (tuples become lists, numpy scalars floats).

    Tasks return this form, so a result computed now and the same result read
    back from the cache give identical keys downstream.
    """
    return json.loads(json.dumps(obj, default=json_default))


def source_state(inp: InputConfig) -> list[list[Any]]:
    """Names, sizes and modification times (or ETags) of the input's files.

    The same facts the ingest stage compares to decide whether its store is
    still current; reading them costs a listing, not a pass over the data.
    """
    loc = Location(inp.path, inp.storage_options)
    try:
        fs, path = loc.fs, loc.fs_path
        files = fs.find(path, detail=True) if fs.isdir(path) else {path: fs.info(path)}
    except (OSError, ImportError, ValueError) as exc:  # missing input: ingest will say so
        return [["unavailable", inp.path, type(exc).__name__]]
    return file_stats(files)


def source_hash(roots: dict[str, Path]) -> str:
    """SHA-256 over every ``*.py`` file under each named root (name/relative path + bytes)."""
    h = hashlib.sha256()
    for name, root in sorted(roots.items()):
        for f in sorted(root.rglob("*.py")):
            h.update(f"{name}/{f.relative_to(root).as_posix()}\0".encode())
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


@functools.cache
def _package_code() -> str:
    """:func:`source_hash` of :data:`CODE_PACKAGES`, once per process."""
    return source_hash({pkg.__name__: Path(pkg.__file__).parent for pkg in CODE_PACKAGES})


def code_version(stage: Stage) -> str:
    """The package version, the packages' code hash and the stage function's source."""
    try:
        pkg = version("kpca-dask")
    except PackageNotFoundError:  # running from a source tree that is not installed
        pkg = "unknown"
    try:
        src = inspect.getsource(stage.run)
    except (OSError, TypeError):
        src = f"{stage.run.__module__}.{stage.run.__qualname__}"
    fn = hashlib.sha256(src.encode()).hexdigest()[:16]
    return f"{pkg}:{_package_code()[:16]}:{fn}"


def stage_key(stage: Stage, inputs: dict[str, Any]) -> str:
    """The cache key of ``stage`` called with ``inputs`` (its task's parameters)."""
    cfg: PipelineConfig = inputs["cfg"]
    payload: dict[str, Any] = {
        "schema": CACHE_SCHEMA,
        "stage": stage.name,
        "code": code_version(stage),
        "config": stage.key_config(cfg),
        "upstream": {name: identity(jsonable(inputs[name])) for name in sorted(stage.inputs)},
    }
    if stage.reads_source:  # its input is outside the run: the source files' state
        payload["source"] = source_state(cfg.input)
    digest = hashlib.sha256(
        json.dumps(payload, sort_keys=True, default=json_default).encode()
    ).hexdigest()
    return f"kpca-{stage.name}-{digest[:40]}"


# --------------------------------------------------- is a cached result still true?
def stage_cache_key(stage: Stage) -> Callable[[Any, dict[str, Any]], str]:
    """A Prefect ``cache_key_fn`` for ``stage`` that also expires stale records."""

    def cache_key(ctx: Any, inputs: dict[str, Any]) -> str:
        key = stage_key(stage, inputs)
        store = getattr(ctx, "result_store", None)
        if store is not None and store.exists(key):
            record = store.read(key)
            why = stage.stale_reason(inputs["cfg"], inputs, record.result)
            if why is not None:
                _log(ctx).info(
                    "cached %s result is stale (%s): running the stage again", stage.name, why
                )
                # An expired record reads as absent, so the task runs and its new
                # record replaces this one under the same key.
                store.write(
                    obj=record.result,
                    key=key,
                    expiration=datetime.datetime.now(datetime.UTC)
                    - datetime.timedelta(seconds=1),
                )
        return key

    cache_key.__name__ = f"{stage.name}_cache_key"
    cache_key.__qualname__ = cache_key.__name__
    return cache_key


def _log(ctx: Any) -> Any:
    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - no run context: the module logger
        return logger


# ------------------------------------------------------------- result persistence
def result_storage(cfg: PipelineConfig) -> Any:
    """Where task results are persisted: ``<out>/work/flow-cache``.

    A local path for a local output; for any other fsspec URL (``s3://``, ``gs://``,
    ``az://``, ...) an *unsaved* ``RemoteFileSystem`` block on that URL with the
    output's own storage options (endpoint, region: never credentials, which the
    config refuses; fsspec finds them in the environment or the cloud identity of
    the process that runs the flow). Attach it with :func:`with_result_storage`.
    """
    loc = run_layout(cfg).flow_cache
    if loc.is_local:
        return loc.local_path
    from prefect.filesystems import RemoteFileSystem

    return RemoteFileSystem(basepath=loc.url, settings=dict(loc.storage_options))


def with_result_storage(task: Any, storage: Any) -> Any:
    """A copy of ``task`` that persists its results (and cache records) in ``storage``.

    Prefect's ``Task(result_storage=...)`` accepts a path or a block saved on the
    Prefect server, and raises ``TypeError: Result storage configuration must be
    persisted server-side`` for an unsaved block such as the ``RemoteFileSystem``
    of an ``s3://`` output. The server copy exists so that a result referenced from
    the API can be read back by another process; ours never are: every read is a
    cache lookup by key in the flow's own process, which holds the storage (the
    same as Prefect's unsaved local storage, a plain path). So the storage is set
    on the copy after construction, where Prefect's result store resolves any
    ``WritableFileSystem`` block, saved or not. Nothing about the output is written
    to the Prefect server (no block per output); the records are plain JSON under
    ``<out>/work/flow-cache/``, readable by the next run from any machine that can
    read the output.
    """
    if isinstance(storage, (str, type(None))) or hasattr(storage, "__fspath__"):
        return task.with_options(result_storage=storage)
    bound = task.with_options()
    bound.result_storage = storage
    return bound


def encode_result_object(o: Any) -> Any:
    """``default`` of the results' JSON encoder.

    Besides numpy scalars and paths, Prefect also persists a failed task's
    exception with the task's serializer: it is stored as a plain description
    (type name and message), never pickled and never re-instantiated on read.
    """
    if isinstance(o, BaseException):
        return {"error": f"{type(o).__module__}.{type(o).__qualname__}", "message": str(o)}
    return json_default(o)


def result_serializer() -> Any:
    """Plain JSON: no pickle, and no object hook that could build classes on read."""
    from prefect.serializers import JSONSerializer

    return JSONSerializer(
        object_encoder=f"{__name__}.encode_result_object", object_decoder=None
    )
