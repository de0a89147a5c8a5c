"""The series' hold on its own rows.

Each night ingests its batch into the output's ``work/ingest.zarr``; the next night
rebuilds that store with its own batch. Holds written by other outputs keep rows through
such a rebuild (pipeline/data/ingest_store.py: ``keep_held_rows`` copies them to
``work/ingest/<fingerprint>.zarr`` first, hard links on local disk); an output never
holds itself there (pipeline/output/lineage.py ``write_holds``). So a series writes one
more hold in its own ``holds/`` folder, naming the rows (fingerprints) its lineage reads
from its own ``work/`` and no version: the rows stay while the series needs them (every night's
lineage needs every earlier night's rows), and retention of the series' versions stays
``output.keep_versions``'s.
"""

from __future__ import annotations

import datetime
from typing import Any

from pipeline.output import Location, atomic_write_json, hold_file, lineage_needs

__all__ = ["OWN_ROWS", "hold_own_rows"]

#: the holder name of the series' own hold: ``<out>#rows``
OWN_ROWS = "#rows"


def hold_own_rows(root: Location, *lineages: list[dict[str, Any]]) -> bool:
    """Write (atomically) the output's hold on the rows of its own ``work/`` that the
    lineages name; nothing when they name none (a run whose rows are all elsewhere).
    Returns whether a hold was written."""
    me = root.url.rstrip("/")
    rows: dict[str, str] = {}
    for lineage in lineages:
        n = lineage_needs(list(lineage or [])).get(me)
        if n is not None:
            rows.update(n["rows"])
    if not rows:
        return False
    atomic_write_json(
        hold_file(root, me + OWN_ROWS),
        {
            "written_by": "kpca-dask",
            "kind": "hold",
            "holder": me + OWN_ROWS,
            "versions": [],
            "rows": [{"fingerprint": fp, "store": st} for fp, st in sorted(rows.items())],
            "updated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
    )
    return True
