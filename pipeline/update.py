"""``kpca update RUN NEW_DATA``: a new run (version n+1) from a published run and a batch.

    ingest -> base -> drift -> update -> project -> export

The stages are a :class:`~pipeline.stages.Registry` like the full pipeline's, run by
the same machinery (:func:`pipeline.run.run_pipeline`: the run lock, the publishing
transaction, resumable stages; the Prefect flow ``kpca_update`` walks the same
registry). The update's config is the base run's own (from its manifest) with
``input.path`` set to the batch, ``output.path`` to the new run and ``update.base`` to
the base run (:func:`update_config`).

* ``ingest``: the batch -> ``<new>/work/ingest.zarr`` (the full pipeline's stage).
* ``base``: verifies the base run (manifest, checksums) and reads its lineage: the
  ingest stores holding every row the base has seen, training rows marked.
* ``drift``: the drift report of the batch against a seeded sample of the training rows
  (landmarks excluded) under the base model (pipeline/drift.py), and the action the
  policy chooses; written to ``<new>/update/drift.json`` and logged in one line.
* ``update``: ``merge`` adds the batch's sufficient statistics to the base model's
  (exact: equals a fit on all rows with the same landmarks, reads only the batch);
  ``refresh_landmarks`` / ``refit`` fit again on every row of the lineage.
* ``project``: the union's embedding, row-chunked like the base's: after a merge the
  base's embedding rows are copied and the batch's appended (``update.reembed``: every
  row embedded again); after a refit every row is embedded again. Row arrays (split,
  labels, ids) and the Parquet copy follow.
* ``export``: the manifest, with an ``update`` record: base, version, lineage, the
  drift summary, the action and why.

The base run is only read, never written: the new run goes to another folder, which
must not overlap it.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import replace
from typing import Any

import dask.array as da
import numpy as np

from .completeness import DENSE
from .config import (
    ConfigError,
    PipelineConfig,
    absolute_path,
    check_storage_options,
    load_config,
)
from .errors import UserError
from .export import open_run, write_manifest, write_spectrum
from .fitspec import FIT_FIELDS, plan_fit
from .ingest import IngestResult, load_ingested
from .layout import DRIFT_REPORT, EMBEDDING, MODEL, PARQUET, UPDATE, run_layout
from .lineage import entry_record, entry_rows, entry_split, verify_entry
from .results import ProjectResult, SolveResult
from .stages import (
    INGEST,
    Registry,
    Stage,
    _fingerprint_project,
    _fingerprint_solve,
    _fresh_project,
    _fresh_solve,
    _store_array,
    config_slice,
)
from .store import Location, atomic_write_json

__all__ = [
    "UPDATE_REGISTRY",
    "UpdateError",
    "default_output",
    "latest_run",
    "run_update",
    "update_config",
]

logger = logging.getLogger("pipeline")


class UpdateError(UserError, ValueError):
    """An update that cannot be done as asked; the message says why and what to do."""


# --------------------------------------------------------------------- config
def default_output(base: Location, version: int) -> str:
    """``<base>-v<version>`` next to the base run (a trailing ``-vN`` replaced); in a
    series folder (runs named ``v1``, ``v2``...) the next ``v<version>``."""
    url = base.url.rstrip("/")
    head, _, name = url.rpartition("/")
    if re.fullmatch(r"v\d+", name):
        name = f"v{version}"
    else:
        name = re.sub(r"-v\d+$", "", name) + f"-v{version}"
    return f"{head}/{name}" if head else name


def latest_run(series: Location) -> Location | None:
    """The newest published run ``v<N>`` of a series folder (None: ``series`` is not one).

    A nightly deployment names the series (``/srv/kpca/runs/features``) instead of a run:
    each night updates the newest complete version into the next (docs/update.md).
    """
    from .layout import MANIFEST

    if series.child(MANIFEST).exists() or not series.exists():
        return None
    versions = []
    for p in series.fs.ls(series.fs_path, detail=False):
        name = str(p).rstrip("/").rpartition("/")[2]
        m = re.fullmatch(r"v(\d+)", name)
        if m and series.child(name, MANIFEST).exists():
            versions.append((int(m.group(1)), name))
    if not versions:
        return None
    return series.child(max(versions)[1])


def _version(manifest: dict) -> int:
    return int((manifest.get("update") or {}).get("version", 1))


def update_config(
    base: str,
    new_data: str,
    output: str | None = None,
    *,
    policy: str | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    input_storage_options: dict[str, Any] | None = None,
    unlabelled: bool = False,
    no_ids: bool = False,
    ignore_extra: bool = False,
) -> PipelineConfig:
    """The update run's config: the base run's (from its verified manifest) with the batch
    as input, the new run as output and ``update.base`` set. Refuses an output that
    overlaps the base run.

    Local paths are made absolute here (the manifest and lineage never depend on the
    folder a command ran in). The batch's columns are matched to the base run's features
    by name, in any order (pipeline/features.py: ``match``, as ``kpca transform`` does):
    the new run reads the base's features in the base's order. A batch without the base's
    label (id) column is refused unless ``unlabelled`` (``no_ids``).

    ``storage_options``: fsspec options of the base run and of the new run when they are
    object-store URLs (default: the base run's own ``output.storage_options``);
    ``input_storage_options``: the batch's (default: the base run's input options)."""
    opts = check_storage_options(dict(storage_options or {}), "--storage-options")
    if input_storage_options is not None:
        check_storage_options(input_storage_options, "--input-storage-options")
    base, new_data = absolute_path(base), absolute_path(new_data)
    loc = Location.at(base, opts)
    newest = latest_run(loc)
    if newest is not None:
        loc = newest
    published = open_run(loc)  # the base's published version, verified
    manifest = published.manifest
    data = dict(manifest["config"])
    version = _version(manifest) + 1
    out = absolute_path(output or default_output(loc, version))
    data["input"] = {**data["input"], "path": new_data, "format": "auto"}
    if input_storage_options is not None:
        data["input"]["storage_options"] = dict(input_storage_options)
    data["output"] = {**data["output"], "path": out, "overwrite": bool(overwrite)}
    if storage_options is not None:
        data["output"]["storage_options"] = opts
    upd = dict(data.get("update") or {})
    # the base's published version itself (never modified): what the update reads, even
    # when the base output publishes another version meanwhile
    upd["base"] = published.location.url
    upd["base_storage_options"] = dict(loc.storage_options)
    if policy is not None:
        upd["policy"] = policy
    upd["unlabelled"], upd["no_ids"] = bool(unlabelled), bool(no_ids)
    data["update"] = upd
    # an update reports drift instead of evaluating; denoising belongs to full runs
    data["evaluate"] = {**data.get("evaluate", {}), "enabled": False}
    data["denoise"] = {**data.get("denoise", {}), "enabled": False}
    cfg = load_config(data)
    a = Location.at(out).url.rstrip("/") + "/"
    b = loc.url.rstrip("/") + "/"
    if a.startswith(b) or b.startswith(a):
        raise UpdateError(
            f"the update's output {out} overlaps the base run {base}; a published run is "
            "never modified: choose another --output."
        )
    cfg = _match_batch(cfg, manifest, ignore_extra=ignore_extra)
    check_batch(cfg)
    return cfg


def check_batch(cfg: PipelineConfig) -> None:
    """Every row of the batch read once before anything starts (pipeline/validate.py:
    NaN/inf, text in a feature column, missing labels, missing or repeated ids, each with
    its row and column); ValidationError listing the problems."""
    from .validate import validate_input

    validate_input(cfg.input).raise_for_errors()


def _match_batch(cfg: PipelineConfig, manifest: dict, *, ignore_extra: bool) -> PipelineConfig:
    """``cfg`` with the batch's columns matched to the base run's by name: the base's
    features in its order, its id and label columns when the batch has them (refused,
    naming them, when it has not and the user did not say so)."""
    from .features import match
    from .readers import table_columns

    inp = manifest.get("input") or {}
    block = inp.get("features")
    if not block or block.get("selection") == "positions":
        return cfg  # an NPY/zarr base: columns by position, the width is checked later
    cols = table_columns(cfg.input)
    if cols is None:
        return cfg  # an NPY/zarr batch: by position (the drift stage checks the width)
    available, _ = cols
    base_label = block.get("label_column") or inp.get("label_column")
    base_id = block.get("id_column") or inp.get("id_column")
    m = match(
        {**block, "label_column": base_label, "id_column": base_id},
        cfg.input.path,
        available,
        ignore_extra=ignore_extra,
        what="update",
    )
    for col, found, flag, word in (
        (base_label, m.label_column, cfg.update.unlabelled, "--unlabelled"),
        (base_id, m.id_column, cfg.update.no_ids, "--no-ids"),
    ):
        if col is not None and found is None and not flag:
            kind = "label" if word == "--unlabelled" else "id"
            raise UpdateError(
                f"the batch {cfg.input.path} has no {kind} column {col!r} (the base run's); "
                f"add it, or pass {word} to add its rows without "
                f"{'labels' if kind == 'label' else 'ids'}."
            )
    new = cfg.model_copy(deep=True)
    new.input.columns = list(m.features)
    new.input.exclude_columns = None
    new.input.label_column = m.label_column
    new.input.id_column = m.id_column
    return new


# ---------------------------------------------------------------- the lineage
def _lineage(base: Location, manifest: dict) -> list[dict[str, Any]]:
    """The ingest stores holding every row of the base run, in embedding order; each
    with its row count, the options to read it, its fingerprint and digests record, and
    whether a ``split`` mask (1 = training) of the run marks its training rows
    (pipeline/lineage.py). Each entry is verified here (one line when its rows are not
    the ones the base was published with)."""
    rows = (manifest.get("update") or {}).get("rows")
    if rows:
        lineage = [dict(r) for r in rows]
        for r in lineage:  # recorded before entries had options: the base run's
            r.setdefault("storage_options", dict(base.storage_options))
    else:
        inp = manifest["input"]
        g = base.open_group("r")
        split = "split" in g
        lineage = [
            entry_record(
                Location.at(absolute_path(inp["path"]), base.storage_options),
                n_rows=int(inp["n_rows"]),
                fingerprint=inp.get("fingerprint"),
                split_run=base if split else None,
                split_checksum=manifest["checksums"].get("split") if split else None,
                split_absent=((manifest.get("integrity") or {}).get("absent_chunks") or {}).get(
                    "split"
                ),
            )
        ]
    for entry in lineage:
        verify_entry(entry)
    return lineage


def _entry_rows(entry: dict[str, Any]) -> tuple[da.Array, np.ndarray]:
    """One lineage entry's rows (lazy, every chunk verified as it is read) and its
    training mask."""
    X = entry_rows(entry)
    mask = entry_split(entry)
    return X, (np.ones(X.shape[0], dtype=bool) if mask is None else mask)


def _training_rows(lineage: list[dict[str, Any]], extra: da.Array | None = None) -> da.Array:
    """Every training row of the lineage (and ``extra``), as one dask array."""
    parts = []
    for entry in lineage:
        X, mask = _entry_rows(entry)
        parts.append(X if mask.all() else X[np.flatnonzero(mask)])
    if extra is not None:
        parts.append(extra)
    return da.concatenate(parts, axis=0)


def _all_rows(lineage: list[dict[str, Any]], extra: da.Array) -> da.Array:
    return da.concatenate([_entry_rows(e)[0] for e in lineage] + [extra], axis=0)


def _sample(n: int, size: int, seed: Any) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(n, size), replace=False))


def _reference_rows(
    lineage, landmarks: np.ndarray, size: int, seed: Any, scaler: Any = None
) -> np.ndarray:
    """A seeded uniform sample of ``size`` training rows, landmark rows left out (their
    reconstruction error is zero by construction). ``scaler``: the model's feature
    scaling (its landmarks are scaled rows; the same elementwise scaling of a raw row
    gives the same bytes)."""
    from kpca_dask.solvers.landmarks import gather_rows

    X = _training_rows(lineage)
    idx = _sample(int(X.shape[0]), size + landmarks.shape[0], seed)
    rows = gather_rows(X, idx)
    scaled = rows if scaler is None else scaler.transform(rows)
    lm = {r.tobytes() for r in np.ascontiguousarray(landmarks, dtype=np.float64)}
    keep = np.array(
        [r.tobytes() not in lm for r in np.ascontiguousarray(scaled, dtype=np.float64)],
        dtype=bool,
    )
    return rows[keep][:size]


# -------------------------------------------------------------------- stages
def stage_base(cfg: Any) -> dict[str, Any]:
    """The base run, verified, and its lineage (every row it has seen)."""
    if not cfg.update.base:
        raise ConfigError("update.base is not set; start an update with kpca update RUN DATA.")
    published = open_run(Location.at(cfg.update.base, cfg.update.base_storage_options))
    base, m = published.location, published.manifest  # the version read
    lineage = _lineage(base, m)
    return {
        "path": base.url,
        "storage_options": dict(base.storage_options),
        "version": _version(m),
        "created": m["created"],
        "model_checksums": m["model"]["checksums"],
        "lineage": lineage,
        "n_rows": int(sum(e["n_rows"] for e in lineage)),
        "columns": list(m["input"].get("columns") or []),
        # the base's features block: the new run's features are the base's (by name)
        "features": m["input"].get("features"),
    }


def _load_base_model(base: dict[str, Any]) -> Any:
    import kpca_dask

    return kpca_dask.load(_base_location(base).child(MODEL).zarr_source())


def _base_location(base: dict[str, Any]) -> Location:
    """The base run's location from the base stage's result (with its storage options)."""
    return Location.at(base["path"], base.get("storage_options"))


def stage_drift(cfg: Any, ing: IngestResult, base: dict[str, Any]) -> dict[str, Any]:
    """The drift report of the batch and the action; ``<new>/update/drift.json``."""
    from kpca_dask.solvers.landmarks import gather_rows
    from kpca_dask.update import check_updatable

    from .drift import decide, drift_report

    pol = cfg.update
    if base["columns"] and list(ing.columns) != base["columns"]:
        # by name: update_config selected the base's features in the base's order, so
        # this differs only for a batch without names (NPY/zarr) or of another width
        missing = [c for c in base["columns"] if c not in ing.columns]
        extra = [c for c in ing.columns if c not in base["columns"]]
        raise UpdateError(
            f"the batch's feature columns ({len(ing.columns)} against the base run's "
            f"{len(base['columns'])}) differ: "
            + "; ".join(
                p
                for p in (
                    f"missing {missing}" if missing else "",
                    f"not in the base run {extra}" if extra else "",
                )
                if p
            )
            + "; pass a table with the base run's feature columns (any order: they are "
            "matched by name)."
        )
    model = _load_base_model(base)
    seed = cfg.solver.random_state
    X_new = load_ingested(ing).X
    new = gather_rows(X_new, _sample(int(X_new.shape[0]), pol.reference_rows, seed))
    # Nyström: the landmarks are left out (their novelty is zero by construction); an exact
    # model keeps every training row, so its reference is in-sample (docs/update.md)
    nys = getattr(model, "eigen_solver_", None) == "nystroem"
    lm = np.asarray(model.landmarks_) if nys else np.zeros((0, int(model.n_features_in_)))
    ref = _reference_rows(
        base["lineage"], lm, pol.reference_rows, seed, getattr(model, "preprocess_", None)
    )
    if ref.shape[0] < 2:
        raise UpdateError(
            f"too few training rows for a drift report ({ref.shape[0]}); re-run the full "
            "pipeline (kpca run) instead."
        )
    report = (
        drift_report(model, ref, new, pol) if new.shape[0] >= 2 else _one_row_report(ref, new)
    )
    report["findings"] = _findings(cfg, ing, base)
    updatable: bool | str = True
    if not nys:
        updatable = (
            f"an exact ({model.eigen_solver_}) model does not merge rows, so refit on every row"
        )
    else:
        try:
            check_updatable(model)
        except Exception:  # noqa: BLE001 - the reason is in decide's line
            updatable = False
    action, why = decide(report, pol, updatable)
    if action == "refresh_landmarks" and not nys and pol.policy == "auto":
        # an exact model has no landmarks to refresh: refit it with its own solver
        action = "refit"
        why += (
            f"; the base model is exact ({model.eigen_solver_}), without landmarks: refit "
            "with its solver (set update.policy: refresh_landmarks to make it Nyström)"
        )
    report.update(action=action, reason=why, policy=pol.policy, base=base["path"])
    out = run_layout(cfg).out
    atomic_write_json(out.child(UPDATE, DRIFT_REPORT), report)
    nov = report["checks"].get("novelty")
    logger.info(
        "update: drift %s (%s): %s, because %s",
        "FLAGGED " + ",".join(report["flagged"]) if report["drifted"] else "none",
        (
            f"novelty KS p={nov['p_value']:.2g}, median x{nov['median_ratio']:.2f}; captured "
            f"{report['checks']['captured_variance']['training']:.2f} -> "
            f"{report['checks']['captured_variance']['batch']:.2f}"
        )
        if nov
        else report.get("note", "not assessed"),
        action,
        why,
    )
    for f in report["findings"]:
        logger.warning("update: finding %s: %s", f["check"], f["message"])
    return report


def _one_row_report(ref: np.ndarray, new: np.ndarray) -> dict[str, Any]:
    """The drift report of a one-row batch: no distribution to compare, nothing flagged."""
    return {
        "rows": {"batch": int(new.shape[0]), "reference": int(ref.shape[0])},
        "checks": {},
        "flagged": [],
        "drifted": False,
        "note": f"{new.shape[0]} row: too few for the drift checks (they compare "
        "distributions); not assessed",
    }


def _findings(cfg: Any, ing: IngestResult, base: dict[str, Any]) -> list[dict[str, Any]]:
    """What the batch brings that the drift checks do not measure: classes the base run
    has not seen, rows without labels or ids, ids the base run has already. Reported
    (drift.json, the manifest, the log); the rows are kept (docs/update.md)."""
    out: list[dict[str, Any]] = []
    bg = _base_location(base).open_group("r")
    base_classes = list(bg["labels"].attrs.get("classes") or []) if "labels" in bg else None
    if base_classes is not None and ing.classes is not None:
        new = [c for c in ing.classes if c not in base_classes]
        if new:
            src = load_ingested(ing)
            codes = np.asarray(src.labels.compute()) if src.labels is not None else []
            idx = [ing.classes.index(c) for c in new]
            n = int(np.isin(codes, idx).sum())
            out.append(
                {
                    "check": "new_classes",
                    "classes": new,
                    "rows": n,
                    "message": f"the batch has {n} rows of {len(new)} class(es) the base "
                    f"run has not seen: {new}; they are kept, labelled (classes now "
                    f"{base_classes + new})",
                }
            )
    if base_classes is not None and ing.label_column is None:
        out.append(
            {
                "check": "unlabelled_batch",
                "rows": int(ing.n_rows),
                "message": f"the batch has no label column ({int(ing.n_rows)} rows without "
                "labels, update.unlabelled); the base rows keep theirs",
            }
        )
    if "ids" in bg and ing.id_column is None:
        out.append(
            {
                "check": "no_ids",
                "rows": int(ing.n_rows),
                "message": "the batch has no id column (update.no_ids): the new run has no "
                "ids array; its first rows are the base run's, in order",
            }
        )
    if "ids" in bg and ing.id_column is not None:
        src = load_ingested(ing)
        new_ids = np.asarray(src.ids.compute())
        old_ids = np.asarray(bg["ids"][...])
        if new_ids.dtype.kind in "OUT" or old_ids.dtype.kind in "OUT":
            new_ids, old_ids = new_ids.astype(str), old_ids.astype(str)
        seen = np.isin(new_ids, old_ids)
        if seen.any():
            first = int(np.flatnonzero(seen)[0])
            examples = [v.item() if hasattr(v, "item") else v for v in new_ids[seen][:5]]
            out.append(
                {
                    "check": "duplicate_ids",
                    "rows": int(seen.sum()),
                    "examples": examples,
                    "first_batch_row": first,
                    "message": f"{int(seen.sum())} ids of the batch are already in the base "
                    f"run (first: {examples[0]!r}, batch row {first}); both rows are kept "
                    "(a re-sent id is a new observation): deduplicate the batch to avoid it",
                }
            )
    return out


def stage_update(
    cfg: Any, ing: IngestResult, base: dict[str, Any], drift: dict[str, Any]
) -> SolveResult:
    """The new model: merged (exact Nyström update) or refitted on every row."""
    from kpca_dask.update import update

    from .solve import check_fit, save_model, solve

    layout = run_layout(cfg)
    t0 = time.perf_counter()
    X_new = load_ingested(ing).X
    action = drift["action"]
    if action == "merge":
        model = _load_base_model(base)
        update(model, X_new)
        check_fit(model, cfg)
        save_model(model, layout.model)
        info = {
            "solver": model.eigen_solver_,
            "n_components": int(model.n_components_),
            "n_passes": 1,
            "converged": True,
            "max_residual": float(np.max(model.residuals_)),
            "gamma": model.gamma_,
            "kernel": model.kernel_.to_dict(),
            "n_samples_fit": int(model.n_samples_fit_),
            "seconds": time.perf_counter() - t0,
        }
        logger.info(
            "update: merged %d rows into the model: %d training rows, %d components",
            X_new.shape[0],
            model.n_samples_fit_,
            model.n_components_,
        )
    else:
        base_model = _load_base_model(base)
        overrides, why = _fit_overrides(cfg, base_model, action)
        X = _training_rows(base["lineage"], X_new)
        # (a slice: the drift stage's graph of the lineage alone has the same keys)
        X_old = X[: X.shape[0] - X_new.shape[0]]
        v0 = None if action == "refresh_landmarks" else _warm_start(base, X_old, X_new)
        # the features are the base run's (the batch's columns were matched to them by
        # name): the new model records the base's block, selection rule included
        features = base.get("features") or ing.features
        if features is not None and features.get("selection") == "positions":
            features = None
        # the scaling is fitted again on every row (preprocess), as a full run would
        n, d = (int(s) for s in X.shape)
        fit = plan_fit(cfg, n, d, overrides=overrides, kernel_store=False)
        _, info = solve(X, cfg, layout.model, fit=fit, features=features, v0=v0)
        info = {**info, "n_samples_fit": int(X.shape[0])}
        info["changes"] = _changes(base_model, info, why)
        if info.get("warm_start"):
            logger.info(
                "update: refit warm-started from the base model's %d eigenvectors: %d passes",
                info["warm_start"],
                info["n_passes"],
            )
    if action == "merge":
        info["changes"] = _changes(model, info, _KEPT_BY_MERGE)
    for name, c in info["changes"].items():
        logger.info(
            "update: %s %s (%s -> %s): %s",
            name,
            "CHANGED" if c["changed"] else "kept",
            c["base"],
            c["new"],
            c["why"],
        )
    info["action"] = action
    return SolveResult(model=layout.model, info=info)


_KEPT_BY_MERGE = {
    "gamma": "a merge keeps the base model's kernel (its statistics are sums under it)",
    "solver": "a merge keeps the base model's landmarks and solver",
}

#: the solvers a config can name (an ARPACK model is refitted with solver "auto")
_CONFIG_SOLVERS = ("dense", "randomized", "nystroem")


def _fit_overrides(
    cfg: Any, base_model: Any, action: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The refit's estimator parameters that differ from the config's
    (pipeline/fitspec.py; the config is not changed): the base model's kernel parameters
    (``update.kernel_params: keep``; gamma resolved once, at the first fit) and its
    solver, unless the policy changes them (``refresh_landmarks``: a Nyström fit;
    ``kernel_params: resolve``); and why each is what it is."""
    overrides: dict[str, Any] = {}
    why: dict[str, str] = {}
    gamma = getattr(base_model, "gamma_", None)
    if cfg.update.kernel_params == "keep" and gamma is not None:
        overrides["gamma"] = float(gamma)
        why["gamma"] = "update.kernel_params is 'keep': the base model's gamma"
    else:
        why["gamma"] = (
            f"update.kernel_params is 'resolve': kernel.gamma={cfg.kernel.gamma!r} resolved "
            "again on every row"
        )
    solver = str(getattr(base_model, "eigen_solver_", "") or "")
    if action == "refresh_landmarks":
        overrides["eigen_solver"] = "nystroem"
        why["solver"] = (
            "update.policy/on_drift chose refresh_landmarks: a Nyström fit with new landmarks"
        )
    elif solver in _CONFIG_SOLVERS:
        overrides["eigen_solver"] = solver
        why["solver"] = "a refit keeps the base model's solver"
    else:
        why["solver"] = f"the base model's solver {solver!r} is chosen by solver.eigen_solver"
    return overrides, why


