"""A series: one output that every night publishes a new version of (issue 37).

``kpca update OUT NEW_DATA`` (and the nightly deployment) adds each batch of new rows to
the output ``OUT`` itself: the batch's update is published as a new version of ``OUT``
(the transaction of every writer, pipeline/output/versions.py: one atomic write of the pointer,
history, retention, holds, recovery), its base being the version published before. Readers
keep one address: ``OUT/manifest.json`` names the latest published night.

* :mod:`.batches`: what ``NEW_DATA`` names (a file, a folder or prefix, a glob, a template
  on the run's logical date), oldest first, and each batch's identity (content digest,
  size, ETag / object version where the store has them).
* :mod:`.merged`: which batches the series has merged (the lineage records each one's
  identity), so a batch is merged exactly once.
* :mod:`.rows`: the series' hold on its own rows (each night's ingest store), so the
  rebuild of ``work/ingest.zarr`` by the next night keeps them.
* :mod:`.night`: one night: every pending batch, oldest first, one version each.

docs/update.md ("A series is one output") is the user's view.
"""

from __future__ import annotations

from .batches import Batch, batch_identity, pending_batches, resolve_batches
from .merged import BatchAlreadyMerged, check_base_current, merged_by, merged_sources
from .rows import hold_own_rows

__all__ = [
    "Batch",
    "BatchAlreadyMerged",
    "batch_identity",
    "check_base_current",
    "hold_own_rows",
    "merged_by",
    "merged_sources",
    "pending_batches",
    "resolve_batches",
]
