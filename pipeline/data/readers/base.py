"""What every reader shares: :class:`InputError`, :class:`SourceData`, the format and
existence checks of the configured source, and the row-chunk size."""

from __future__ import annotations

from dataclasses import dataclass

import dask.array as da
import numpy as np

from pipeline.config import InputConfig
from pipeline.errors import UserError
from pipeline.output import Location

from ..features import Selection
from ..formats import infer_format

__all__ = [
    "InputError",
    "SourceData",
    "check_exists",
    "check_matrix_dtype",
    "detect_format",
    "rows_per_chunk",
]


class InputError(UserError, ValueError):
    """The input cannot be used as it is; the message names the problem and the fix."""


@dataclass
class SourceData:
    """Lazy arrays read from a source."""

    X: da.Array
    columns: list[str]
    labels: da.Array | None = None
    classes: list[str] | None = None
    ids: da.Array | None = None
    #: how the feature columns were chosen (tables only; pipeline/data/features.py)
    selection: Selection | None = None


def detect_format(cfg: InputConfig) -> str:
    if cfg.format != "auto":
        return cfg.format
    loc = Location(cfg.path, cfg.storage_options)
    fmt = infer_format(cfg.path, loc.fs, loc.fs_path)
    if fmt is not None:
        return fmt
    raise InputError(
        f"cannot infer the format of {cfg.path!r} from its name; set input.format to one of "
        "npy, csv, parquet, zarr."
    )


def check_exists(cfg: InputConfig) -> Location:
    loc = Location(cfg.path, cfg.storage_options)
    try:
        ok = loc.exists()
    except ImportError as exc:  # e.g. s3fs missing
        raise InputError(
            f"cannot open {cfg.path!r}: {exc} (install the fsspec backend for this "
            "URL scheme, e.g. `pip install s3fs`)."
        ) from exc
    if not ok:
        raise InputError(f"input {cfg.path!r} does not exist; check input.path.")
    return loc


def rows_per_chunk(n_features: int, target_mb: float) -> int:
    return max(1, int(target_mb * 1e6 // (max(1, n_features) * 8)))


def check_matrix_dtype(dtype, path) -> None:
    dtype = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    if dtype.kind == "c":
        raise InputError(f"{path}: complex values; kernel PCA needs real numbers.")
    if dtype.kind not in "fiub":
        raise InputError(
            f"{path}: dtype {dtype} is not numeric; store numbers (encode "
            "categorical columns first)."
        )