def _changes(base_model: Any, info: dict[str, Any], why: dict[str, str]) -> dict[str, Any]:
    """Which of the base model's kernel parameter and solver the new model changed."""
    g0 = getattr(base_model, "gamma_", None)
    s0 = getattr(base_model, "eigen_solver_", None)
    g1, s1 = info.get("gamma"), info.get("solver")
    same_gamma = g0 == g1 or (g0 is not None and g1 is not None and np.isclose(g0, g1, 0, 0))
    return {
        "gamma": {
            "base": None if g0 is None else float(g0),
            "new": None if g1 is None else float(g1),
            "changed": not same_gamma,
            "why": why["gamma"],
        },
        "solver": {"base": s0, "new": s1, "changed": s0 != s1, "why": why["solver"]},
    }


def _warm_start(base: dict[str, Any], X_old: da.Array, X_new: da.Array) -> Any:
    """Starting vectors for an exact refit: the base model's eigenvectors on its rows,
    extended to the batch (kpca_dask.update.warm_start_vectors); None (cold start,
    logged) for a Nyström base or when the lineage's training rows are not the
    model's, in its order (checked on a seeded sample of rows)."""
    from kpca_dask.solvers.landmarks import gather_rows
    from kpca_dask.update import warm_start_vectors

    model = _load_base_model(base)
    if getattr(model, "eigen_solver_", None) == "nystroem" or model.X_fit_.shape[1] == 0:
        return None
    n = int(model.n_samples_fit_)
    why = None
    if int(X_old.shape[0]) != n:
        why = f"the lineage has {X_old.shape[0]} training rows, the model {n}"
    else:
        idx = _sample(n, 64, 0)
        rows = gather_rows(X_old, idx)
        scaler = getattr(model, "preprocess_", None)
        rows = rows if scaler is None else scaler.transform(rows)
        fitted = np.asarray(model.X_fit_[idx], dtype=np.float64)
        if not np.allclose(rows, fitted, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(fitted).max())):
            why = "the lineage's training rows are not the model's (order or values)"
    if why is not None:
        logger.info("update: refit from a cold start: %s", why)
        return None
    return warm_start_vectors(model, X_new)


