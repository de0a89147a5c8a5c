"""What ``kpca update`` checks and records before a batch's update starts (called by
pipeline/update/setup.py ``update_config``): the batch's identity, refused as a no-op when
the series merged it already, and -- for an update published as a new version of the
base's own output -- the series' hold on its rows, written before the ingest stage
rebuilds ``work/ingest.zarr`` with the batch."""

from __future__ import annotations

from typing import Any

from pipeline.output import Location

from .batches import batch_identity
from .merged import BatchAlreadyMerged, merged_by
from .rows import hold_own_rows

__all__ = ["base_lineage", "prepare_batch"]


def base_lineage(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a published run's lineage names (stores and fingerprints only): its
    ``update.rows``, or for a first run its own ingest store."""
    rows = (manifest.get("update") or {}).get("rows")
    if rows:
        return [dict(r) for r in rows]
    inp = manifest.get("input") or {}
    if not inp.get("path"):
        return []
    return [{"store": inp["path"], "fingerprint": inp.get("fingerprint")}]


def prepare_batch(
    base: Location,
    manifest: dict[str, Any],
    new_data: str,
    input_options: dict[str, Any] | None,
    *,
    in_place: bool,
) -> dict[str, Any]:
    """The batch's identity (:func:`batch_identity`); BatchAlreadyMerged when the base's
    lineage records it. ``in_place``: hold the base output's own rows first."""
    identity = batch_identity(new_data, input_options)
    version = merged_by(manifest, identity)
    if version is not None:
        raise BatchAlreadyMerged(new_data, version, base.url)
    if in_place:
        lineage = base_lineage(manifest)
        for e in lineage:
            e.setdefault("storage_options", dict(base.storage_options))
        hold_own_rows(base, lineage)
    return identity
