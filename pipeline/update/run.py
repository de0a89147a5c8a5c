"""``kpca update RUN NEW_DATA``: a new run (version n+1) from a published run and a batch.

    ingest -> base -> drift -> update -> project -> export

The stages are a :class:`~pipeline.stages.Registry` like the full pipeline's, run by
the same machinery (:func:`pipeline.runner.run.run_pipeline`: the run lock, the publishing
transaction, resumable stages; the Prefect flow ``kpca_update`` walks the same
registry). The update's config is the base run's own (from its manifest) with
``input.path`` set to the batch, ``output.path`` to the new run and ``update.base`` to
the base run (:func:`update_config`).

* ``ingest``: the batch -> ``<new>/work/ingest.zarr`` (the full pipeline's stage).
* ``base``: verifies the base run (manifest, checksums) and reads its lineage: the
  ingest stores holding every row the base has seen, training rows marked.
* ``drift``: the drift report of the batch against a seeded sample of the training rows
  (landmarks excluded) under the base model (pipeline/update/drift_report.py), and the
  action the policy chooses; written to ``<new>/update/drift.json`` and logged in one line.
* ``update``: ``merge`` adds the batch's sufficient statistics to the base model's
  (exact: equals a fit on all rows with the same landmarks, reads only the batch);
  ``refresh_landmarks`` / ``refit`` fit again on every row of the lineage.
* ``project``: the union's embedding, row-chunked like the base's: after a merge the
  base's embedding rows are copied and the batch's appended (``update.reembed``: every
  row embedded again); after a refit every row is embedded again. Row arrays (split,
  labels, ids) and the Parquet copy follow.
* ``export``: the manifest, with an ``update`` record: base, version, lineage, the
  drift summary, the action and why.

The stages live by concern: update_setup.py (the update's config), update_lineage.py
(``base``: the base run and its rows), update_drift.py (``drift``), update_model.py
(``update``), update_project.py (``project``); the ``export`` stage and the registry are
here, and ``pipeline.update.run`` is where every name is imported from.

The base run is only read, never written: the new run goes to another folder, which
must not overlap it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.data.ingest import IngestResult
from pipeline.model.fitspec import FIT_FIELDS
from pipeline.output import (
    DRIFT_REPORT,
    EMBEDDING,
    MODEL,
    PARQUET,
    UPDATE,
    Location,
    array_checksum,
    entry_record,
    lineage_needs,
    public_options,
    run_layout,
    verify_entry,
    write_holds,
    write_manifest,
)
from pipeline.runner.results import ProjectResult, SolveResult
from pipeline.series.rows import hold_own_rows
from pipeline.stages import (
    INGEST,
    Registry,
    Stage,
    _fingerprint_project,
    _fingerprint_solve,
    _fresh_project,
    _fresh_solve,
    config_slice,
)
from pipeline.update.base import stage_base
from pipeline.update.drift import stage_drift
from pipeline.update.model import stage_update
from pipeline.update.project import stage_project
from pipeline.update.setup import (
    UpdateError,
    default_output,
    latest_run,
    update_config,
)

__all__ = [
    "UPDATE_REGISTRY",
    "UpdateError",
    "default_output",
    "latest_run",
    "run_update",
    "update_config",
]


def stage_export(
    cfg: Any,
    ing: IngestResult,
    base: dict[str, Any],
    drift: dict[str, Any],
    solved: SolveResult,
    projected: ProjectResult,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The new run's manifest (last, atomically), with its ``update`` record: the lineage
    (its training mask re-pointed to this run's own ``split``) and the holds it keeps on
    the outputs that lineage names (pipeline/output/lineage.py)."""
    layout = run_layout(cfg)
    lineage = _own_split(
        layout.out,
        list(base["lineage"])
        + [
            entry_record(
                ing.store,
                n_rows=int(ing.n_rows),
                fingerprint=ing.fingerprint,
                run=layout.out.url,
                source=cfg.update.batch,  # the batch's identity: merged once (series/)
            )
        ],
    )
    holds = _hold(layout.root, lineage)
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
        "holds": holds,
        "batch": cfg.update.batch,
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


def _own_split(out: Location, lineage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lineage with every training mask read from this run's own ``split`` (the base's
    rows' flags then the batch's, pipeline/update/project.py) at the entry's rows
    (``split_rows``): a later update never reads an earlier night's version for it."""
    g = out.open_group("r")
    if "split" not in g:
        return lineage
    checksum = array_checksum(g["split"])
    opts = public_options(out.storage_options, "the lineage's options")
    entries, lo = [], 0
    for e in lineage:
        hi = lo + int(e["n_rows"])
        if e.get("split_run"):
            e = {k: v for k, v in e.items() if k != "split_absent"}
            e.update(
                split_run=out.url,
                split_storage_options=opts,
                split_checksum=checksum,
                split_rows=[lo, hi],
            )
        entries.append(e)
        lo = hi
    return entries


def _hold(root: Location, lineage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hold, in every other output the lineage names, the versions and rows it needs --
    this run's and the published version's of this output (released at the next publish)
    -- then check that each entry's rows are still there (a base re-run meanwhile is one
    line, nothing published). Returns the outputs held, to be released by the next
    publish of this output."""
    from pipeline.output import read_pointer

    try:
        published = ((read_pointer(root) or {}).get("update")) or {}
    except Exception:  # noqa: BLE001 - an unreadable pointer: nothing of it to keep
        published = {}
    needs = lineage_needs(lineage)
    for url, n in lineage_needs(list(published.get("rows") or [])).items():
        have = needs.setdefault(url, {"location": n["location"], "versions": set(), "rows": {}})
        have["versions"] |= n["versions"]
        have["rows"].update(n["rows"])
    held = write_holds(root, needs, tuple(published.get("holds") or ()))
    hold_own_rows(root, lineage, list(published.get("rows") or []))  # a series' own rows
    for entry in lineage:  # held now: still the rows the run read?
        verify_entry(entry)
    return [
        {
            "url": url,
            "storage_options": public_options(
                needs[url]["location"].storage_options, "the lineage's options"
            ),
        }
        for url in held
    ]


#: the update stage's config slice: the fit's (pipeline/model/fitspec.py) and the kernel policy
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
    lock (pipeline.runner.run.run_pipeline with :data:`UPDATE_REGISTRY`)."""
    from pipeline.runner.run import run_pipeline

    return run_pipeline(cfg, UPDATE_REGISTRY)
