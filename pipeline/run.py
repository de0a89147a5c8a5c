"""The job as stage functions, and ``run_pipeline`` calling them in order.

    ingest -> split -> kernel -> centre -> solve -> project -> evaluate -> export

Each ``stage_*`` function takes the validated config plus the small,
JSON-serialisable descriptors the earlier stages returned (paths, counts,
fingerprints -- never arrays), reads and writes stores, and is idempotent. The
Prefect flow (flows/) calls the same functions, one task each; this module's
``run_pipeline`` is the plain, unorchestrated sequence (and the reference the
flow is tested against).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np

from kpca_dask.plan import auto_block_rows

from .centre import save_centring
from .cluster import release_worker_memory
from .config import PipelineConfig
from .denoise import stage_denoise  # the denoise stage, with the others here
from .evaluate import make_split
from .export import RunError, begin_run, write_manifest, write_spectrum
from .ingest import IngestResult, SourceData, _check_exists, ingest, load_ingested
from .kernel import KernelBlockReader, build_kernel_store, plan_materialize
from .lock import RunLock, check_unlocked
from .project import write_embedding, write_parquet
from .publish import (check_not_overlapping, check_output_folder, restore_previous,
                      retire_previous)
from .solve import make_estimator, solve
from .store import Location

__all__ = ["RunSummary", "run_pipeline", "run_lock", "stage_locations", "evaluation_wanted",
           "stage_begin", "stage_ingest", "stage_split", "stage_kernel", "stage_centre",
           "stage_solve", "stage_project", "stage_denoise", "stage_evaluate",
           "stage_export"]

logger = logging.getLogger("pipeline")


@dataclass
class RunSummary:
    out: str
    manifest: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def stage_locations(cfg: PipelineConfig) -> dict[str, Location]:
    out = Location(cfg.output.path, cfg.input.storage_options if "://" in cfg.output.path else {})
    work = out.child("work")
    return {"out": out, "work": work, "ingest": work.child("ingest.zarr"),
            "kernel": work.child("kernel.zarr"), "centre": work.child("centre.zarr"),
            "model": out.child("model")}


def evaluation_wanted(cfg: PipelineConfig, ing: IngestResult) -> bool:
    enabled = cfg.evaluate.enabled
    if enabled == "auto":
        return ing.has_labels
    if enabled and not ing.has_labels:
        raise ValueError("evaluate.enabled is true but the input has no label column; set "
                         "input.label_column or evaluate.enabled: auto.")
    return bool(enabled)


# --------------------------------------------------------------------- helpers
def _ingested(ing: dict[str, Any]) -> tuple[IngestResult, SourceData]:
    res = IngestResult.from_dict(ing)
    return res, load_ingested(res)


def _read_split(cfg: PipelineConfig, split: dict[str, Any]) -> np.ndarray | None:
    if not split.get("held_out"):
        return None
    g = stage_locations(cfg)["out"].open_group("r")
    return np.asarray(g["split"][...])


def _training_rows(cfg: PipelineConfig, ing: dict, split: dict) -> tuple[da.Array, int]:
    """Training rows of the ingested X in blocks of the kernel partition."""
    _, src = _ingested(ing)
    mask = _read_split(cfg, split)
    X = src.X if mask is None else src.X[mask.astype(bool)]
    n = int(X.shape[0])
    r = auto_block_rows(n) if cfg.chunks.block_rows == "auto" else min(int(cfg.chunks.block_rows), n)
    return X.rechunk({0: r, 1: -1}), r


def _store_array(g, name: str, arr: da.Array, rows) -> None:
    if name in g:
        del g[name]
    arr = arr.rechunk({0: rows})
    dtype = str if arr.dtype.kind in "OUT" else arr.dtype
    z = g.create_array(name, shape=arr.shape, dtype=dtype, chunks=(rows[0],))
    da.store(arr, z, lock=False)


# ---------------------------------------------------------------------- stages
def check_output(cfg: PipelineConfig) -> None:
    """Refuse, before anything is written or un-published: an output folder holding files
    a run would replace that are not its own (or links), an output overlapping the input,
    and an input that does not exist."""
    raw = str(cfg.output.path).strip()
    bare = raw.removeprefix("file://").rstrip("/")
    if raw.rstrip("/") in ("", ".", "..") or bare in ("", ".", ".."):
        raise RunError(f"output.path {cfg.output.path!r} names no folder of its own (empty or "
                       "'.'); set output.path to a new folder, e.g. kpca-output.")
    out = stage_locations(cfg)["out"]
    check_not_overlapping(out, [cfg.input.path])
    name = cfg.denoise.output_name
    check_output_folder(out, extra_names=(name, f"{name}_rows"))
    _check_exists(cfg.input)


def stage_begin(cfg: PipelineConfig) -> None:
    """Refuse to clobber a complete run (unless overwrite), to write where another run
    holds the lock, into a folder of the user's, or over the input -- and check that the
    input exists -- before un-publishing the old manifest (kept in ``.kpca-prev`` until
    the new run is published: pipeline/publish.py)."""
    out = stage_locations(cfg)["out"]
    check_unlocked(out)
    check_output(cfg)
    begin_run(out, overwrite=cfg.output.overwrite)


class RunTransaction(RunLock):
    """The run lock plus the publishing transaction (pipeline/publish.py).

    Taking it first refuses an output that is not ours to write (``check_output``); on
    leaving, a published run retires the previous one kept in ``.kpca-prev``, and a
    failed or interrupted run puts the previous one back.
    """

    def __init__(self, cfg: PipelineConfig):
        super().__init__(stage_locations(cfg)["out"])
        self.cfg = cfg

    def acquire(self) -> RunTransaction:
        check_output(self.cfg)  # before the lock file or any folder is created
        super().acquire()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.holder is not None:
                if exc_type is None:
                    retire_previous(self.out)
                else:
                    restore_previous(self.out)
        finally:
            self.release()


def run_lock(cfg: PipelineConfig) -> RunLock:
    """The output's run lock (a context manager): hold it around all the stages of a run.

    A second run to the same output is refused while it is held; the lock of a
    run that died on this host is broken automatically; one held from another
    host needs ``kpca unlock <out>`` (see pipeline/lock.py). It is also the run's
    publishing transaction: see :class:`RunTransaction`.
    """
    return RunTransaction(cfg)


def stage_ingest(cfg: PipelineConfig) -> dict[str, Any]:
    """Input -> ``work/ingest.zarr`` (reused when source and config are unchanged)."""
    return ingest(cfg.input, cfg.chunks, stage_locations(cfg)["ingest"]).to_dict()


def stage_split(cfg: PipelineConfig, ing: dict[str, Any]) -> dict[str, Any]:
    """Held-out rows for evaluation (seeded), and labels/ids/split next to the embedding."""
    res, src = _ingested(ing)
    out = stage_locations(cfg)["out"]
    g = out.open_group("a")
    rows = src.X.chunks[0]
    mask = None
    if evaluation_wanted(cfg, res):
        # stratified by class, seeded by evaluate.random_state (labels are n ints)
        mask = make_split(np.asarray(src.labels.compute()), cfg.evaluate.test_fraction,
                          random_state=cfg.evaluate.random_state,
                          stratify=cfg.evaluate.stratify)
        _store_array(g, "split", da.from_array(mask, chunks=rows), rows)
    elif "split" in g:
        del g["split"]
    for name, arr in (("labels", src.labels), ("ids", src.ids)):
        if arr is not None:
            _store_array(g, name, arr, rows)
        elif name in g:
            del g[name]
    if src.labels is not None:
        g["labels"].attrs["classes"] = src.classes
    split_id = "all" if mask is None else hashlib.blake2b(mask.tobytes(), digest_size=8).hexdigest()
    n_train = res.n_rows if mask is None else int(mask.sum())
    return {"held_out": mask is not None, "n_train": n_train,
            "n_test": res.n_rows - n_train, "split_id": split_id}


def stage_kernel(cfg: PipelineConfig, ing: dict[str, Any], split: dict[str, Any]) -> dict[str, Any]:
    """Decide whether to materialise K; if so, build the upper-block store (resumable)."""
    res = IngestResult.from_dict(ing)
    X_train, r = _training_rows(cfg, ing, split)
    n_train = int(X_train.shape[0])
    if cfg.solver.n_components > n_train:
        raise ValueError(f"solver.n_components={cfg.solver.n_components} exceeds the "
                         f"{n_train} training rows; ask for fewer components.")
    est = make_estimator(cfg)
    solver = est.plan(X_train, kernel=False).solver  # reads no data
    materialize, why = plan_materialize(cfg.kernel_store.materialize, solver, res.n_features)
    logger.info("plan: %d training rows in blocks of %d, %s solver, kernel %s (%s)", n_train, r,
                solver, "materialised" if materialize else "recomputed per pass", why)
    info: dict[str, Any] = {"materialized": materialize, "reason": why, "solver": solver,
                            "block_rows": r}
    if materialize:
        X_train = X_train.persist()
        plan = est.plan(X_train)  # gamma="scale": a sample of the persisted rows
        ks = build_kernel_store(X_train, plan.kernel, cfg.solver.dtype, stage_locations(cfg)["kernel"],
                                input_fingerprint=f"{res.fingerprint}:split={split['split_id']}",
                                verify=cfg.kernel_store.verify)
        info.update(ks.to_dict())
        info["gamma"] = plan.gamma
    return info


def stage_centre(cfg: PipelineConfig, ing: dict, split: dict, kernel: dict) -> dict[str, Any]:
    """Row means and grand mean of the training kernel matrix: fused into the solve.

    ``mu = K 1 / n`` is one more column in the solver's first product (over the
    stored blocks when K is materialised, the evaluated ones otherwise), so it
    costs no pass of its own; the solve stage saves the statistics to
    ``<work>/centre.zarr`` and with the model. (A separate pass over a
    materialised n = 100k store took 21 s of a 790 s run.)
    """
    return {"fused_into_solve": True}


def stage_solve(cfg: PipelineConfig, ing: dict, split: dict, kernel: dict,
                centre: dict) -> dict[str, Any]:
    """Fit on the training rows; the model goes to ``<out>/model``."""
    loc = stage_locations(cfg)
    release_worker_memory()  # what the kernel build's buffers left on the workers' heaps
    X_train, r = _training_rows(cfg, ing, split)
    reader = None
    solve_cfg = cfg
    if kernel.get("materialized"):
        reader = KernelBlockReader(kernel["path"], loc["kernel"].storage_options)
        if cfg.kernel.gamma == "scale":  # the store was built with this resolved gamma
            solve_cfg = cfg.model_copy(deep=True)
            solve_cfg.kernel.gamma = float(kernel["gamma"])
    model, info = solve(X_train, solve_cfg, loc["model"], block_rows=r, block_reader=reader)
    if getattr(model, "row_means_", None) is not None:
        save_centring(loc["centre"], model.row_means_, model.grand_mean_)  # fused in the solve
    return {**info, "path": str(loc["model"])}


def stage_project(cfg: PipelineConfig, ing: dict, split: dict, solved: dict) -> dict[str, Any]:
    """Embedding of every row (zarr, optional Parquet) and the spectrum."""
    import kpca_dask

    out = stage_locations(cfg)["out"]
    _, src = _ingested(ing)
    model = kpca_dask.load(solved["path"])
    mask = _read_split(cfg, split)
    info = write_embedding(model, src.X, out, split=mask)
    write_spectrum(out, model)
    if cfg.output.parquet:
        g = out.open_group("r")
        pq = write_parquet(out, da.from_zarr(g["embedding"]), ids=src.ids, labels=src.labels,
                           classes=src.classes,
                           split=None if mask is None else da.from_array(mask, chunks=src.X.chunks[0]))
        info["parquet"] = pq["path"]
    return info


def stage_evaluate(cfg: PipelineConfig, split: dict) -> dict[str, Any] | None:
    """Classifier on the embedding vs linear PCA, and the report (labelled input only)."""
    if not split.get("held_out"):
        return None
    from .evaluate import evaluate_run

    return evaluate_run(stage_locations(cfg)["out"].url, cfg.evaluate)


def stage_export(cfg: PipelineConfig, ing: dict, kernel: dict, solved: dict,
                 timings: dict[str, float], evaluation: dict | None,
                 denoised: dict | None = None) -> dict[str, Any]:
    """Checksums and the manifest, written last and atomically: the run is now a result."""
    denoised = denoised if denoised and denoised.get("enabled") else None
    return write_manifest(
        stage_locations(cfg)["out"], config=cfg.to_json_dict(), ingest=ing,
        model={**solved, "path": "model"}, timings=timings,
        arrays=tuple(denoised["arrays"]) if denoised else (),
        extra={"kernel_store": kernel, "evaluation": _summary(evaluation) if evaluation else None,
               "denoise": denoised})


def _summary(evaluation: dict) -> dict:
    return {k: v for k, v in evaluation.items()
            if isinstance(v, (int, float, str, bool)) or v is None}


def run_pipeline(cfg: PipelineConfig) -> RunSummary:
    """Every stage in order, on the current Dask scheduler/client, holding the output's lock."""
    with run_lock(cfg):
        return _run_stages(cfg)


def _run_stages(cfg: PipelineConfig) -> RunSummary:
    timings: dict[str, float] = {}
    t_run = time.perf_counter()

    def timed(name, fn, *args):
        t = time.perf_counter()
        result = fn(*args)
        timings[name] = time.perf_counter() - t
        return result

    timed("begin", stage_begin, cfg)
    ing = timed("ingest", stage_ingest, cfg)
    split = timed("split", stage_split, cfg, ing)
    kernel = timed("kernel", stage_kernel, cfg, ing, split)
    centre = timed("centre", stage_centre, cfg, ing, split, kernel)
    solved = timed("solve", stage_solve, cfg, ing, split, kernel, centre)
    timed("project", stage_project, cfg, ing, split, solved)
    denoised = timed("denoise", stage_denoise, cfg, ing, split, solved)
    evaluation = timed("evaluate", stage_evaluate, cfg, split)
    timings["total"] = time.perf_counter() - t_run
    manifest = stage_export(cfg, ing, kernel, solved, timings, evaluation, denoised)
    return RunSummary(out=str(stage_locations(cfg)["out"]), manifest=manifest, timings=timings)
