"""What the evaluate stage reads from a run folder: embedding, labels, split, features.

:func:`open_run_folder` checks the arrays agree (or says why evaluation is
skipped); :class:`RunFolder` opens them lazily and reads sampled rows chunk by
chunk.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np

from pipeline.output import Location

from ..config import EvaluateConfig
from ..errors import EvaluationError

__all__ = ["RunFolder", "open_run_folder", "read_rows", "sample_indices", "as_location"]


def as_location(out_dir: Any) -> Location:
    if isinstance(out_dir, Location):
        return out_dir
    return Location(str(out_dir))


def sample_indices(n: int, m: int, seed: int, within: np.ndarray | None = None) -> np.ndarray:
    """Sorted seeded sample of at most ``m`` row indices (of ``within`` if given)."""
    pool = np.arange(n) if within is None else np.asarray(within)
    if pool.size <= m:
        return pool
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(pool, size=m, replace=False))


def read_rows(z: Any, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` (sorted) of a zarr array, reading only the chunks that hold them."""
    if idx.size == 0:
        return np.empty((0,) + tuple(z.shape[1:]), dtype=z.dtype)
    return np.asarray(z.oindex[(idx,) + (slice(None),) * (len(z.shape) - 1)])


@dataclass
class RunFolder:
    """What the evaluate stage reads from a run folder (zarr arrays, opened lazily)."""

    loc: Location
    root: Any  # the run's zarr group
    z_emb: Any
    z_lab: Any
    classes: list[str]
    split: np.ndarray  # bool, True = training row (1 byte per row)
    emb: da.Array
    labels: da.Array
    timings: dict[str, float] = field(default_factory=dict)
    _z_X: Any = None

    @property
    def n(self) -> int:
        return int(self.z_emb.shape[0])

    @property
    def k(self) -> int:
        return int(self.z_emb.shape[1])

    @property
    def train_idx(self) -> np.ndarray:
        return np.flatnonzero(self.split)

    @property
    def test_idx(self) -> np.ndarray:
        return np.flatnonzero(~self.split)

    @property
    def z_X(self) -> Any:
        """The ingested features ``<out>/work/ingest.zarr/X``, checked against the rows."""
        if self._z_X is None:
            ingest_loc = _work_of(self.loc).child("ingest.zarr")
            try:
                z_X = ingest_loc.open_group("r")["X"]
            except Exception as exc:
                raise EvaluationError(
                    f"the linear PCA baseline reads the ingested features from "
                    f"{ingest_loc}/X, which cannot be opened ({exc}); keep the work "
                    "folder until evaluate has run"
                ) from exc
            if int(z_X.shape[0]) != self.n:
                raise EvaluationError(
                    f"{ingest_loc}/X has {z_X.shape[0]} rows but the "
                    f"embedding has {self.n}; the run folder is inconsistent"
                )
            self._z_X = z_X
        return self._z_X

    @contextlib.contextmanager
    def timed(self, step: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        self.timings[step] = time.perf_counter() - t


def _work_of(loc: Location) -> Location:
    """The ``work/`` folder of the run whose arrays are at ``loc``: beside the arrays, or
    -- ``loc`` a version of an output (``<out>/versions/<id>``) -- at the output's root."""
    url = loc.url.rstrip("/")
    head, _, _vid = url.rpartition("/")
    parent, _, name = head.rpartition("/")
    if name == "versions" and parent:
        return Location(parent, loc.storage_options).child("work")
    return loc.child("work")


def open_run_folder(loc: Location, cfg: EvaluateConfig) -> RunFolder | str:
    """The run's embedding, labels and split, checked; or why evaluation is skipped."""
    try:
        root = loc.open_group("r")
    except Exception as exc:
        raise EvaluationError(
            f"{loc} is not a readable run folder (zarr group): {exc}"
        ) from exc
    # Membership tests look names up directly; listing the group would trip over
    # the plain work/ folder beside the arrays.
    if "embedding" not in root:
        raise EvaluationError(
            f"{loc} has no 'embedding' array; run the pipeline's project stage before evaluate"
        )
    if "labels" not in root:
        if cfg.enabled == "auto":
            return "the input has no label column"
        raise EvaluationError(
            f"evaluate.enabled is true but {loc} has no 'labels' array; set "
            "input.label_column, or set evaluate.enabled to 'auto' or false"
        )
    if "split" not in root:
        if cfg.enabled == "auto":
            return "the run holds out no rows (no 'split' array)"
        raise EvaluationError(
            f"{loc} has no 'split' array: held-out evaluation needs rows "
            "held out before fitting (the pipeline writes <out>/split when "
            "evaluation is enabled and labels exist)"
        )

    z_emb, z_lab, z_split = root["embedding"], root["labels"], root["split"]
    n = int(z_emb.shape[0])
    classes = [str(c) for c in z_lab.attrs.get("classes", [])]
    if z_lab.shape != (n,) or z_split.shape != (n,):
        raise EvaluationError(
            f"embedding has {n} rows but labels has shape {z_lab.shape} and "
            f"split {z_split.shape}; the run folder is inconsistent (re-run "
            "the project stage)"
        )
    split = np.asarray(z_split[...]).astype(bool)
    n_train = int(split.sum())
    if n_train == 0 or n_train == n:
        raise EvaluationError(
            f"the split holds {n_train} training and {n - n_train} "
            "held-out rows; both must be non-empty (check "
            "evaluate.test_fraction)"
        )
    emb = da.from_zarr(z_emb)
    labels = da.from_zarr(z_lab).rechunk({0: emb.chunks[0]})
    if not classes:
        top = int(labels.max().compute())
        classes = [str(i) for i in range(top + 1)]
    return RunFolder(loc, root, z_emb, z_lab, classes, split, emb, labels)
