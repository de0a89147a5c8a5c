"""The pipeline's stages, declared once: the registry the plain run, the Prefect flow, its
tasks and its cache keys all derive from.

    ingest -> split -> kernel -> solve -> project -> denoise -> evaluate -> export

Each :class:`Stage` declares

* its ``name`` and the function that does the work (``run``);
* the config slice it reads (``config``: section names or dotted fields). The function
  is called with a :class:`ConfigView` of that slice only: reading any other field raises
  :class:`ConfigSliceError` naming the stage and the field, so the slice -- which is
  also what the stage's cache key hashes -- cannot silently fall behind the code;
* its inputs (``inputs``: the results of earlier stages, by the name they are passed
  under), the name of its own result (``result``) and that result's type
  (``result_type``: a frozen dataclass of pipeline/results.py carrying its stores as
  locations with their storage options; None: plain JSON data). Results are small
  descriptors (locations, counts, content fingerprints; never arrays). The stage
  function takes and returns the typed form; :meth:`Stage.__call__` is the one place
  that converts from and to the JSON form the Prefect tasks pass, persist and hash
  (``fingerprint`` and ``fresh`` work on that JSON form);
* the artifacts it publishes under ``<out>`` (``publishes``: a reader-visible path is
  about to change, so the flow withdraws the manifest first);
* ``fingerprint``: content checksums the flow adds to the result, so that dependants'
  cache keys and the freshness check see content, not only configuration;
* ``fresh``: whether a cached result still describes what is on disk (None if it
  does, else why not).

Adding or removing a stage here is the only edit the plain run, the flow and the cache
need (tests/pipeline/test_stages.py shows it with a toy stage).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
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
from .results import (
    KernelResult,
    ProjectResult,
    SolveResult,
    SplitResult,
    from_json,
    to_json,
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

#: Every stage finds its stores through the run layout, which reads these fields.
LAYOUT_FIELDS = ("output.path", "output.storage_options")

#: Config fields that steer a run but never change its artifacts: never in a cache key
#: (``kpca run --overwrite`` or another cluster address must not re-publish a run).
RUN_CONTROL = ("output.overwrite", "output.keep_versions", "cluster")

#: Run statistics in stage results: they differ between two runs that produce identical
#: stores, so they never enter a dependant's key.
VOLATILE = frozenset(
    {"seconds", "fit_seconds", "reused", "computed", "skipped", "bytes_written", "timings"}
)


# ------------------------------------------------------------------ config slices
class ConfigSliceError(InternalError, RuntimeError):
    """A stage read a config field outside its declared slice: a bug in the stage or in
    its declaration (pipeline/stages.py), never the user's."""


def _parse_fields(fields: Iterable[str]) -> dict[str, frozenset[str] | None]:
    """``("kernel", "solver.dtype")`` -> ``{"kernel": None, "solver": {"dtype"}}``
    (None: the whole section)."""
    out: dict[str, set[str] | None] = {}
    for f in fields:
        section, _, name = f.partition(".")
        if not name:
            out[section] = None
        elif section not in out or out[section] is not None:
            out.setdefault(section, set()).add(name)  # type: ignore[union-attr]
    return {k: (None if v is None else frozenset(v)) for k, v in out.items()}


def _slice_error(stage: str, field: str, allowed: Iterable[str]) -> ConfigSliceError:
    return ConfigSliceError(
        f"stage {stage!r} read config field {field!r}, which is outside its declared config "
        f"slice ({', '.join(sorted(allowed))}); add {field!r} to the stage's config in "
        "pipeline/stages.py (it is part of the stage's cache key)."
    )


