"""The ingest stage: input -> ``work/ingest.zarr``, validated and fingerprinted (shared
by the full run and by ``kpca update``, pipeline/update/run.py)."""

from __future__ import annotations

from typing import Any

from pipeline.data.ingest import IngestResult, ingest, stale_ingest
from pipeline.output import run_layout
from pipeline.runner.registry import Stage

__all__ = ["INGEST", "stage_ingest"]


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
