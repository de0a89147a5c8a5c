"""Reading back what earlier stages wrote: the ingested rows and the held-out split.

Shared by the stage functions (pipeline/stages/) and the denoise stage; it knows the
run-folder layout (pipeline/output/layout.py) and the ingest store, nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.output import RunLayout
from pipeline.runner.results import SplitResult, from_json

from .ingest import IngestResult, SourceData, load_ingested

__all__ = ["ingested", "read_split"]


def ingested(ing: IngestResult | dict[str, Any]) -> tuple[IngestResult, SourceData]:
    """The ingest stage's descriptor and the ingested arrays it names (lazy; the store
    opened with the storage options the descriptor carries)."""
    res = from_json(IngestResult, ing)
    return res, load_ingested(res)


def read_split(layout: RunLayout, split: SplitResult | dict[str, Any]) -> np.ndarray | None:
    """The split stage's mask (1 = training row), or None when no rows are held out."""
    if not from_json(SplitResult, split).held_out:
        return None
    g = layout.out.open_group("r")
    return np.asarray(g["split"][...])
