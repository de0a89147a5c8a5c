"""The pipeline's stages: their bodies and :data:`REGISTRY`, their declarations in the
order they run (the framework, :class:`Stage` and :class:`Registry`, is
pipeline/registry.py).

    ingest -> split -> kernel -> solve -> project -> denoise -> evaluate -> export

Each stage reads the config slice it declares (a :class:`ConfigView`), takes the typed
results of earlier stages and returns its own; ``_fresh_*`` say whether a cached result
still describes the stores, ``_fingerprint_*`` add content checksums to a result. How
the fit is set up (the kernel and solve stages' slices, the estimator, the plan carried
from one to the other) is pipeline/fitspec.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import dask.array as da
import numpy as np

from kpca_dask.plan import resolve_kernel
from kpca_dask.precision import centred_for_rows

from .cluster import release_worker_memory
from .completeness import DENSE
from .config import ConfigError, PipelineConfig
from .denoise import WRITTEN_ATTR, stage_denoise
from .errors import InternalError
from .evaluate import make_split
from .export import file_checksums, write_manifest, write_spectrum
from .fitspec import FIT_FIELDS, PLAN_FIELDS, plan_fit
from .ingest import IngestResult, InputError, ingest, stale_ingest
from .kernel import KernelBlockReader, build_kernel_store
from .layout import (
    EMBEDDING,
    MODEL,
    PARQUET,
    REPORT,
    ROW_ARRAYS,
    SPECTRUM_ARRAYS,
    RunLayout,
    run_layout,
)
from .preprocess import fit_training_scaler, scaler_id, scaler_of
from .project import write_embedding, write_parquet
from .registry import (
    LAYOUT_FIELDS,
    RUN_CONTROL,
    VOLATILE,
    ConfigSliceError,
    ConfigView,
    Registry,
    Stage,
    config_slice,
    identity,
)
from .results import (
    KernelResult,
    ProjectResult,
    SolveResult,
    SplitResult,
)
from .solve import solve
from .stage_data import ingested, read_split
from .store import array_checksum, json_default, read_json

__all__ = [
    "LAYOUT_FIELDS",
    "REGISTRY",
    "RUN_CONTROL",
    "VOLATILE",
    "ConfigSliceError",
    "ConfigView",
    "Registry",
    "Stage",
    "checksums",
    "config_slice",
    "evaluation_wanted",
    "files_under",
    "identity",
    "stage_denoise",
    "stage_evaluate",
    "stage_export",
    "stage_ingest",
    "stage_kernel",
    "stage_project",
    "stage_solve",
    "stage_split",
]

logger = logging.getLogger("pipeline")


# --------------------------------------------------------------------- helpers
def evaluation_wanted(cfg: Any, ing: IngestResult) -> bool:
    enabled = cfg.evaluate.enabled
    if enabled and ing.has_labels and len(ing.classes or []) < 2:
        raise InputError(
            f"label column {ing.label_column!r} has {len(ing.classes or [])} class(es); "
            "evaluation needs at least 2 (or drop input.label_column)."
        )
    if enabled == "auto":
        return ing.has_labels
    if enabled and not ing.has_labels:
        raise ConfigError(
            "evaluate.enabled is true but the input has no label column; set "
            "input.label_column or evaluate.enabled: auto."
        )
    return bool(enabled)


def _training_rows(cfg: Any, ing: IngestResult, split: SplitResult) -> da.Array:
    """Training rows of the ingested X (in the ingest store's chunks)."""
    _, src = ingested(ing)
    mask = read_split(run_layout(cfg), split)
    return src.X if mask is None else src.X[mask.astype(bool)]


def _store_array(g, name: str, arr: da.Array, rows) -> None:
    if name in g:
        del g[name]
    arr = arr.rechunk({0: rows})
    dtype = str if arr.dtype.kind in "OUT" else arr.dtype
    z = g.create_array(name, shape=arr.shape, dtype=dtype, chunks=(rows[0],), config=DENSE)
    da.store(arr, z, lock=False)


def checksums(group: Any, names: Iterable[str]) -> dict[str, str]:
    """``array_checksum`` of each named array present in a zarr group."""
    return {name: array_checksum(group[name]) for name in names if name in group}


def files_under(layout: RunLayout, folder: str) -> dict[str, str]:
    """SHA-256 of the run's files under ``folder`` (as the manifest records them)."""
    sums = file_checksums(layout.out)
    return {k: v for k, v in sums.items() if k == folder or k.startswith(folder + "/")}


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON (so NaN equals NaN, and tuples equal lists)."""
    return json.dumps(a, sort_keys=True, default=json_default) == json.dumps(
        b, sort_keys=True, default=json_default
    )


# ---------------------------------------------------------------------- stages
def stage_ingest(cfg: Any) -> IngestResult:
    """Input -> ``work/ingest.zarr`` (reused when source and config are unchanged)."""
    # any number of classes: evaluation, which needs 2, checks that (evaluation_wanted);
    # an update or a run without evaluation carries whatever labels the rows have
    return ingest(cfg.input, cfg.chunks, run_layout(cfg).ingest, min_classes=1)


def _fresh_ingest(cfg: Any, inputs: dict, res: dict) -> str | None:
    store = run_layout(cfg).ingest
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


def stage_split(cfg: Any, ing: IngestResult) -> SplitResult:
    """Held-out rows for evaluation (seeded), and labels/ids/split next to the embedding."""
    res, src = ingested(ing)
    g = run_layout(cfg).out.open_group("a")
    rows = src.X.chunks[0]
    mask = None
    if evaluation_wanted(cfg, res):
        # stratified by class, seeded by evaluate.random_state (labels are n ints)
        mask = make_split(
            np.asarray(src.labels.compute()),
            cfg.evaluate.test_fraction,
            random_state=cfg.evaluate.random_state,
            stratify=cfg.evaluate.stratify,
        )
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
    split_id = (
        "all" if mask is None else hashlib.blake2b(mask.tobytes(), digest_size=8).hexdigest()
    )
    n_train = res.n_rows if mask is None else int(mask.sum())
    # the scaling sees the training rows only: held-out rows never move its statistics
    X_train = src.X if mask is None else src.X[mask.astype(bool)]
    pre = fit_training_scaler(cfg.preprocess.scale, X_train, res.columns)
    return SplitResult(
        held_out=mask is not None,
        n_train=n_train,
        n_test=res.n_rows - n_train,
        split_id=split_id,
        preprocess=pre,
    )


def _fingerprint_split(cfg: Any, res: dict) -> dict:
    return {**res, "checksums": checksums(run_layout(cfg).out.open_group("r"), ROW_ARRAYS)}


def _fresh_split(cfg: Any, inputs: dict, res: dict) -> str | None:
    if checksums(run_layout(cfg).out.open_group("r"), ROW_ARRAYS) != res.get("checksums"):
        return "labels/ids/split next to the embedding changed"
    return None


def stage_kernel(cfg: Any, ing: IngestResult, split: SplitResult) -> KernelResult:
    """Plan the fit (pipeline/fitspec.py: solver, block rows, whether to materialise K)
    and, if K is materialised, build the upper-block store (resumable). The result
    carries the plan to the solve."""
    X_train = _training_rows(cfg, ing, split)
    n_train, d = (int(s) for s in X_train.shape)
    if cfg.solver.n_components > n_train:
        raise ConfigError(
            f"solver.n_components={cfg.solver.n_components} exceeds the "
            f"{n_train} training rows; ask for fewer components."
        )
    fit = plan_fit(cfg, n_train, d, plans_only=True)  # reads no data
    r, solver = fit.block_rows, fit.solver
    logger.info(
        "plan: %d training rows in blocks of %d, %s solver, kernel %s (%s)",
        n_train,
        r,
        solver,
        "materialised" if fit.materialize else "recomputed per pass",
        fit.reason,
    )
    result = KernelResult(
        materialized=fit.materialize, reason=fit.reason, solver=solver, block_rows=r
    )
    if fit.materialize:
        X_train = X_train.rechunk({0: r, 1: -1})
        scaler = scaler_of(split)
        if scaler is not None:  # the kernel of the scaled rows, as the solve fits them
            X_train = scaler.transform(X_train)
        X_train = X_train.persist()
        # gamma="scale": resolved once, on a sample of the persisted rows; the solve
        # fits with this number (KernelResult.gamma), the store is built with it
        plan = resolve_kernel(fit.plan, fit.estimator.get_params(), X_train)
        store = run_layout(cfg).kernel
        ks = build_kernel_store(
            X_train,
            # distance kernels on rows minus their mean: exact far from the origin
            centred_for_rows(plan.kernel, X_train),
            cfg.solver.dtype,
            store,
            input_fingerprint=_kernel_input(ing.fingerprint, split),
            verify=cfg.kernel_store.verify,
        )
        built = {k: v for k, v in ks.to_dict().items() if k != "path"}
        result = replace(result, store=store, gamma=plan.gamma, **built)
    return result


def _kernel_input(fingerprint: str, split: Any) -> str:
    """What a kernel store was built from: the input, the split and the scaling."""
    split_id = split["split_id"] if isinstance(split, dict) else split.split_id
    pre = scaler_id(split)
    return f"{fingerprint}:split={split_id}" + (f":scale={pre}" if pre else "")


def _fresh_kernel(cfg: Any, inputs: dict, res: dict) -> str | None:
    if not res.get("materialized"):
        return None  # nothing on disk: the solver evaluates blocks itself
    g = run_layout(cfg).kernel.open_group("r")
    ing, split = inputs["ing"], inputs["split"]
    expected = {
        "input_fingerprint": _kernel_input(ing["fingerprint"], split),
        "kernel": res["kernel"],
        "dtype": res["dtype"],
        "block_rows": res["block_rows"],
        "n": res["n"],
    }
    if not all(_same(g.attrs.get(k), v) for k, v in expected.items()):
        return "the kernel store belongs to another input or kernel"
    done = np.asarray(g["done"][...], dtype=np.uint64)
    upper = np.triu_indices(done.shape[0])
    if not np.all(done[upper] >> np.uint64(32)):
        return "the kernel store is missing blocks"
    return None


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
    overrides = {}
    if kernel.materialized and kernel.store is not None:
        # the store as the kernel stage wrote it (its storage options included)
        reader = KernelBlockReader(kernel.store.url, kernel.store.storage_options)
        if cfg.kernel.gamma == "scale":  # the store was built with this resolved gamma
            overrides["gamma"] = float(kernel.gamma)
    # the kernel stage's plan: its solver and block rows (the partition of the store)
    X_train = _training_rows(cfg, ing, split).rechunk({0: kernel.block_rows, 1: -1})
    n_train, d = (int(s) for s in X_train.shape)
    fit = plan_fit(cfg, n_train, d, overrides=overrides, block_rows=kernel.block_rows)
    if fit.solver != kernel.solver:
        raise InternalError(
            f"the solve planned the {fit.solver} solver, the kernel stage {kernel.solver}"
        )
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


_PROJECT_ARRAYS = (EMBEDDING, *SPECTRUM_ARRAYS)


def stage_project(
    cfg: Any, ing: IngestResult, split: SplitResult, solved: SolveResult
) -> ProjectResult:
    """Embedding of every row (zarr, optional Parquet) and the spectrum."""
    import kpca_dask

    layout = run_layout(cfg)
    out = layout.out
    _, src = ingested(ing)
    # the model of the version being written (a cached result may name an earlier one)
    model = kpca_dask.load(layout.model.zarr_source())
    mask = read_split(layout, split)
    result = ProjectResult(**write_embedding(model, src.X, out, split=mask))
    write_spectrum(out, model)
    if cfg.output.parquet:
        g = out.open_group("r")
        pq = write_parquet(
            out,
            da.from_zarr(g[EMBEDDING]),
            ids=src.ids,
            labels=src.labels,
            classes=src.classes,
            split=None if mask is None else da.from_array(mask, chunks=src.X.chunks[0]),
        )
        result = replace(result, parquet=pq["path"])
    return result


def _fingerprint_project(cfg: Any, res: dict) -> dict:
    layout = run_layout(cfg)
    return {
        **res,
        "checksums": checksums(layout.out.open_group("r"), _PROJECT_ARRAYS),
        "files": files_under(layout, PARQUET),
    }


def _fresh_project(cfg: Any, inputs: dict, res: dict) -> str | None:
    layout = run_layout(cfg)
    if checksums(layout.out.open_group("r"), _PROJECT_ARRAYS) != res.get("checksums"):
        return "the embedding or spectrum changed"
    if files_under(layout, PARQUET) != res.get("files", {}):
        return "the Parquet embedding changed"
    return None


def _fingerprint_denoise(cfg: Any, res: dict) -> dict:
    if not res.get("enabled"):
        return res
    g = run_layout(cfg).out.open_group("r")
    return {**res, "checksums": checksums(g, tuple(res["arrays"]))}


def _fresh_denoise(cfg: Any, inputs: dict, res: dict) -> str | None:
    g = run_layout(cfg).out.open_group("r")
    written = [a for a in g.attrs.get(WRITTEN_ATTR, []) if a in g]
    if written != list(res.get("arrays", [])):
        return "another run's denoised rows are in the run folder"
    if res.get("enabled") and checksums(g, tuple(written)) != res.get("checksums"):
        return "the denoised rows changed"
    return None


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
    from .evaluate import evaluate_run

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


# -------------------------------------------------------------------- the stages
#: the ingest stage, shared by the full run and by ``kpca update`` (pipeline/update.py)
INGEST = Stage(
    "ingest",
    stage_ingest,
    config=("input", "chunks.target_chunk_mb"),
    result="ing",
    result_type=IngestResult,
    fresh=_fresh_ingest,
    reads_source=True,
    doc="input -> work/ingest.zarr, validated and fingerprinted",
)

REGISTRY = Registry(
    [
        INGEST,
        Stage(
            "split",
            stage_split,
            inputs=("ing",),
            result="split",
            result_type=SplitResult,
            config=(
                "evaluate.enabled",
                "evaluate.test_fraction",
                "evaluate.random_state",
                "evaluate.stratify",
                "preprocess",
            ),
            publishes=ROW_ARRAYS,
            fingerprint=_fingerprint_split,
            fresh=_fresh_split,
            doc="held-out rows (labelled input), labels/ids/split next to the embedding; "
            "the feature scaling fitted on the training rows",
        ),
        Stage(
            "kernel",
            stage_kernel,
            inputs=("ing", "split"),
            result="kernel",
            result_type=KernelResult,
            config=config_slice(*PLAN_FIELDS, "kernel_store"),
            fresh=_fresh_kernel,
            doc="plan the solve; materialise the upper kernel blocks when that pays",
        ),
        Stage(
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
        ),
        Stage(
            "project",
            stage_project,
            inputs=("ing", "split", "solved"),
            result="projected",
            result_type=ProjectResult,
            config=("output.parquet",),
            publishes=(EMBEDDING, "spectrum", PARQUET),
            fingerprint=_fingerprint_project,
            fresh=_fresh_project,
            doc="embedding of every row (zarr, optional Parquet) and the spectrum",
        ),
        Stage(
            "denoise",
            stage_denoise,
            inputs=("ing", "split", "solved"),
            result="denoised",
            config=("denoise",),
            publishes=("<denoise.output_name>",),
            fingerprint=_fingerprint_denoise,
            fresh=_fresh_denoise,
            doc="pre-images of the embedding (denoise.enabled), written next to it",
        ),
        Stage(
            "evaluate",
            stage_evaluate,
            inputs=("ing", "split", "solved", "projected"),
            result="evaluation",
            config=("evaluate",),
            publishes=(REPORT,),
            fingerprint=_fingerprint_evaluate,
            fresh=_fresh_evaluate,
            doc="classifier on the embedding vs linear PCA, and the report",
        ),
        # The manifest records the whole config; run control stays out of its key (RUN_CONTROL).
        Stage(
            "export",
            stage_export,
            inputs=("ing", "split", "kernel", "solved", "projected", "evaluation", "denoised"),
            result="manifest",
            config=tuple(PipelineConfig.model_fields),
            run_info=("timings",),
            publishes=("manifest.json",),
            fresh=_fresh_export,
            doc="checksums and the manifest, written last and atomically",
        ),
    ]
)
