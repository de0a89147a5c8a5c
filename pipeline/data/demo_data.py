"""Demo datasets written as real files, in the formats the ingest stage reads.

Every table has an ``id`` column (int64), named feature columns and a
``label`` column, so a demo run exercises the whole pipeline, evaluation
included:

``digits``
    scikit-learn's 8x8 handwritten digits (1797 rows, 64 pixel columns
    ``pixel_<row>_<col>`` with values 0-16, labels 0-9; the UCI optical
    recognition test set, shipped inside scikit-learn, no download). The
    classic kernel PCA benchmark: a linear classifier on rbf kernel PCA
    features beats the same classifier on linear PCA features at the same
    number of components (see docs/evaluate.md for the numbers).
``circles``
    two noisy concentric circles (columns ``x``, ``y``; labels ``inner``,
    ``outer``): no line separates them, so linear PCA plus a linear
    classifier is at chance while the first rbf component separates them.
``moons``
    two interleaving half circles (``x``, ``y``; ``upper``, ``lower``).

:data:`DEMO_DATASETS` lists each with the kernel settings that show it off;
:func:`write_demo_data` writes them (CSV or Parquet) and returns their paths.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

__all__ = [
    "DemoDataset",
    "DEMO_DATASETS",
    "digits_frame",
    "circles_frame",
    "moons_frame",
    "demo_frame",
    "write_table",
    "write_demo_data",
    "write_demo_dataset",
]


@dataclass(frozen=True)
class DemoDataset:
    """A demo dataset and settings under which kernel PCA visibly beats linear PCA."""

    name: str
    description: str
    kernel: dict[str, Any]
    n_components: int
    label_column: str = "label"
    id_column: str = "id"
    extra: dict[str, Any] = field(default_factory=dict)
    #: preprocess.scale to run with: the gammas below are tuned on the raw values (one
    #: unit for every column: pixel intensities, plane coordinates), so no scaling
    scale: str = "none"


#: Settings checked in tests/pipeline/test_evaluate.py (digits) and
#: tests/pipeline/test_demo_data.py (circles, moons). The digits gamma is in
#: raw pixel units (0-16): 0.3 on pixels scaled to [0, 1] is 0.3 / 16**2.
DEMO_DATASETS: dict[str, DemoDataset] = {
    "digits": DemoDataset(
        "digits",
        "scikit-learn's 8x8 handwritten digits: 1797 images, 64 pixel intensities (0-16), "
        "10 classes",
        kernel={"name": "rbf", "gamma": 0.3 / 256},
        n_components=32,
    ),
    "circles": DemoDataset(
        "circles",
        "two noisy concentric circles in the plane (2 features, 2 classes)",
        kernel={"name": "rbf", "gamma": 2.0},
        n_components=2,
    ),
    "moons": DemoDataset(
        "moons",
        "two interleaving half circles in the plane (2 features, 2 classes)",
        kernel={"name": "rbf", "gamma": 15.0},
        n_components=4,
    ),
}


def digits_frame() -> pd.DataFrame:
    """scikit-learn's digits as a table: ``id``, ``pixel_0_0`` .. ``pixel_7_7``, ``label``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    cols = [f"pixel_{r}_{c}" for r in range(8) for c in range(8)]
    df = pd.DataFrame(d.data.astype(np.float64), columns=cols)
    df.insert(0, "id", np.arange(len(df), dtype=np.int64))
    df["label"] = d.target.astype(np.int64)
    return df


def circles_frame(
    n_samples: int = 1500, *, noise: float = 0.08, factor: float = 0.3, random_state: int = 0
) -> pd.DataFrame:
    """Two concentric circles: ``id``, ``x``, ``y``, ``label`` in {"inner", "outer"}."""
    from sklearn.datasets import make_circles

    X, y = make_circles(n_samples, noise=noise, factor=factor, random_state=random_state)
    return _plane_frame(X, np.where(y == 1, "inner", "outer"))


def moons_frame(
    n_samples: int = 1500, *, noise: float = 0.1, random_state: int = 0
) -> pd.DataFrame:
    """Two interleaving half circles: ``id``, ``x``, ``y``, ``label`` in {"upper", "lower"}."""
    from sklearn.datasets import make_moons

    X, y = make_moons(n_samples, noise=noise, random_state=random_state)
    return _plane_frame(X, np.where(y == 0, "upper", "lower"))


def _plane_frame(X: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": np.arange(X.shape[0], dtype=np.int64),
            "x": X[:, 0],
            "y": X[:, 1],
            "label": labels,
        }
    )


_FRAMES = {"digits": digits_frame, "circles": circles_frame, "moons": moons_frame}


def demo_frame(name: str, **kwargs: Any) -> pd.DataFrame:
    """The named demo table (``digits``, ``circles`` or ``moons``)."""
    try:
        make = _FRAMES[name]
    except KeyError:
        raise ValueError(
            f"unknown demo dataset {name!r}; choose one of {sorted(_FRAMES)}"
        ) from None
    return make(**kwargs)


def write_table(
    df: pd.DataFrame, path: str | Path, fmt: Literal["auto", "csv", "parquet"] = "auto"
) -> Path:
    """Write ``df`` as CSV or Parquet (``auto``: from the suffix), atomically.

    The file is written beside its target and renamed into place, so an
    ingest that starts meanwhile never reads half a file.
    """
    path = Path(path)
    if fmt == "auto":
        suffix = path.suffix.lower()
        if suffix == ".csv":
            fmt = "csv"
        elif suffix in (".parquet", ".pq"):
            fmt = "parquet"
        else:
            raise ValueError(
                f"cannot tell the format of {path} from its suffix; use .csv or "
                ".parquet, or pass fmt='csv' / fmt='parquet'"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        elif fmt == "parquet":
            df.to_parquet(tmp, index=False)
        else:
            raise ValueError(f"fmt must be 'auto', 'csv' or 'parquet'; got {fmt!r}")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def write_demo_data(
    folder: str | Path,
    names: tuple[str, ...] | list[str] = ("digits",),
    *,
    fmt: Literal["csv", "parquet"] = "parquet",
) -> dict[str, Path]:
    """Write demo datasets into ``folder`` as ``<name>.csv`` or ``<name>.parquet``.

    Returns name -> path. Settings to run them with are in :data:`DEMO_DATASETS`.

    Examples
    --------
    >>> import tempfile
    >>> paths = write_demo_data(tempfile.mkdtemp(), ["circles"], fmt="csv")
    >>> paths["circles"].name
    'circles.csv'
    """
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"fmt must be 'csv' or 'parquet'; got {fmt!r}")
    folder = Path(folder)
    return {
        name: write_table(demo_frame(name), folder / f"{name}.{fmt}", fmt) for name in names
    }


def write_demo_dataset(
    folder: str | Path, name: str = "digits", *, fmt: Literal["csv", "parquet"] = "parquet"
) -> Path:
    """Write one demo dataset (default: digits) into ``folder``; return its path."""
    return write_demo_data(folder, [name], fmt=fmt)[name]
