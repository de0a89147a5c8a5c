"""Choosing the kernel coefficient by cross-validation on the training split."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..config import EvaluateConfig
from ..errors import EvaluationError
from .classify import as_config, confusions

logger = logging.getLogger("pipeline.evaluate")

__all__ = ["AUTO_GAMMA_FACTORS", "GAMMA_KERNELS", "gamma_cv_sweep"]


#: kernels whose ``gamma`` a cross-validated sweep can tune.
GAMMA_KERNELS = ("rbf", "laplacian", "poly", "polynomial", "sigmoid")

#: multipliers of the fitted ``gamma_`` tried by ``gamma_sweep="auto"``.
AUTO_GAMMA_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


def gamma_cv_sweep(
    X_train: np.ndarray,
    y_train: np.ndarray,
    estimator: Any,
    gammas: Sequence[float],
    components: Sequence[int],
    *,
    config: EvaluateConfig | dict[str, Any] | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Cross-validated accuracy over (gamma, k) on the training split only.

    For each gamma and each of ``config.cv_folds`` stratified folds, a clone
    of ``estimator`` (a KernelPCA, fitted or not: only its parameters are
    used) is fitted on the fold's training part with ``n_components =
    max(components)`` and transforms the fold's validation part; the linear
    classifier is scored at every ``k`` (columns nest, one fit per fold and
    gamma). Held-out test rows of the run are never used.

    Parameters
    ----------
    X_train : ndarray of shape (m, d)
        Training rows (the stage passes a seeded subsample of at most
        ``cv_max_rows``).
    y_train : ndarray of shape (m,)
    estimator : KernelPCA
    gammas : sequence of float
    components : sequence of int

    Returns
    -------
    dict with ``gamma`` (list), ``n_components`` (list), ``cv_accuracy`` and
    ``cv_std`` (len(gamma) x len(n_components) nested lists, None where a fit
    kept fewer components), ``best`` ({gamma, n_components, cv_accuracy}),
    ``cv_folds``, ``n_rows``.
    """
    from sklearn.model_selection import StratifiedKFold

    cfg = as_config(config)
    X = np.asarray(X_train, dtype=np.float64)
    y = np.asarray(y_train, dtype=np.int64)
    folds = _fold_count(y, cfg.cv_folds)
    ks = _fittable_ks(components, X.shape[0], folds)
    skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=cfg.random_state)
    splits = list(skf.split(X, y))
    kind = "logistic" if cfg.classifier in ("auto", "sgd") else cfg.classifier
    acc, dropped = _fold_accuracies(X, y, estimator, gammas, ks, splits, cfg, kind, progress)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN cells
        mean = np.nanmean(acc, axis=2)
        std = np.nanstd(acc, axis=2)
    mean[np.isnan(acc).any(axis=2)] = np.nan
    if np.all(np.isnan(mean)):
        raise EvaluationError(
            "gamma cross-validation produced no usable fit: every gamma "
            "kept fewer components than asked"
        )
    bi, bk = np.unravel_index(int(np.nanargmax(mean)), mean.shape)
    return {
        "gamma": [float(g) for g in gammas],
        "n_components": ks,
        "cv_accuracy": _lists(mean),
        "cv_std": _lists(std),
        "best": {
            "gamma": float(gammas[bi]),
            "n_components": int(ks[bk]),
            "cv_accuracy": float(mean[bi, bk]),
        },
        "cv_folds": folds,
        "n_rows": int(X.shape[0]),
        "dropped_component_warnings": dropped,
        "classifier": kind,
    }


def _fold_count(y: np.ndarray, cv_folds: int) -> int:
    """``cv_folds``, fewer when the rarest class has fewer rows; at least 2."""
    counts = np.bincount(y)
    folds = min(cv_folds, int(counts[counts > 0].min()))
    if folds < 2:
        raise EvaluationError(
            "gamma cross-validation needs at least 2 training rows of every "
            "class in the subsample; raise evaluate.cv_max_rows"
        )
    return folds


def _fittable_ks(components: Sequence[int], n_rows: int, folds: int) -> list[int]:
    """The swept k smaller than a fold's training part (or one that is)."""
    ks = sorted({int(k) for k in components})
    fold_size = n_rows - math.ceil(n_rows / folds)
    return [k for k in ks if k < fold_size] or [max(1, fold_size - 1)]


def _fold_accuracies(
    X: np.ndarray,
    y: np.ndarray,
    estimator: Any,
    gammas: Sequence[float],
    ks: list[int],
    splits: list[tuple[np.ndarray, np.ndarray]],
    cfg: EvaluateConfig,
    kind: str,
    progress: Any,
) -> tuple[np.ndarray, int]:
    """Accuracy per (gamma, k, fold), NaN where a fit kept fewer than k components; and
    how many DroppedComponents warnings the fits raised."""
    from sklearn.base import clone

    folds, kmax, n_cls = len(splits), ks[-1], int(y.max()) + 1
    acc = np.full((len(gammas), len(ks), folds), np.nan)
    dropped = 0
    # One BLAS thread: the fits are small (<= cv_max_rows rows) and a
    # multi-threaded eigh on a busy 2-core machine was measured 10-60x slower
    # (threads spinning for cores) than a single-threaded one (0.13 s, n=900).
    with threadpool_limits(1, user_api="blas"):
        for gi, g in enumerate(gammas):
            for fi, (tr, va) in enumerate(splits):
                if (
                    progress is not None
                ):  # pipeline.runtime.progress.Steps: one log line per fit
                    progress.sub(
                        "gamma %.4g, fold %d of %d",
                        gi * folds + fi + 1,
                        len(gammas) * folds,
                        g,
                        fi + 1,
                        folds,
                    )
                est = clone(estimator).set_params(gamma=float(g), n_components=kmax)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    Etr = np.asarray(est.fit_transform(X[tr]))
                    Eva = np.asarray(est.transform(X[va]))
                dropped += sum("DroppedComponents" in type(w.message).__name__ for w in caught)
                kk = [k for k in ks if k <= Etr.shape[1]]
                if not kk:
                    continue
                conf, _ = confusions(Etr, y[tr], Eva, y[va], kk, n_cls, cfg, kind)
                for k in kk:
                    acc[gi, ks.index(k), fi] = np.trace(conf[k]) / conf[k].sum()
    return acc, dropped


def _lists(a: np.ndarray) -> list[list[float | None]]:
    return [[None if np.isnan(v) else float(v) for v in row] for row in a]