class _SectionView:
    """One config section, restricted to the fields a stage declared."""

    __slots__ = ("_fields", "_name", "_section", "_stage")

    def __init__(self, section: Any, stage: str, name: str, fields: frozenset[str]):
        object.__setattr__(self, "_section", section)
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        if attr not in self._fields:
            raise _slice_error(
                self._stage, f"{self._name}.{attr}", (f"{self._name}.{f}" for f in self._fields)
            )
        return getattr(self._section, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"config.{self._name} is read-only in stage {self._stage!r}")

    def __repr__(self) -> str:
        return f"<{self._name} fields {sorted(self._fields)} of stage {self._stage!r}>"


class ConfigView:
    """What a stage sees of the validated :class:`~pipeline.config.PipelineConfig`: the
    sections and fields it declared, and nothing else (:class:`ConfigSliceError`)."""

    __slots__ = ("_cfg", "_fields", "_sections", "_stage")

    def __init__(self, cfg: PipelineConfig, stage: str, fields: Iterable[str]):
        if isinstance(cfg, ConfigView):
            cfg = cfg._cfg
        fields = tuple(fields)
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_sections", _parse_fields(fields))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        if attr not in self._sections:
            raise _slice_error(self._stage, attr, self._fields)
        value = getattr(self._cfg, attr)
        names = self._sections[attr]
        return value if names is None else _SectionView(value, self._stage, attr, names)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"the config is read-only in stage {self._stage!r}")

    def __repr__(self) -> str:
        return f"<config slice {list(self._fields)} of stage {self._stage!r}>"

    def to_json_dict(self) -> dict[str, Any]:
        """The slice as JSON data (nested like the config; what the cache key hashes)."""
        data = self._cfg.to_json_dict()
        out: dict[str, Any] = {}
        for section, names in self._sections.items():
            out[section] = (
                data[section] if names is None else {n: data[section][n] for n in sorted(names)}
            )
        return out

    def model_copy(self, *, deep: bool = False) -> ConfigView:
        """A copy with the same slice (a stage may adjust its own copy, e.g. the solve's
        resolved gamma)."""
        return ConfigView(self._cfg.model_copy(deep=deep), self._stage, self._fields)


def _check_fields(stage: str, fields: Iterable[str]) -> None:
    """Every declared field exists in the config model (a misspelling fails at import)."""
    for f in fields:
        section, _, name = f.partition(".")
        sec = PipelineConfig.model_fields.get(section)
        if sec is None or (name and name not in sec.annotation.model_fields):
            raise ValueError(
                f"stage {stage!r} declares config field {f!r}, which the "
                "pipeline config does not have"
            )


def config_slice(*fields: str) -> tuple[str, ...]:
    """``fields`` as a stage declares them: a section whose every field is listed is
    named whole (``kernel``), the rest stay dotted; duplicates dropped, order kept."""
    listed = set(fields)
    out: list[str] = []
    for f in fields:
        section, _, name = f.partition(".")
        model = PipelineConfig.model_fields[section].annotation
        whole = not name or all(f"{section}.{n}" in listed for n in model.model_fields)
        out.append(section if whole or section in listed else f)
    return tuple(dict.fromkeys(out))


