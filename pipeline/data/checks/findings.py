"""What the pre-start checks (pipeline/data/validate.py) report, and the helpers they share.

A :class:`Finding` is one line naming a problem and its fix; a :class:`Validation`
collects them with what was read; :class:`PrestartError` carries the errors to the CLI
(exit 2). :class:`Stop` ends a group of checks whose later steps would be meaningless.
Light on purpose: nothing here imports dask, zarr or Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.config import PipelineConfig
from pipeline.errors import UserError

from ..formats import infer_format

__all__ = [
    "SAMPLE_ROWS",
    "Finding",
    "PrestartError",
    "Stop",
    "Unreachable",
    "Validation",
    "input_format",
    "is_numeric",
    "open_fs",
    "short",
    "unreachable",
]

#: rows of a table (or NPY file) read to check types and the NaN policy
SAMPLE_ROWS = 200


@dataclass(frozen=True)
class Finding:
    """One result of a pre-start check: ``check`` names it, ``message`` is one line."""

    check: str  # input, format, columns, label, id, types, nonfinite, evaluate, output, run
    message: str
    level: Literal["error", "note"] = "error"
    #: the store or network did not answer (not the user's input): re-running may pass,
    #: so a run stopped by such findings alone exits 1, not 2 (flows/cli/exits.py)
    transient: bool = False

    def __str__(self) -> str:
        return self.message


class PrestartError(UserError, ValueError):
    """The pre-start checks found problems; ``findings`` holds every error (one line each).

    (Not pydantic's ``ValidationError``: that one is about a config built in code.)"""

    def __init__(self, findings: list[Finding]):
        self.findings = [f for f in findings if f.level == "error"]
        super().__init__("\n".join(f.message for f in self.findings))

    @property
    def transient(self) -> bool:
        """Every error is a store or network that did not answer (exit 1, not 2)."""
        return bool(self.findings) and all(f.transient for f in self.findings)


@dataclass
class Validation:
    """What the checks found, and what they read (for the summary line)."""

    findings: list[Finding] = field(default_factory=list)
    format: str | None = None
    features: list[str] = field(default_factory=list)
    shape: tuple[int, ...] | None = None  # NPY/zarr: the whole array's; tables: the sample's
    sample_rows: int = 0
    #: the full pass (pipeline/data/scan.py): whether to make it, and what it found
    full: bool = True
    rows: int | None = None
    scan_seconds: float = 0.0
    id_type: str | None = None
    droppable_rows: int = 0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "note"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self) -> None:
        if self.errors:
            raise PrestartError(self.errors)

    def summary(self, cfg: PipelineConfig) -> str:
        what = f"{len(self.features)} feature columns" if self.features else "features"
        if self.shape is not None and self.format in ("npy", "zarr"):
            what = f"{self.shape[0]} rows x {self.shape[1]} features"
        if self.rows is not None:
            what = (
                f"{self.rows} rows x {len(self.features)} feature columns, every row read in "
                f"{self.scan_seconds:.1f} s"
            )
            if self.id_type:
                what += f", ids {self.id_type} and unique"
            if self.droppable_rows:
                what += f", {self.droppable_rows} rows with NaN/inf to drop"
        elif self.sample_rows:
            what += f" (checked on the first {self.sample_rows} rows)"
        return f"{cfg.input.path} ({self.format}): {what}; output {cfg.output.path} writable"


class Stop(UserError):
    """A check failed in a way that makes the later checks meaningless; its message is
    the finding (pipeline/data/validate.py records it, it never leaves the checks)."""


class Unreachable(Stop):
    """A Stop because the store or network did not answer (a 503, a timeout, a refused
    connection): not the user's input, so the finding is ``transient``."""


def unreachable(exc: BaseException) -> type[Stop]:
    """The Stop for a store that failed to answer with ``exc``: :class:`Unreachable` for a
    network or server failure (re-running may pass), a plain :class:`Stop` for the rest
    (credentials, permissions, a missing bucket: the user's to fix)."""
    from pipeline.errors import is_transient

    return Unreachable if is_transient(exc) else Stop


def open_fs(path: str, options: dict[str, Any]):
    from fsspec.core import url_to_fs

    return url_to_fs(path, **options)


def short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def input_format(cfg: PipelineConfig, fs, fs_path: str) -> str | None:
    """The input format, as ``detect_format`` (pipeline/data/readers/) infers it."""
    if cfg.input.format != "auto":
        return cfg.input.format
    return infer_format(cfg.input.path, fs, fs_path)


def is_numeric(dtype) -> bool:
    import pandas as pd

    try:
        return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_complex_dtype(dtype)
    except TypeError:
        return False
