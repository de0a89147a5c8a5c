"""Cache keys for the pipeline's Prefect tasks, and the check that a cache hit is still true.

Prefect's default cache policy includes the flow run id, so nothing is reused
across runs, and hashing task inputs sees object identity rather than data. A
stage's key is instead built from what determines its output:

* the stage name, a cache schema number, the kpca-dask version and the source
  of the pipeline stage function (new code, new key);
* the config fields that stage reads (:data:`CONFIG_FIELDS`; the export stage
  writes the config into the manifest, so it reads all of it except run control
  such as ``output.overwrite`` and ``cluster``, :data:`RUN_CONTROL`);
* the *identity* of each upstream result: the small JSON descriptor the
  upstream task returned, minus run statistics such as ``seconds``, ``reused``
  or ``computed`` (:data:`VOLATILE`). Descriptors carry content fingerprints
  (ingest fingerprint, split id, model and array checksums), so a stage that
  re-runs and produces the same content leaves its dependants cached;
* for ingest, the state of the source files (names, sizes, modification times
  or ETags), since its input is outside the run.

Changing ``kernel.gamma`` therefore changes the keys of kernel, centre, solve,
project, evaluate and export, but not those of ingest and split.

A key says what a stage *would* produce; the stores on disk may have changed
since (deleted, half rewritten by a killed run, or overwritten by a run with
another config at the same output path). Before Prefect looks the key up,
:func:`stage_cache_key` reads the cached record and checks it against the
stores (:data:`CHECKS`: completion markers, content fingerprints, checksums,
the published manifest). A record that no longer describes what is on disk is
expired in place, so the stage runs again and its fresh record replaces the
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
from typing import Any

import numpy as np

from pipeline import denoise as denoise_stage
from pipeline import run as stages
from pipeline.config import InputConfig, PipelineConfig
from pipeline.export import file_checksums
from pipeline.store import Location, array_checksum, json_default, read_json

__all__ = ["CACHE_SCHEMA", "CONFIG_FIELDS", "RUN_CONTROL", "VOLATILE", "CHECKS", "jsonable",
           "identity", "config_slice", "source_state", "stage_key", "stage_cache_key",
           "stale_reason",
           "result_storage", "result_serializer", "encode_result_object", "checksums",
           "files_under"]

logger = logging.getLogger("flows")

#: Bump when the meaning of a cached descriptor changes.
CACHE_SCHEMA = 1

#: Run statistics in stage descriptors: they differ between two runs that
#: produce identical stores, so they never enter a dependant's key.
VOLATILE = frozenset({"seconds", "fit_seconds", "reused", "computed", "skipped",
                      "bytes_written", "timings"})

_KERNEL_FIELDS = ("kernel", "solver.n_components", "solver.eigen_solver", "solver.dtype",
                  "solver.n_oversamples", "solver.random_state", "solver.n_landmarks",
                  "solver.landmark_method", "chunks.block_rows", "kernel_store")

#: Denoise fields the solve stage fits the pre-image map with (pipeline.denoise.estimator_params).
_PREIMAGE_FIELDS = ("denoise.enabled", "denoise.alpha", "denoise.preimage", "denoise.sample_size")

#: Config fields each stage reads (dotted paths into the validated config).
#: ``output.path`` is in every key because descriptors hold paths under it.
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "ingest": ("input", "chunks.target_chunk_mb", "output.path"),
    "split": ("evaluate.enabled", "evaluate.test_fraction", "evaluate.random_state",
              "evaluate.stratify", "output.path"),
    "kernel": _KERNEL_FIELDS + ("output.path",),
    "centre": _KERNEL_FIELDS + ("output.path",),
    "solve": ("kernel", "solver", "chunks.block_rows", "kernel_store", "output.path")
    + _PREIMAGE_FIELDS,
    "project": ("output.path", "output.parquet"),
    "denoise": ("denoise", "output.path"),
    "evaluate": ("evaluate", "output.path"),
    # The manifest records the whole config, except run control that does not
    # change any result (RUN_CONTROL): `kpca run --overwrite` or another cluster
    # address must not re-publish an unchanged run.
    "export": ("input", "kernel", "solver", "chunks", "kernel_store", "output.path",
               "output.parquet", "evaluate", "denoise"),
}

#: Config fields that steer a run but never change its artifacts.
RUN_CONTROL = ("output.overwrite", "cluster")

#: The pipeline function behind each task (its source is part of the key).
STAGE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "ingest": stages.stage_ingest, "split": stages.stage_split, "kernel": stages.stage_kernel,
    "centre": stages.stage_centre, "solve": stages.stage_solve,
    "project": stages.stage_project, "denoise": stages.stage_denoise,
    "evaluate": stages.stage_evaluate, "export": stages.stage_export,
}


# ------------------------------------------------------------------ key parts
def jsonable(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (tuples become lists, numpy scalars floats).

    Tasks return this form, so a result computed now and the same result read
    back from the cache give identical keys downstream.
    """
    return json.loads(json.dumps(obj, default=json_default))


