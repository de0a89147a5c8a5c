"""The drift report of a batch of new rows against a model's training rows.

Computed with the model the batch would be merged into, before it is merged
(pipeline/update/run.py; docs/update.md):

* novelty: the feature-space reconstruction error (``model.score_samples``:
  the squared distance of ``phi(x)`` from the principal subspace) of the new
  rows and of a sample of training rows -- quantiles of both, and a two-sample
  Kolmogorov-Smirnov test (scipy.stats.ks_2samp) with its p-value;
* the share of the rows' centred kernel variance the components capture,
  ``sum ||emb||^2 / sum (||emb||^2 + novelty)``, for both;
* the shift of the embedding's mean (in training standard deviations, per
  component) and the ratio of its spread.

Each check has a threshold (the config's ``update`` section); the batch is
flagged when any check fails, and :func:`decide` turns the flags and the policy
into the action (merge, refresh_landmarks or refit) with its reason.

The training sample excludes the landmarks: their reconstruction error is zero
by construction, which would make every new batch look novel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["QUANTILES", "decide", "drift_report"]

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)


def _side(model: Any, X: np.ndarray) -> dict[str, Any]:
    names = getattr(model, "feature_names_in_", None)
    if names is not None:  # the rows are the model's columns, in order: say so by name
        import pandas as pd

        X = pd.DataFrame(X, columns=list(names))
    emb = np.asarray(model.transform(X), dtype=np.float64)
    nov = np.maximum(np.asarray(model.score_samples(X), dtype=np.float64), 0.0)
    e2 = float((emb**2).sum())
    return {
        "emb": emb,
        "novelty": nov,
        "captured": e2 / (e2 + float(nov.sum())) if e2 + nov.sum() > 0 else 1.0,
    }


def drift_report(model: Any, X_ref: np.ndarray, X_new: np.ndarray, policy: Any) -> dict:
    """The report (JSON data) of ``X_new`` against training rows ``X_ref`` under ``model``;
    ``policy``: the config's ``update`` section (thresholds)."""
    from scipy.stats import ks_2samp

    ref, new = _side(model, X_ref), _side(model, X_new)
    ks = ks_2samp(new["novelty"], ref["novelty"])
    med_ref = float(np.median(ref["novelty"]))
    med_new = float(np.median(new["novelty"]))
    ratio = med_new / med_ref if med_ref > 0 else (np.inf if med_new > 0 else 1.0)
    mu_r, sd_r = ref["emb"].mean(axis=0), ref["emb"].std(axis=0)
    mu_n, sd_n = new["emb"].mean(axis=0), new["emb"].std(axis=0)
    tiny = np.finfo(np.float64).tiny
    shift = np.abs(mu_n - mu_r) / np.maximum(sd_r, tiny)
    spread = sd_n / np.maximum(sd_r, tiny)
    spread_dev = np.maximum(spread, 1.0 / np.maximum(spread, tiny))
    novel = ks.pvalue < policy.novelty_pvalue and ratio >= policy.novelty_effect
    checks = {
        "novelty": {
            "flagged": bool(novel),
            "ks_statistic": float(ks.statistic),
            "p_value": float(ks.pvalue),
            "median_ratio": float(ratio),
            "threshold": f"p < {policy.novelty_pvalue:g} and median ratio >= "
            f"{policy.novelty_effect:g}",
        },
        "captured_variance": {
            "flagged": bool(ref["captured"] - new["captured"] > policy.captured_drop),
            "training": float(ref["captured"]),
            "batch": float(new["captured"]),
            "threshold": f"drop > {policy.captured_drop:g}",
        },
        "embedding_mean": {
            "flagged": bool(shift.max() > policy.mean_shift),
            "max_shift_sd": float(shift.max()),
            "shift_sd": shift.tolist(),
            "threshold": f"> {policy.mean_shift:g} sd",
        },
        "embedding_spread": {
            "flagged": bool(spread_dev.max() > policy.spread_ratio),
            "ratio": spread.tolist(),
            "threshold": f"ratio outside [1/{policy.spread_ratio:g}, {policy.spread_ratio:g}]",
        },
    }
    q = list(QUANTILES)
    return {
        "rows": {"batch": int(X_new.shape[0]), "reference": int(X_ref.shape[0])},
        "novelty_quantiles": {
            "q": q,
            "training": np.quantile(ref["novelty"], q).tolist(),
            "batch": np.quantile(new["novelty"], q).tolist(),
        },
        "checks": checks,
        "flagged": [name for name, c in checks.items() if c["flagged"]],
        "drifted": any(c["flagged"] for c in checks.values()),
    }


def decide(report: dict, policy: Any, updatable: bool | str) -> tuple[str, str]:
    """The action for a batch (merge, refresh_landmarks, refit) and why, in one line.

    ``updatable``: True, or why the model cannot merge (False: it keeps no sufficient
    statistics)."""
    flagged = report["flagged"]
    why_drift = (
        "drift: " + ", ".join(flagged) + " past their thresholds"
        if flagged
        else "no drift check past its threshold"
    )
    if policy.policy != "auto":
        action, why = policy.policy, f"update.policy is {policy.policy!r} ({why_drift})"
    elif flagged:
        action, why = policy.on_drift, f"{why_drift}; update.on_drift is {policy.on_drift!r}"
    else:
        action, why = "merge", why_drift
    if action == "merge" and updatable is not True:
        cannot = updatable or "the model keeps no sufficient statistics, so refit"
        action, why = "refit", f"{why}; {cannot}"
    return action, why
