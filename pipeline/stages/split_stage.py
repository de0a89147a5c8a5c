"""The split stage: held-out rows for evaluation (labelled input), labels/ids/split next
to the embedding, and the feature scaling fitted on the training rows."""

from __future__ import annotations

import hashlib
from typing import Any

import dask.array as da
import numpy as np

from pipeline.data.ingest import IngestResult
from pipeline.data.scaling import fit_training_scaler
from pipeline.data.stage_data import ingested
from pipeline.output import ROW_ARRAYS, run_layout
from pipeline.runner.registry import Stage
from pipeline.runner.results import SplitResult

from ..evaluate import make_split
from .common import _store_array, checksums, evaluation_wanted

__all__ = ["SPLIT", "stage_split"]


def stage_split(cfg: Any, ing: IngestResult) -> SplitResult:
    """Held-out rows for evaluation (seeded), and labels/ids/split next to the embedding."""
    res, src = ingested(ing)
    g = run_layout(cfg).out.open_group("a")
    rows = src.X.chunks[0]
    mask = None
    if evaluation_wanted(cfg, res):
        # stratified by class, seeded by evaluate.random_state (labels are n ints)
        mask = make_split(
            np.asarray(src.labels.compute()),
            cfg.evaluate.test_fraction,
            random_state=cfg.evaluate.random_state,
            stratify=cfg.evaluate.stratify,
        )
        _store_array(g, "split", da.from_array(mask, chunks=rows), rows)
    elif "split" in g:
        del g["split"]
    for name, arr in (("labels", src.labels), ("ids", src.ids)):
        if arr is not None:
            _store_array(g, name, arr, rows)
        elif name in g:
            del g[name]
    if src.labels is not None:
        g["labels"].attrs["classes"] = src.classes
    split_id = (
        "all" if mask is None else hashlib.blake2b(mask.tobytes(), digest_size=8).hexdigest()
    )
    n_train = res.n_rows if mask is None else int(mask.sum())
    # the scaling sees the training rows only: held-out rows never move its statistics
    X_train = src.X if mask is None else src.X[mask.astype(bool)]
    pre = fit_training_scaler(cfg.preprocess.scale, X_train, res.columns)
    return SplitResult(
        held_out=mask is not None,
        n_train=n_train,
        n_test=res.n_rows - n_train,
        split_id=split_id,
        preprocess=pre,
    )


def _fingerprint_split(cfg: Any, res: dict) -> dict:
    return {**res, "checksums": checksums(run_layout(cfg).out.open_group("r"), ROW_ARRAYS)}


def _fresh_split(cfg: Any, inputs: dict, res: dict) -> str | None:
    if checksums(run_layout(cfg).out.open_group("r"), ROW_ARRAYS) != res.get("checksums"):
        return "labels/ids/split next to the embedding changed"
    return None


SPLIT = Stage(
    "split",
    stage_split,
    inputs=("ing",),
    result="split",
    result_type=SplitResult,
    config=(
        "evaluate.enabled",
        "evaluate.test_fraction",
        "evaluate.random_state",
        "evaluate.stratify",
        "preprocess",
    ),
    publishes=ROW_ARRAYS,
    fingerprint=_fingerprint_split,
    fresh=_fresh_split,
    doc="held-out rows (labelled input), labels/ids/split next to the embedding; "
    "the feature scaling fitted on the training rows",
)