def identity(result: Any) -> Any:
    """A stage descriptor without its run statistics (:data:`VOLATILE`)."""
    if isinstance(result, dict):
        return {k: identity(v) for k, v in result.items() if k not in VOLATILE}
    if isinstance(result, (list, tuple)):
        return [identity(v) for v in result]
    return result


def config_slice(cfg: PipelineConfig, fields: tuple[str, ...]) -> dict[str, Any]:
    """The named config fields (dotted paths; ``""`` is the whole config)."""
    data = cfg.to_json_dict()
    out: dict[str, Any] = {}
    for path in fields:
        node: Any = data
        for part in filter(None, path.split(".")):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(f"config has no field {path!r}")
            node = node[part]
        out[path] = node
    return out


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
    return sorted([str(k), v.get("size"), str(v.get("mtime") or v.get("LastModified")
                                              or v.get("ETag") or v.get("created") or "")]
                  for k, v in files.items())


@functools.cache
def _code_version(stage: str) -> str:
    try:
        pkg = version("kpca-dask")
    except PackageNotFoundError:  # running from a source tree that is not installed
        pkg = "unknown"
    try:
        src = inspect.getsource(STAGE_FUNCTIONS[stage])
    except (OSError, TypeError):
        src = STAGE_FUNCTIONS[stage].__qualname__
    return f"{pkg}:{hashlib.sha256(src.encode()).hexdigest()[:16]}"


def stage_key(stage: str, inputs: dict[str, Any]) -> str:
    """The cache key of ``stage`` called with ``inputs`` (its task's parameters)."""
    cfg: PipelineConfig = inputs["cfg"]
    payload: dict[str, Any] = {
        "schema": CACHE_SCHEMA,
        "stage": stage,
        "code": _code_version(stage),
        "config": config_slice(cfg, CONFIG_FIELDS[stage]),
        "upstream": {name: identity(jsonable(value)) for name, value in sorted(inputs.items())
                     if name not in ("cfg", "timings")},
    }
    if stage == "ingest":
        payload["source"] = source_state(cfg.input)
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=json_default)
                            .encode()).hexdigest()
    return f"kpca-{stage}-{digest[:40]}"


# --------------------------------------------------- is a cached result still true?
def _same(a: Any, b: Any) -> bool:
    """Equal as JSON (so NaN equals NaN, and tuples equal lists)."""
    return (json.dumps(a, sort_keys=True, default=json_default)
            == json.dumps(b, sort_keys=True, default=json_default))


def checksums(group: Any, names: tuple[str, ...]) -> dict[str, str]:
    """``array_checksum`` of each named array present in a zarr group."""
    return {name: array_checksum(group[name]) for name in names if name in group}


def files_under(cfg: PipelineConfig, folder: str) -> dict[str, str]:
    """SHA-256 of the run's files under ``folder`` (as the manifest records them)."""
    sums = file_checksums(stages.stage_locations(cfg)["out"])
    return {k: v for k, v in sums.items() if k == folder or k.startswith(folder + "/")}


