"""Feature scaling as a fitted step of the model: statistics of the training rows,
stored with the model (JSON numbers, no pickle) and applied by every consumer.

``fit_scaler(X, method)`` reduces a dask (or numpy) array of training rows to one
centre and one scale per column:

* ``"standard"``: mean and standard deviation (population, ``ddof=0``: scikit-learn's
  :class:`~sklearn.preprocessing.StandardScaler`), one distributed pass (dask's
  moment reductions, combined pairwise over row blocks);
* ``"robust"``: median and inter-quartile range (25th to 75th percentile, linear
  interpolation: scikit-learn's :class:`~sklearn.preprocessing.RobustScaler`). Exact
  when one column of the training rows fits in one task (``n * 8`` bytes up to
  :data:`EXACT_QUANTILE_BYTES`, 128 MB: 16 million rows): the rows are regrouped into
  column blocks (one shuffle, each row block read once) and each block takes
  ``numpy.percentile``. Beyond that it is approximate: ``dask.array.percentile`` per
  column, which merges the quantiles of the row blocks (the error is bounded by how
  much the row blocks' quantiles differ; ``Scaler.exact`` says which);
* ``"none"``: the identity (the spread of every column is still measured, for the
  scale-spread warning).

A column whose spread is zero (constant on the training rows, to rounding) is scaled
by 1, as scikit-learn does, and listed in ``Scaler.constant``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np

from .exceptions import InvalidInputError

__all__ = [
    "EXACT_QUANTILE_BYTES",
    "METHODS",
    "SPREAD_WARN_RATIO",
    "Scaler",
    "fit_scaler",
    "spread_summary",
]

METHODS = ("none", "standard", "robust")

#: Robust scaling is exact while one column of the training rows (float64) fits this.
EXACT_QUANTILE_BYTES = 128 << 20

#: Columns whose spreads differ by more than this factor make an unscaled run warn.
SPREAD_WARN_RATIO = 1e3

_STATISTIC = {
    "none": "identity (spread: standard deviation)",
    "standard": "mean / standard deviation (ddof=0)",
    "robust": "median / inter-quartile range (25-75)",
}


@dataclass(frozen=True)
class Scaler:
    """A fitted scaling: ``(x - center) / scale`` per column, and back."""

    method: str
    center: np.ndarray
    scale: np.ndarray
    #: the measured spread per column (std, or IQR for robust), before the zero rule
    spread: np.ndarray
    n_rows: int
    #: columns with zero spread (scaled by 1)
    constant: tuple[int, ...] = ()
    #: robust: whether the quantiles are exact (False: merged per row block)
    exact: bool = True
    #: column names, when known (for messages)
    columns: tuple[str, ...] | None = field(default=None, compare=False)

    @property
    def n_features(self) -> int:
        return int(self.center.shape[0])

    @property
    def identity(self) -> bool:
        return self.method == "none"

    def transform(self, X: Any) -> Any:
        """``(X - center) / scale`` (numpy in, numpy out; dask in, lazy dask out), in
        X's float dtype (float64 for anything else)."""
        if self.identity:
            return X
        dtype = X.dtype if np.issubdtype(X.dtype, np.floating) else np.dtype(np.float64)
        c, s = self.center.astype(dtype), self.scale.astype(dtype)
        return ((X.astype(dtype, copy=False) - c) / s).astype(dtype, copy=False)

    def inverse_transform(self, Z: Any) -> Any:
        """``Z * scale + center``: scaled rows back to the original units."""
        if self.identity:
            return Z
        dtype = Z.dtype if np.issubdtype(Z.dtype, np.floating) else np.dtype(np.float64)
        c, s = self.center.astype(dtype), self.scale.astype(dtype)
        return (Z * s + c).astype(dtype, copy=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON description stored with the model (floats round-trip exactly)."""
        d: dict[str, Any] = {
            "method": self.method,
            "statistic": _STATISTIC[self.method],
            "center": [float(v) for v in self.center],
            "scale": [float(v) for v in self.scale],
            "spread": [float(v) for v in self.spread],
            "n_rows": int(self.n_rows),
            "constant_columns": [int(i) for i in self.constant],
            "exact": bool(self.exact),
        }
        if self.columns is not None:
            d["columns"] = list(self.columns)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scaler:
        """Inverse of :meth:`to_dict`; ValueError naming what is wrong."""
        if not isinstance(d, dict) or d.get("method") not in METHODS:
            raise ValueError(
                f"unknown scaling method {d.get('method') if isinstance(d, dict) else d!r}"
            )
        center = np.asarray(d.get("center", []), dtype=np.float64)
        scale = np.asarray(d.get("scale", []), dtype=np.float64)
        spread = np.asarray(d.get("spread", d.get("scale", [])), dtype=np.float64)
        if not (center.ndim == scale.ndim == spread.ndim == 1) or not (
            center.shape == scale.shape == spread.shape
        ):
            raise ValueError("scaling center, scale and spread must be vectors of one length")
        if not (
            np.all(np.isfinite(center)) and np.all(np.isfinite(scale)) and np.all(scale > 0)
        ):
            raise ValueError("scaling center and scale must be finite, scale > 0")
        cols = d.get("columns")
        return cls(
            method=d["method"],
            center=center,
            scale=scale,
            spread=spread,
            n_rows=int(d.get("n_rows", 0)),
            constant=tuple(int(i) for i in d.get("constant_columns", ())),
            exact=bool(d.get("exact", True)),
            columns=None if cols is None else tuple(str(c) for c in cols),
        )


def _as_dask(X: Any) -> da.Array:
    if isinstance(X, da.Array):
        return X
    X = np.asarray(X)
    return da.from_array(X, chunks=(max(1, X.shape[0]), -1))


def _quantiles(X: da.Array, qs: list[float]) -> tuple[np.ndarray, bool]:
    """(len(qs), d) percentiles of each column; exact when a column fits one task."""
    n, d = (int(s) for s in X.shape)
    if n * 8 <= EXACT_QUANTILE_BYTES:
        cols = max(1, min(d, EXACT_QUANTILE_BYTES // max(1, n * 8)))
        Xc = X.rechunk({0: -1, 1: cols})
        out = Xc.map_blocks(
            lambda b: np.percentile(b, qs, axis=0),
            chunks=((len(qs),), Xc.chunks[1]),
            dtype=np.float64,
        )
        return np.asarray(out.compute()), True
    parts = [da.percentile(X[:, j], qs) for j in range(d)]
    return np.stack(da.compute(*parts), axis=1), False


def fit_scaler(X: Any, method: str, *, columns: Any = None) -> Scaler:
    """Fit a :class:`Scaler` on the training rows ``X`` (n x d; dask reductions)."""
    if method not in METHODS:
        raise ValueError(f"scaling method must be one of {METHODS}, got {method!r}")
    Xd = _as_dask(X).astype(np.float64)
    n, d = (int(s) for s in Xd.shape)
    exact = True
    if method == "robust":
        q, exact = _quantiles(Xd, [25.0, 50.0, 75.0])
        center, spread = q[1], q[2] - q[0]
    else:
        center, spread = (np.asarray(a) for a in da.compute(Xd.mean(axis=0), Xd.std(axis=0)))
        if np.all(np.isfinite(center)) and not np.all(np.isfinite(spread)):
            # squares overflowed (values beyond ~1e154): again on columns divided by their
            # largest magnitude (one more pass, only then)
            m = np.asarray(da.absolute(Xd).max(axis=0).compute(), dtype=np.float64)
            m = np.where(m > 0, m, 1.0)
            spread = np.asarray((Xd / m).std(axis=0).compute()) * m
    center = np.asarray(center, dtype=np.float64).reshape(d)
    spread = np.asarray(spread, dtype=np.float64).reshape(d)
    bad = np.flatnonzero(~(np.isfinite(center) & np.isfinite(spread)))
    if bad.size and method != "none":
        named = [str(columns[i]) if columns is not None else str(i) for i in bad[:5]]
        raise InvalidInputError(
            f"The {method} scaling statistics of column(s) {', '.join(named)}"
            f"{' ...' if bad.size > 5 else ''} overflow float64 (values so large that "
            "their spread is not a finite number): scale the data down before fitting."
        )
    eps = np.finfo(np.float64).eps
    zero = spread <= 10 * eps * np.maximum(1.0, np.abs(center))
    scale = np.where(zero, 1.0, spread)
    if method == "none":
        center, scale = np.zeros(d), np.ones(d)
    return Scaler(
        method=method,
        center=center,
        scale=scale,
        spread=spread,
        n_rows=n,
        constant=tuple(int(i) for i in np.flatnonzero(zero)),
        exact=exact,
        columns=None if columns is None else tuple(str(c) for c in columns),
    )


def for_fit(method: str, X: Any, scaler: Any = None, *, precomputed: bool = False):
    """The scaling a fit uses: ``scaler`` when given (checked), else ``method`` fitted on
    ``X``; None for no scaling."""
    from .exceptions import InvalidInputError, InvalidParameterError

    if scaler is None and method == "none":
        return None
    if precomputed:
        raise InvalidParameterError(
            f"preprocess={method!r} scales input rows, but kernel='precomputed' takes a "
            "kernel matrix; scale the rows before computing the kernel, or use "
            "preprocess='none'."
        )
    if scaler is None:
        return fit_scaler(X, method)
    if not isinstance(scaler, Scaler):
        raise InvalidParameterError(
            f"scaler must be a fitted kpca_dask.preprocess.Scaler, got {type(scaler).__name__}"
        )
    if scaler.n_features != int(X.shape[1]):
        raise InvalidInputError(
            f"the scaler was fitted on {scaler.n_features} features but X has "
            f"{int(X.shape[1])}; fit it on the same columns."
        )
    return scaler


def spread_summary(scaler: Scaler) -> dict[str, Any] | None:
    """The widest and narrowest non-constant column spreads and their ratio (None when
    fewer than two columns vary)."""
    s = np.asarray(scaler.spread, dtype=np.float64)
    varying = np.flatnonzero(
        s > 10 * np.finfo(np.float64).eps * np.maximum(1.0, np.abs(scaler.center))
    )
    if scaler.identity:
        varying = np.flatnonzero(s > 0)
    if varying.size < 2:
        return None
    wi = int(varying[np.argmax(s[varying])])
    ni = int(varying[np.argmin(s[varying])])

    def name(i: int) -> str:
        return scaler.columns[i] if scaler.columns is not None else f"column {i}"

    return {
        "ratio": float(s[wi] / s[ni]),
        "widest": {"column": name(wi), "index": wi, "spread": float(s[wi])},
        "narrowest": {"column": name(ni), "index": ni, "spread": float(s[ni])},
    }
