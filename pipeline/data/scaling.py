"""The pipeline's side of feature scaling (config section ``preprocess``).

The split stage fits the scaling on the training rows only (held-out rows never move
its statistics; :func:`fit_training_scaler`), and passes it on in its result
(``SplitResult.preprocess``, JSON). The kernel stage builds a materialised kernel from
the scaled rows, the solve stage hands the same scaler to the estimator, which stores
it in the model (``extra.preprocess``): transform, score_samples, evaluate and the
pre-image path all go through the model, so they all apply (or undo) the same numbers.
The math is :mod:`kpca_dask.preprocess`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from kpca_dask.preprocess import SPREAD_WARN_RATIO, Scaler, fit_scaler, spread_summary

__all__ = [
    "fit_training_scaler",
    "preprocess_report",
    "scaler_id",
    "scaler_of",
    "spread_warning",
]

logger = logging.getLogger("pipeline")


def spread_warning(scaler: Scaler) -> str | None:
    """One line when the columns' spreads differ by more than 1e3 and nothing scales them
    (None otherwise)."""
    if not scaler.identity:
        return None
    s = spread_summary(scaler)
    if s is None or s["ratio"] <= SPREAD_WARN_RATIO:
        return None
    w, n = s["widest"], s["narrowest"]
    return (
        f"feature scales differ by a factor of {s['ratio']:.3g} (widest {w['column']!r}: "
        f"std {w['spread']:.3g}, narrowest {n['column']!r}: std {n['spread']:.3g}) and "
        "preprocess.scale is 'none': the kernel sees mostly the widest columns; set "
        "preprocess.scale: standard (or robust)."
    )


def fit_training_scaler(method: str, X_train: Any, columns: Any = None) -> dict[str, Any]:
    """Fit ``method`` on the training rows (dask reductions); log the constant columns and
    the scale-spread warning; the scaler's JSON form."""
    scaler = fit_scaler(X_train, method, columns=columns)
    if scaler.constant and not scaler.identity:
        names = [scaler.columns[i] if scaler.columns else str(i) for i in scaler.constant]
        logger.info(
            "preprocess: %d constant column(s) on the training rows, scaled by 1: %s",
            len(names),
            ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""),
        )
    warning = spread_warning(scaler)
    if warning:
        logger.warning("preprocess: %s", warning)
    else:
        logger.info(
            "preprocess: %s scaling fitted on %d training rows (%s)",
            scaler.method,
            scaler.n_rows,
            "exact quantiles" if scaler.exact else "approximate quantiles",
        )
    return scaler.to_dict()


def scaler_of(split: Any) -> Scaler | None:
    """The scaler a split result carries (None for results written before scaling)."""
    pre = split.get("preprocess") if isinstance(split, dict) else split.preprocess
    return None if pre is None else Scaler.from_dict(pre)


def scaler_id(split: Any) -> str | None:
    """A short content hash of the fitted scaling (None: none, or the identity)."""
    scaler = scaler_of(split)
    if scaler is None or scaler.identity:
        return None
    body = json.dumps(scaler.to_dict(), sort_keys=True).encode()
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def preprocess_report(scaler: Scaler | None) -> dict[str, Any] | None:
    """What the evaluate report says about scaling: the method, the spread of the raw
    columns and the warning (None for a model saved without a preprocess block)."""
    if scaler is None:
        return None
    s = spread_summary(scaler)
    return {
        "scale": scaler.method,
        "n_rows": int(scaler.n_rows),
        "constant_columns": len(scaler.constant),
        "spread_ratio": None if s is None else s["ratio"],
        "widest": None if s is None else s["widest"]["column"],
        "narrowest": None if s is None else s["narrowest"]["column"],
        "warning": spread_warning(scaler),
    }
