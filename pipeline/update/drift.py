"""The ``drift`` stage of ``kpca update`` (pipeline/update/run.py): the drift report of the
batch against a seeded sample of the base run's training rows under the base model
(pipeline/update/drift_report.py), what the batch brings that the checks do not measure
(findings), and
the action the policy chooses; written to ``<new>/update/drift.json``."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from pipeline.data.ingest import IngestResult, load_ingested
from pipeline.output import DRIFT_REPORT, UPDATE, atomic_write_json, run_layout
from pipeline.update.base import _base_location, _load_base_model, _reference_rows, _sample
from pipeline.update.setup import UpdateError

logger = logging.getLogger("pipeline")


def stage_drift(cfg: Any, ing: IngestResult, base: dict[str, Any]) -> dict[str, Any]:
    """The drift report of the batch and the action; ``<new>/update/drift.json``."""
    from kpca_dask.solvers.landmarks import gather_rows
    from pipeline.update.drift_report import drift_report

    pol = cfg.update
    _check_columns(ing, base)
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
    action, why = _choose_action(report, pol, model, nys)
    report.update(action=action, reason=why, policy=pol.policy, base=base["path"])
    out = run_layout(cfg).out
    atomic_write_json(out.child(UPDATE, DRIFT_REPORT), report)
    _log_drift(report, action, why)
    return report


def _check_columns(ing: IngestResult, base: dict[str, Any]) -> None:
    """UpdateError naming the missing and extra columns when the batch's feature columns
    are not the base run's."""
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


def _choose_action(report: dict[str, Any], pol: Any, model: Any, nys: bool) -> tuple[str, str]:
    """The action the policy chooses for the report (pipeline/update/drift_report.py
    ``decide``), and why;
    an exact model is refitted where a Nyström one would have its landmarks refreshed."""
    from kpca_dask.update import check_updatable
    from pipeline.update.drift_report import decide

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
    return action, why


def _log_drift(report: dict[str, Any], action: str, why: str) -> None:
    """The drift report's one log line, and one warning per finding."""
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
            if cfg.update.duplicate_ids == "refuse":
                raise UpdateError(
                    f"{int(seen.sum())} ids of the batch "
                    f"{(cfg.update.batch or {}).get('path', '')} are already in "
                    f"the series (e.g. {', '.join(map(repr, examples[:3]))}; batch row "
                    f"{first}); nothing published: ids are join keys. Remove them from the "
                    "batch, or set update.duplicate_ids: keep to add the rows anyway."
                )
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
