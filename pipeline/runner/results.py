"""Typed stage results: what each stage of the registry (pipeline/stages/) returns.

Frozen dataclasses that carry their stores as :class:`~pipeline.output.store.Location` (URL
and storage options), so a later stage reopens a store exactly as it was written. Their
JSON form (``to_dict``; ``from_dict`` inverts it exactly) is what the Prefect tasks pass
and persist and what the cache keys hash: a location is flat in it, as ``path`` and
``storage_options``. The registry converts between the two forms in one place
(:meth:`pipeline.stages.Stage.__call__`); the stage functions see only these types.

The optional fields set to None are left out of the JSON form (the flow's
``fingerprint`` adds them: content checksums for the cache keys and freshness checks).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from pipeline.data.ingest import IngestResult
from pipeline.output import Location

__all__ = [
    "IngestResult",
    "KernelResult",
    "ProjectResult",
    "SolveResult",
    "SplitResult",
    "from_json",
    "to_json",
]


def _put_location(d: dict[str, Any], loc: Location | None) -> None:
    if loc is not None:
        d["path"] = loc.url
        d["storage_options"] = dict(loc.storage_options)


def _take_location(d: dict[str, Any]) -> Location | None:
    if "path" not in d:
        return None
    return Location(d.pop("path"), dict(d.pop("storage_options", None) or {}))


class _Flat:
    """A descriptor whose JSON form is its fields, flat; its Location field (named by
    ``LOCATION``) as ``path`` + ``storage_options``; None-valued optional fields left out."""

    LOCATION: ClassVar[str | None] = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.name == self.LOCATION:
                _put_location(d, v)
            elif v is not None or f.default is not None:
                d[f.name] = copy.deepcopy(v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        d = copy.deepcopy(dict(d))
        if cls.LOCATION is not None:
            d[cls.LOCATION] = _take_location(d)
        return cls(**d)


@dataclass(frozen=True)
class SplitResult(_Flat):
    """The split stage: which rows are held out (the mask is ``<out>/split``)."""

    held_out: bool
    n_train: int
    n_test: int
    split_id: str
    checksums: dict[str, str] | None = None
    #: the scaling fitted on the training rows (kpca_dask.preprocess.Scaler.to_dict)
    preprocess: dict[str, Any] | None = None


@dataclass(frozen=True)
class KernelResult(_Flat):
    """The kernel stage's plan and, when the kernel is materialised, its store."""

    LOCATION: ClassVar[str | None] = "store"

    materialized: bool
    reason: str
    solver: str
    block_rows: int
    store: Location | None = None
    n: int | None = None
    n_blocks: int | None = None
    computed: int | None = None
    skipped: int | None = None
    bytes_written: int | None = None
    dtype: str | None = None
    kernel: dict[str, Any] | None = None
    seconds: float | None = None
    gamma: float | None = None


@dataclass(frozen=True)
class SolveResult:
    """The solve stage: the saved model's location and the solver's report (``info``:
    pipeline/model/solve.py decides its keys; flat beside ``path`` in the JSON form)."""

    model: Location
    info: dict[str, Any]
    model_checksums: dict[str, Any] | None = None

    #: the JSON keys that are not the solver's report
    OWN_KEYS: ClassVar[tuple[str, ...]] = ("path", "storage_options", "model_checksums")

    def to_dict(self) -> dict[str, Any]:
        d = copy.deepcopy(dict(self.info))
        _put_location(d, self.model)
        if self.model_checksums is not None:
            d["model_checksums"] = copy.deepcopy(self.model_checksums)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SolveResult:
        d = copy.deepcopy(dict(d))
        model = _take_location(d)
        if model is None:
            raise ValueError("a solve result names no model path")
        return cls(model=model, model_checksums=d.pop("model_checksums", None), info=d)


@dataclass(frozen=True)
class ProjectResult(_Flat):
    """The project stage: the embedding (``<out>/embedding``) and, with
    ``output.parquet``, its Parquet copy (``parquet``: where it was written)."""

    rows: int
    components: int
    seconds: float
    parquet: str | None = None
    checksums: dict[str, str] | None = None
    files: dict[str, str] | None = None


def to_json(value: Any) -> Any:
    """A stage result in its JSON form (a typed result's ``to_dict``; else as is)."""
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else value


def from_json(kind: type | None, value: Any) -> Any:
    """A stage result as ``kind`` (None: kept as JSON data; None stays None)."""
    if kind is None or value is None or isinstance(value, kind):
        return value
    return kind.from_dict(value)