def stage_project(
    cfg: Any,
    ing: IngestResult,
    base: dict[str, Any],
    solved: SolveResult,
) -> ProjectResult:
    """The union's embedding (base rows then the batch's), row arrays, spectrum, Parquet."""
    import kpca_dask

    from .progress import compute
    from .project import component_names, write_parquet
    from .transform import embed_rows

    t0 = time.perf_counter()
    layout = run_layout(cfg)
    out = layout.out
    model = kpca_dask.load(layout.model.zarr_source())  # the version being written's
    src = load_ingested(ing)
    bg = _base_location(base).open_group("r")
    old = da.from_zarr(bg[EMBEDDING])
    rows = old.chunks[0][0]
    reembed = solved.info.get("action") != "merge" or cfg.update.reembed
    if reembed:
        X = _all_rows(base["lineage"], src.X).rechunk({0: rows, 1: -1})
        emb = embed_rows(model, X, training_data=False, dtype=model.dtype_)
    else:
        new = embed_rows(model, src.X, training_data=False, dtype=model.dtype_)
        emb = da.concatenate([old.astype(new.dtype), new], axis=0)
    emb = emb.rechunk({0: rows, 1: -1})
    g = out.open_group("a")
    if EMBEDDING in g:
        del g[EMBEDDING]
    z = g.create_array(
        EMBEDDING, shape=emb.shape, dtype=emb.dtype, chunks=(rows, emb.shape[1]), config=DENSE
    )
    z.attrs["columns"] = component_names(emb.shape[1])
    z.attrs["rows_by_this_model"] = [0 if reembed else int(old.shape[0]), int(emb.shape[0])]
    compute(da.store(emb, z, lock=False, compute=False), label="embedding")
    arrays = _row_arrays(bg, src, int(src.X.shape[0]))
    chunks = emb.chunks[0]
    for name in ("split", "labels", "ids"):
        if arrays.get(name) is not None:
            _store_array(g, name, arrays[name], chunks)
        elif name in g:
            del g[name]
    if arrays.get("labels") is not None:
        g["labels"].attrs["classes"] = arrays["classes"]
    write_spectrum(out, model)
    result = ProjectResult(
        rows=int(emb.shape[0]), components=int(emb.shape[1]), seconds=time.perf_counter() - t0
    )
    if cfg.output.parquet:
        pq = write_parquet(
            out,
            da.from_zarr(g[EMBEDDING]),
            ids=arrays.get("ids"),
            labels=arrays.get("labels"),
            classes=arrays.get("classes"),
            split=arrays.get("split"),
        )
        result = replace(result, parquet=pq["path"])
    elif layout.parquet.exists():
        layout.parquet.remove(root=out)
    logger.info(
        "update: embedding of %d rows (%s) in %.1f s",
        result.rows,
        "every row embedded again" if reembed else f"{src.X.shape[0]} appended",
        time.perf_counter() - t0,
    )
    return result


