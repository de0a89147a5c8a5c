"""The ``base`` stage of ``kpca update`` (pipeline/update/run.py): the base run verified and its
lineage, the ingest stores holding every row it has seen (pipeline/output/lineage.py), and the
rows read from them: the training rows, every row, a seeded reference sample."""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from pipeline.config import ConfigError, absolute_path
from pipeline.output import (
    MODEL,
    Location,
    entry_record,
    entry_rows,
    entry_split,
    open_run,
    rows_location,
    run_layout,
    verify_entry,
)
from pipeline.series.merged import check_base_current
from pipeline.update.setup import _version


def _lineage(base: Location, manifest: dict) -> list[dict[str, Any]]:
    """The ingest stores holding every row of the base run, in embedding order; each
    with its row count, the options to read it, its fingerprint and digests record, and
    whether a ``split`` mask (1 = training) of the run marks its training rows
    (pipeline/output/lineage.py). Each entry is verified here (one line when its rows are not
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
        # where the first run's rows are now (its output may have rebuilt the store
        # since, keeping them: a series' next night), so the digests are theirs
        found = rows_location(
            {
                "store": absolute_path(inp["path"]),
                "storage_options": dict(base.storage_options),
                "fingerprint": inp.get("fingerprint"),
            }
        )
        lineage = [
            entry_record(
                found,
                n_rows=int(inp["n_rows"]),
                fingerprint=inp.get("fingerprint"),
                split_run=base if split else None,
                split_checksum=manifest["checksums"].get("split") if split else None,
                split_absent=((manifest.get("integrity") or {}).get("absent_chunks") or {}).get(
                    "split"
                ),
                run=base.url,  # the version whose rows these are (held by later updates)
            )
        ]
    for entry in lineage:
        # where the rows are now: the recorded store, or the copy its output kept when it
        # rebuilt that store with other rows (pipeline/output/lineage.py); recorded as found
        entry["store"] = rows_location(entry).url
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
    # a series (the base is a version of this output): still the published one?
    check_base_current(run_layout(cfg).root, base.url)
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
