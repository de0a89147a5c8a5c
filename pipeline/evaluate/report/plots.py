"""The five report plots, each drawn on its own fixed-size figure and returned as PNG bytes.

Every ``plot_*`` function returns the PNG bytes and, given ``path``, also writes
them there (temporary file and rename; one PUT on an object store).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .canvas import KPCA_COLOUR, PCA_COLOUR, new_figure, save_png
from .formatting import fmt_num

__all__ = ["plot_accuracy", "plot_gamma_cv", "plot_novelty", "plot_scatter", "plot_scree"]


def plot_scree(
    eigenvalues: Sequence[float],
    explained_variance_ratio: Sequence[float],
    path: Any = None,
    *,
    title: str | None = None,
) -> bytes:
    """Eigenvalues as bars (left axis) and cumulative explained variance (right axis, %).

    The explained variance ratio is relative to the whole feature-space
    variance ``trace(Kc)``, so the cumulative curve ends below 100% when the
    kept components do not capture everything. Returns the PNG bytes (and
    writes them to ``path`` when given).
    """
    ev = np.asarray(eigenvalues, dtype=np.float64)
    evr = np.asarray(explained_variance_ratio, dtype=np.float64)
    k = np.arange(1, ev.size + 1)
    fig = new_figure("scree")
    ax = fig.add_subplot(1, 1, 1)
    if ev.size <= 64:
        ax.bar(k, ev, color=KPCA_COLOUR, alpha=0.8, label="eigenvalue")
    else:
        ax.plot(k, ev, color=KPCA_COLOUR, lw=1.5, label="eigenvalue")
    ax.set_xlabel("component")
    ax.set_ylabel("eigenvalue of the centred kernel matrix")
    ax.set_xlim(0.4, ev.size + 0.6)
    ax2 = ax.twinx()
    cum = 100 * np.cumsum(evr)
    ax2.plot(
        k,
        cum,
        color="#d62728",
        marker="o" if ev.size <= 64 else None,
        ms=3,
        lw=1.8,
        label="cumulative explained variance",
    )
    ax2.set_ylabel("cumulative explained variance (%)")
    ax2.set_ylim(0, max(100.0, float(cum.max()) if cum.size else 100.0) * 1.02)
    if cum.size:
        ax2.annotate(
            f"{cum[-1]:.1f}% with {ev.size}",
            (k[-1], cum[-1]),
            textcoords="offset points",
            xytext=(-10, -14),
            ha="right",
            fontsize=9,
            color="#d62728",
        )
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="center right", fontsize=9)
    ax.set_title(title or "Scree plot")
    fig.tight_layout()
    return save_png(fig, path)


def _class_colours(n_classes: int) -> Any:
    from matplotlib import colormaps

    if n_classes <= 10:
        return colormaps["tab10"]
    if n_classes <= 20:
        return colormaps["tab20"]
    return colormaps["viridis"].resampled(n_classes)


def plot_scatter(
    embedding: Any,
    labels: Any,
    path: Any = None,
    *,
    classes: Sequence[str] | None = None,
    max_points: int = 5000,
    random_state: int = 0,
    title: str | None = None,
) -> bytes:
    """First two components, one colour per class (a seeded subsample of ``max_points``).

    A one-component embedding is drawn as a strip (component 1 against a
    small vertical jitter per class).
    """
    E = np.asarray(embedding, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if E.ndim == 1:
        E = E[:, None]
    if E.shape[0] > max_points:
        idx = np.sort(
            np.random.default_rng(random_state).choice(E.shape[0], max_points, replace=False)
        )
        E, y = E[idx], y[idx]
    n_cls = len(classes) if classes is not None else (int(y.max()) + 1 if y.size else 1)
    names = [str(c) for c in classes] if classes is not None else [str(i) for i in range(n_cls)]
    cmap = _class_colours(n_cls)
    fig = new_figure("scatter")
    ax = fig.add_subplot(1, 1, 1)
    if E.shape[1] >= 2:
        xs, ys = E[:, 0], E[:, 1]
        ax.set_ylabel("component 2")
    else:
        rng = np.random.default_rng(random_state)
        xs, ys = E[:, 0], y + rng.uniform(-0.3, 0.3, size=y.size)
        ax.set_ylabel("class (jittered)")
    # Draw in a random order so no class hides under another.
    order = np.random.default_rng(random_state + 1).permutation(y.size)
    colours = cmap(y[order] % cmap.N if n_cls <= 20 else y[order])
    ax.scatter(xs[order], ys[order], c=colours, s=9, alpha=0.75, linewidths=0)
    if n_cls <= 20:
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], ls="", marker="o", ms=6, color=cmap(i % cmap.N), label=names[i])
            for i in range(n_cls)
            if np.any(y == i)
        ]
        ax.legend(
            handles=handles,
            title="class",
            fontsize=8,
            title_fontsize=9,
            loc="best",
            ncol=1 if len(handles) <= 10 else 2,
            framealpha=0.8,
        )
    ax.set_xlabel("component 1")
    ax.set_title(title or f"First two components ({y.size} points)")
    fig.tight_layout()
    return save_png(fig, path)


def plot_accuracy(
    sweep: dict[str, Any],
    path: Any = None,
    *,
    kernel_label: str = "kernel PCA",
    majority: float | None = None,
    title: str | None = None,
) -> bytes:
    """Held-out accuracy against the number of components, kernel PCA vs linear PCA.

    ``sweep`` is ``metrics["sweep"]``: ``n_components``, ``kpca_accuracy``,
    ``pca_accuracy`` (None above the data's dimension, where linear PCA has no
    more components). ``majority`` draws the accuracy of always predicting the
    most frequent class.
    """
    ks = np.asarray(sweep["n_components"], dtype=np.float64)
    ak = np.array([np.nan if a is None else a for a in sweep["kpca_accuracy"]], dtype=float)
    ap = np.array([np.nan if a is None else a for a in sweep["pca_accuracy"]], dtype=float)
    fig = new_figure("accuracy_vs_components")
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(ks, 100 * ak, "o-", color=KPCA_COLOUR, lw=2, label=f"kernel PCA, {kernel_label}")
    ok = ~np.isnan(ap)
    ax.plot(ks[ok], 100 * ap[ok], "s--", color=PCA_COLOUR, lw=2, label="linear PCA")
    if majority is not None:
        ax.axhline(100 * majority, color="grey", ls=":", lw=1, label="majority class")
    if sweep.get("pca_max_components"):
        _mark_pca_limit(ax, sweep["pca_max_components"])
    _log2_k_axis(ax, ks)
    if ks.size and ok[-1] and not np.isnan(ak[-1]):
        m = 100 * (ak[-1] - ap[-1])
        ax.text(
            0.02,
            0.96,
            f"k={int(ks[-1])}: kernel PCA {100 * ak[-1]:.1f}%, linear PCA "
            f"{100 * ap[-1]:.1f}% ({m:+.1f} points)",
            transform=ax.transAxes,
            va="top",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "white", "ec": "0.8"},
        )
    ax.set_xlabel("number of components k")
    ax.set_ylabel("held-out accuracy (%)")
    finite = np.concatenate([ak[~np.isnan(ak)], ap[ok]])
    lo = 100 * float(finite.min()) if finite.size else 0.0
    if majority is not None:
        lo = min(lo, 100 * majority)
    ax.set_ylim(max(0.0, lo - 5), 101)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    ax.set_title(title or "Linear classifier accuracy vs number of components")
    fig.tight_layout()
    return save_png(fig, path)


def _log2_k_axis(ax: Any, ks: np.ndarray) -> None:
    """From k = 8 on, a log2 x axis with a tick at every swept k."""
    if ks.size and ks.max() >= 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks)
        ax.set_xticklabels([str(int(k)) for k in ks], fontsize=8)


def _mark_pca_limit(ax: Any, k_max: int) -> None:
    """A dotted line where linear PCA runs out of components (the data's dimension)."""
    ax.axvline(k_max, color=PCA_COLOUR, ls=":", lw=1)
    ax.annotate(
        "linear PCA has no more components",
        (k_max, 0.02),
        xycoords=("data", "axes fraction"),
        fontsize=8,
        color=PCA_COLOUR,
        rotation=90,
        ha="right",
        va="bottom",
    )


def plot_novelty(
    test_scores: Any,
    train_scores: Any = None,
    path: Any = None,
    *,
    threshold: float | None = None,
    title: str | None = None,
) -> bytes:
    """Histograms of ``score_samples`` (feature-space reconstruction error).

    Held-out rows against training rows on shared bins (densities). The
    x-axis ends at the 99.5th percentile of all scores so a few extreme
    outliers do not squash the histogram; rows beyond it are counted in the
    legend. ``threshold`` (e.g. the training 99th percentile) is drawn as a
    vertical line.
    """
    te = np.asarray(test_scores, dtype=np.float64).ravel()
    tr = (
        np.asarray(train_scores, dtype=np.float64).ravel()
        if train_scores is not None
        else np.empty(0)
    )
    both = np.concatenate([te, tr])
    fig = new_figure("novelty")
    ax = fig.add_subplot(1, 1, 1)
    if both.size:
        lo = float(both.min())
        hi = float(np.quantile(both, 0.995))
        if not hi > lo:
            hi = lo + 1e-12 + abs(lo) * 1e-6
        bins = np.linspace(lo, hi, 50)
        if tr.size:
            _clipped_hist(ax, tr, bins, hi, "#7f7f7f", "training rows")
        if te.size:
            _clipped_hist(ax, te, bins, hi, "#9467bd", "held-out rows")
        if threshold is not None and math.isfinite(threshold):
            ax.axvline(
                threshold,
                color="#d62728",
                ls="--",
                lw=1.5,
                label=f"training 99th percentile ({fmt_num(threshold)})",
            )
    ax.set_xlabel("novelty score: squared distance to the principal subspace in feature space")
    ax.set_ylabel("density")
    ax.legend(fontsize=9, loc="upper right")
    ax.set_title(title or "Novelty scores (score_samples)")
    fig.tight_layout()
    return save_png(fig, path)


def _clipped_hist(
    ax: Any, x: np.ndarray, bins: np.ndarray, hi: float, colour: str, what: str
) -> None:
    """A density histogram with values beyond ``hi`` piled into the last bin (and counted)."""
    out = int(np.sum(x > hi))
    ax.hist(
        np.minimum(x, hi),
        bins=bins,
        density=True,
        alpha=0.55,
        color=colour,
        label=f"{what} (n={x.size}" + (f", {out} beyond axis" if out else "") + ")",
    )


def plot_gamma_cv(
    gamma_sweep: dict[str, Any], path: Any = None, *, title: str | None = None
) -> bytes:
    """Cross-validated accuracy vs k, one line per gamma (best point marked)."""
    from matplotlib import colormaps

    ks = np.asarray(gamma_sweep["n_components"], dtype=np.float64)
    gammas = gamma_sweep["gamma"]
    cmap = colormaps["viridis"]
    fig = new_figure("gamma_cv")
    ax = fig.add_subplot(1, 1, 1)
    for i, (g, row) in enumerate(zip(gammas, gamma_sweep["cv_accuracy"])):
        a = np.array([np.nan if v is None else v for v in row], dtype=float)
        ax.plot(
            ks,
            100 * a,
            "o-",
            ms=3,
            lw=1.5,
            color=cmap(i / max(1, len(gammas) - 1)),
            label=f"gamma={fmt_num(g)}",
        )
    best = gamma_sweep["best"]
    ax.plot(
        [best["n_components"]],
        [100 * best["cv_accuracy"]],
        marker="*",
        ms=14,
        color="#d62728",
        ls="",
        label=f"best: gamma={fmt_num(best['gamma'])}, k={best['n_components']}",
    )
    _log2_k_axis(ax, ks)
    ax.set_xlabel("number of components k")
    ax.set_ylabel(f"{gamma_sweep.get('cv_folds', '')}-fold CV accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "Kernel coefficient by cross-validation on the training split")
    fig.tight_layout()
    return save_png(fig, path)