def _row_arrays(bg: Any, src: Any, n_new: int) -> dict[str, Any]:
    """split / labels / ids of the union: the base's then the batch's.

    split: the batch is training data. labels: every row that has one keeps it -- the
    classes are the base's, then the batch's new ones appended (so the base's codes stay
    valid); a row without a label (an unlabelled batch, or an unlabelled base) has code
    -1. ids: the base's then the batch's, int64 when both are, else text; none when
    either side has none (``update.no_ids``)."""
    out: dict[str, Any] = {}
    n_old = int(bg[EMBEDDING].shape[0])
    if "split" in bg:
        out["split"] = da.concatenate(
            [da.from_zarr(bg["split"]), da.ones(n_new, dtype=bg["split"].dtype, chunks=n_new)]
        )
    old_classes = list(bg["labels"].attrs.get("classes") or []) if "labels" in bg else None
    if old_classes is not None or src.labels is not None:
        classes = list(old_classes or [])
        classes += [c for c in (src.classes or []) if c not in classes]
        old = (
            da.from_zarr(bg["labels"]).astype(np.int64)
            if old_classes is not None
            else da.full(n_old, -1, dtype=np.int64, chunks=max(1, n_old))
        )
        if src.labels is not None:
            lookup = np.array([classes.index(c) for c in src.classes or []], dtype=np.int64)
            new = src.labels.astype(np.int64).map_blocks(
                lambda c, t=lookup: np.where(c >= 0, t[np.maximum(c, 0)], -1), dtype=np.int64
            )
        else:
            new = da.full(n_new, -1, dtype=np.int64, chunks=max(1, n_new))
        out["labels"] = da.concatenate([old, new])
        out["classes"] = classes
    if "ids" in bg and src.ids is not None:
        old_ids = da.from_zarr(bg["ids"])
        if old_ids.dtype.kind in "OUT" or src.ids.dtype.kind in "OUT":
            out["ids"] = da.concatenate([old_ids.astype(str), src.ids.astype(str)])
        else:
            out["ids"] = da.concatenate([old_ids, src.ids.astype(old_ids.dtype)])
    return out