# ---------------------------------------------------------------------- registry
def _always_fresh(cfg: Any, inputs: dict[str, Any], result: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline (see the module docstring)."""

    name: str
    run: Callable[..., Any]
    config: tuple[str, ...]
    result: str
    inputs: tuple[str, ...] = ()
    publishes: tuple[str, ...] = ()
    fingerprint: Callable[[Any, Any], Any] | None = None
    fresh: Callable[[Any, dict[str, Any], Any], str | None] = _always_fresh
    #: arguments the runner supplies that are this run's facts, never part of a key
    run_info: tuple[str, ...] = ()
    #: reads the input source (outside the run): its files' state is part of the key
    reads_source: bool = False
    doc: str = ""
    #: the type of the result (pipeline/results.py; None: plain JSON data)
    result_type: type | None = None
    #: the types of the inputs, by name (filled in by the :class:`Registry` from the
    #: producing stages' ``result_type``)
    input_types: tuple[tuple[str, type | None], ...] = field(default=(), compare=False)

    @property
    def fields(self) -> tuple[str, ...]:
        """The config slice the stage receives: its declaration plus the layout's fields."""
        return tuple(dict.fromkeys(self.config + LAYOUT_FIELDS))

    def view(self, cfg: PipelineConfig) -> ConfigView:
        return ConfigView(cfg, self.name, self.fields)

    def __call__(self, cfg: PipelineConfig, **inputs: Any) -> Any:
        """Run the stage on its config slice and the named inputs: the one place where
        results are converted, JSON form (or typed) in, JSON form out."""
        types = dict(self.input_types)
        args = {k: from_json(types.get(k), v) for k, v in inputs.items()}
        return to_json(self.run(self.view(cfg), **args))

    def with_fingerprint(self, cfg: PipelineConfig, result: Any) -> Any:
        return result if self.fingerprint is None else self.fingerprint(self.view(cfg), result)

    def stale_reason(
        self, cfg: PipelineConfig, inputs: dict[str, Any], result: Any
    ) -> str | None:
        """Why a cached ``result`` no longer describes the stores (None: it still does)."""
        try:
            return self.fresh(self.view(cfg), inputs, result)
        except ConfigSliceError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable or missing store
            return f"its stores cannot be read ({type(exc).__name__}: {exc})"

    def key_config(self, cfg: PipelineConfig) -> dict[str, Any]:
        """The config slice as its cache key sees it: run control removed."""
        data = self.view(cfg).to_json_dict()
        for path in RUN_CONTROL:
            section, _, name = path.partition(".")
            if not name:
                data.pop(section, None)
            elif isinstance(data.get(section), dict):
                data[section].pop(name, None)
        return data


class Registry:
    """Stages in the order they run; each stage's inputs are earlier stages' results."""

    def __init__(self, stages: Iterable[Stage]):
        self._stages = tuple(stages)
        seen: dict[str, type | None] = {}
        names: set[str] = set()
        typed = []
        for s in self._stages:
            if s.name in names or s.result in seen:
                raise ValueError(f"stage {s.name!r}: its name or result name is taken")
            missing = [i for i in s.inputs if i not in seen]
            if missing:
                raise ValueError(
                    f"stage {s.name!r} takes {missing}, which no earlier stage returns"
                )
            _check_fields(s.name, s.config)
            names.add(s.name)
            seen[s.result] = s.result_type
            typed.append(replace(s, input_types=tuple((i, seen[i]) for i in s.inputs)))
        self._stages = tuple(typed)

    def __iter__(self) -> Iterator[Stage]:
        return iter(self._stages)

    def __len__(self) -> int:
        return len(self._stages)

    def __getitem__(self, name: str) -> Stage:
        for s in self._stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._stages)

    def replace(self, stages: Iterable[Stage]) -> Registry:
        return Registry(stages)

    def without(self, name: str) -> Registry:
        return Registry(s for s in self._stages if s.name != name)

    def with_stage(self, stage: Stage, *, before: str | None = None) -> Registry:
        """A copy with ``stage`` inserted before ``before`` (default: at the end)."""
        stages = list(self._stages)
        at = len(stages) if before is None else self.names.index(before)
        return Registry(stages[:at] + [stage] + stages[at:])


def identity(result: Any) -> Any:
    """A stage result without its run statistics (:data:`VOLATILE`), and with paths
    inside an output's versions (``.../versions/<id>/model``) named without the version:
    the same content written into the next version is the same result."""
    if isinstance(result, dict):
        return {k: identity(v) for k, v in result.items() if k not in VOLATILE}
    if isinstance(result, (list, tuple)):
        return [identity(v) for v in result]
    if isinstance(result, str) and "/versions/" in result:
        return _VERSION_IN_PATH.sub("/versions/*", result)
    return result


_VERSION_IN_PATH = re.compile(r"/versions/[^/]+(?=/|$)")


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
