"""Reading back what earlier stages wrote: the ingested rows and the held-out split.

Shared by the stage functions (pipeline/stages.py) and the denoise stage; it knows the
run-folder layout (pipeline/layout.py) and the ingest store, nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ingest import IngestResult, SourceData, load_ingested
from .layout import RunLayout

__all__ = ["ingested", "read_split"]


def ingested(ing: dict[str, Any]) -> tuple[IngestResult, SourceData]:
    """The ingest stage's descriptor and the ingested arrays it names (lazy)."""
    res = IngestResult.from_dict(ing)
    return res, load_ingested(res)


def read_split(layout: RunLayout, split: dict[str, Any]) -> np.ndarray | None:
    """The split stage's mask (1 = training row), or None when no rows are held out."""
    if not split.get("held_out"):
        return None
    g = layout.out.open_group("r")
    return np.asarray(g["split"][...])