def stage_export(
    cfg: Any,
    ing: IngestResult,
    base: dict[str, Any],
    drift: dict[str, Any],
    solved: SolveResult,
    projected: ProjectResult,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The new run's manifest (last, atomically), with its ``update`` record."""
    lineage = list(base["lineage"]) + [
        entry_record(
            ing.store,
            n_rows=int(ing.n_rows),
            fingerprint=ing.fingerprint,
            run=run_layout(cfg).out.url,
        )
    ]
    record = {
        "base": base["path"],
        "base_created": base["created"],
        "version": int(base["version"]) + 1,
        "action": drift["action"],
        "reason": drift["reason"],
        "drifted": drift["drifted"],
        "flagged": drift["flagged"],
        "batch_rows": int(ing.n_rows),
        "n_rows": int(projected.rows),
        "rows": lineage,
        "report": f"{UPDATE}/{DRIFT_REPORT}",
        "changes": solved.info.get("changes") or {},
        "findings": drift.get("findings") or [],
    }
    ing_d = {k: v for k, v in ing.to_dict().items() if k != "storage_options"}
    if base.get("features"):  # the new run's features are the base's, matched by name
        ing_d["features"] = base["features"]
    return write_manifest(
        run_layout(cfg).out,
        config=cfg.to_json_dict(),
        ingest=ing_d,
        model={**solved.info, "path": MODEL},
        timings=timings,
        extra={"update": record, "kernel_store": None, "evaluation": None, "denoise": None},
    )


#: the update stage's config slice: the fit's (pipeline/fitspec.py) and the kernel policy
_UPDATE_FIELDS = config_slice(*FIT_FIELDS, "update.kernel_params")

UPDATE_REGISTRY = Registry(
    [
        replace(INGEST, doc="the batch -> work/ingest.zarr, validated and fingerprinted"),
        Stage(
            "base",
            stage_base,
            config=("update.base", "update.base_storage_options"),
            result="base",
            doc="verify the base run; its lineage of row stores",
        ),
        Stage(
            "drift",
            stage_drift,
            inputs=("ing", "base"),
            result="drift",
            config=("update", "solver.random_state"),
            publishes=(UPDATE,),
            doc="drift report of the batch against the training rows; the action",
        ),
        Stage(
            "update",
            stage_update,
            inputs=("ing", "base", "drift"),
            result="solved",
            result_type=SolveResult,
            config=_UPDATE_FIELDS,
            publishes=(MODEL,),
            fingerprint=_fingerprint_solve,
            fresh=_fresh_solve,
            doc="merge the batch into the model (exact), or refit on every row",
        ),
        Stage(
            "project",
            stage_project,
            inputs=("ing", "base", "solved"),
            result="projected",
            result_type=ProjectResult,
            config=("update.reembed", "output.parquet"),
            publishes=(EMBEDDING, "spectrum", PARQUET, "split", "labels", "ids"),
            fingerprint=_fingerprint_project,
            fresh=_fresh_project,
            doc="the union's embedding: the base's rows and the batch's",
        ),
        Stage(
            "export",
            stage_export,
            inputs=("ing", "base", "drift", "solved", "projected"),
            result="manifest",
            config=tuple(PipelineConfig.model_fields),
            run_info=("timings",),
            publishes=("manifest.json",),
            doc="the manifest with the update record, written last and atomically",
        ),
    ]
)


def run_update(cfg: PipelineConfig) -> Any:
    """The update's stages in order on the current Dask client, holding the new run's
    lock (pipeline.run.run_pipeline with :data:`UPDATE_REGISTRY`)."""
    from .run import run_pipeline

    return run_pipeline(cfg, UPDATE_REGISTRY)