def _check_ingest(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    from pipeline.ingest import stale_ingest

    store = stages.stage_locations(cfg)["ingest"]
    attrs = dict(store.open_group("r").attrs)
    if attrs.get("status") != "complete":
        return "the ingest store is incomplete"
    if (attrs.get("result") or {}).get("fingerprint") != res["fingerprint"]:
        return "the ingest store holds other data"
    if res.get("path") != str(store):
        return "the ingest result names another store (a copied run folder?)"
    # the source's content (not only its file metadata, which the cache key holds) and
    # every chunk of the store, as the ingest stage checks before reusing it
    return stale_ingest(cfg.input, cfg.chunks, store)


_SPLIT_ARRAYS = ("split", "labels", "ids")


def _check_split(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    g = stages.stage_locations(cfg)["out"].open_group("r")
    if checksums(g, _SPLIT_ARRAYS) != res.get("checksums"):
        return "labels/ids/split next to the embedding changed"
    return None


def _check_kernel(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    if not res.get("materialized"):
        return None  # nothing on disk: the solver evaluates blocks itself
    g = stages.stage_locations(cfg)["kernel"].open_group("r")
    ing, split = inputs["ing"], inputs["split"]
    expected = {"input_fingerprint": f"{ing['fingerprint']}:split={split['split_id']}",
                "kernel": res["kernel"], "dtype": res["dtype"],
                "block_rows": res["block_rows"], "n": res["n"]}
    if not all(_same(g.attrs.get(k), v) for k, v in expected.items()):
        return "the kernel store belongs to another input or kernel"
    done = np.asarray(g["done"][...], dtype=np.uint64)
    upper = np.triu_indices(done.shape[0])
    if not np.all(done[upper] >> np.uint64(32)):
        return "the kernel store is missing blocks"
    return None


def _check_centre(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    # Nothing of its own on disk: the statistics come out of the solve's first
    # pass and are written (and checked) with the model.
    return None


def _check_solve(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    attrs = dict(stages.stage_locations(cfg)["model"].open_group("r").attrs)
    if not _same(attrs.get("checksums"), res.get("model_checksums")):
        return "the saved model changed"
    return None


_PROJECT_ARRAYS = ("embedding", "spectrum/eigenvalues", "spectrum/explained_variance_ratio",
                   "spectrum/residuals")


def _check_project(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    g = stages.stage_locations(cfg)["out"].open_group("r")
    if checksums(g, _PROJECT_ARRAYS) != res.get("checksums"):
        return "the embedding or spectrum changed"
    if files_under(cfg, "embedding.parquet") != res.get("files", {}):
        return "the Parquet embedding changed"
    return None


def _check_denoise(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    g = stages.stage_locations(cfg)["out"].open_group("r")
    written = [a for a in g.attrs.get(denoise_stage.WRITTEN_ATTR, []) if a in g]
    if written != list(res.get("arrays", [])):
        return "another run's denoised rows are in the run folder"
    if res.get("enabled") and checksums(g, tuple(written)) != res.get("checksums"):
        return "the denoised rows changed"
    return None


def _check_evaluate(cfg: PipelineConfig, inputs: dict, res: dict | None) -> str | None:
    if res is None or res.get("status") == "skipped":
        return None  # nothing was written
    m = stages.stage_locations(cfg)["out"].child("report", "metrics.json")
    metrics = {k: v for k, v in res.items() if k != "report_files"}
    if not m.exists() or not _same(read_json(m), metrics):
        return "report/metrics.json changed"
    if files_under(cfg, "report") != res.get("report_files", {}):
        return "the report changed"
    return None


def _check_export(cfg: PipelineConfig, inputs: dict, res: dict) -> str | None:
    m = stages.stage_locations(cfg)["out"].child("manifest.json")
    if not m.exists():
        return "the manifest is not published"
    if not _same(read_json(m), res):
        return "the published manifest is another run's"
    return None


#: stage -> check(cfg, inputs, cached result) -> None if still true, else why not.
CHECKS: dict[str, Callable[[PipelineConfig, dict, Any], str | None]] = {
    "ingest": _check_ingest, "split": _check_split, "kernel": _check_kernel,
    "centre": _check_centre, "solve": _check_solve, "project": _check_project,
    "denoise": _check_denoise, "evaluate": _check_evaluate, "export": _check_export,
}


def stale_reason(stage: str, cfg: PipelineConfig, inputs: dict, result: Any) -> str | None:
    """Why a cached ``result`` no longer describes the stores (None: it still does)."""
    try:
        return CHECKS[stage](cfg, inputs, result)
    except Exception as exc:  # unreadable or missing store
        return f"its stores cannot be read ({type(exc).__name__}: {exc})"


def stage_cache_key(stage: str) -> Callable[[Any, dict[str, Any]], str]:
    """A Prefect ``cache_key_fn`` for ``stage`` that also expires stale records."""

    def cache_key(ctx: Any, inputs: dict[str, Any]) -> str:
        key = stage_key(stage, inputs)
        store = getattr(ctx, "result_store", None)
        if store is not None and store.exists(key):
            record = store.read(key)
            why = stale_reason(stage, inputs["cfg"], inputs, record.result)
            if why is not None:
                _log(ctx).info("cached %s result is stale (%s): running the stage again",
                               stage, why)
                # An expired record reads as absent, so the task runs and its new
                # record replaces this one under the same key.
                store.write(obj=record.result, key=key,
                            expiration=datetime.datetime.now(datetime.timezone.utc)
                            - datetime.timedelta(seconds=1))
        return key

    cache_key.__name__ = f"{stage}_cache_key"
    cache_key.__qualname__ = cache_key.__name__
    return cache_key


def _log(ctx: Any) -> Any:
    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:
        return logger


# ------------------------------------------------------------- result persistence
def result_storage(cfg: PipelineConfig) -> Any:
    """Where task results are persisted: ``<out>/work/flow-cache`` (local or fsspec URL)."""
    loc = stages.stage_locations(cfg)["work"].child("flow-cache")
    if loc.is_local:
        return loc.local_path
    from prefect.filesystems import RemoteFileSystem

    return RemoteFileSystem(basepath=loc.url, settings=dict(loc.storage_options))


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

    return JSONSerializer(object_encoder=f"{__name__}.encode_result_object",
                          object_decoder=None)
