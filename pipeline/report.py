"""The run report: plots and a markdown page people would rather look at than read.

:func:`write_report` turns the evaluate stage's metrics (and two small
samples: scatter points and novelty scores) into ``<out>/report/``::

    scree.png                   eigenvalues (bars) + cumulative explained variance (line)
    scatter.png                 first two components, coloured by class (subsampled)
    accuracy_vs_components.png  held-out accuracy vs k: kernel PCA and linear PCA
    novelty.png                 histogram of score_samples, held-out vs training rows
    gamma_cv.png                cross-validated accuracy vs k per gamma (when swept)
    report.md                   ties them together

Figures are drawn with matplotlib's Agg canvas on private ``Figure`` objects
(no pyplot, no global backend switch, safe in worker threads) at fixed sizes:
``FIGSIZES`` inches at ``DPI`` dots per inch, so each PNG is exactly
:func:`png_size` pixels (scree, accuracy and novelty 800 x 450; scatter
700 x 600). :func:`artifact_summary` gives the same content as markdown and
a table for Prefect artifacts (this module does not import Prefect).
"""

from __future__ import annotations

import io
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .store import Location

__all__ = [
    "DPI",
    "FIGSIZES",
    "png_size",
    "plot_scree",
    "plot_scatter",
    "plot_accuracy",
    "plot_novelty",
    "plot_gamma_cv",
    "report_markdown",
    "write_report",
    "artifact_summary",
]

logger = logging.getLogger("pipeline.report")

#: dots per inch of every PNG
DPI = 100
#: figure sizes in inches (width, height); pixels = inches * DPI
FIGSIZES: dict[str, tuple[float, float]] = {
    "scree": (8.0, 4.5),
    "scatter": (7.0, 6.0),
    "accuracy_vs_components": (8.0, 4.5),
    "novelty": (8.0, 4.5),
    "gamma_cv": (8.0, 4.5),
}

_KPCA_COLOUR, _PCA_COLOUR = "#1f77b4", "#ff7f0e"


def png_size(name: str) -> tuple[int, int]:
    """(width, height) in pixels of the named plot."""
    w, h = FIGSIZES[name]
    return int(round(w * DPI)), int(round(h * DPI))


# ---------------------------------------------------------------------------- io
def _figure(name: str) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZES[name], dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    # No bbox_inches="tight": it would change the pixel size per plot.
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _as_location(where: Any) -> Location:
    return where if isinstance(where, Location) else Location(str(where))


def _write_bytes(loc: Location, data: bytes) -> None:
    """Local: temporary file beside the target, then rename. Object stores: one PUT."""
    if loc.is_local:
        path = loc.local_path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; a report is for reading
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    else:
        with loc.fs.open(loc.fs_path, "wb") as f:
            f.write(data)


def _save(fig: Any, target: Any) -> bytes:
    data = _png_bytes(fig)
    if target is not None:
        _write_bytes(_as_location(target), data)
    return data


# ------------------------------------------------------------------------- plots
def _kernel_label(kernel: dict[str, Any] | None) -> str:
    if not kernel:
        return "kernel PCA"
    name = kernel.get("name", "kernel")
    params = [
        f"{p}={_fmt_num(kernel[p])}"
        for p in ("gamma", "degree", "coef0")
        if kernel.get(p) is not None and not (p != "gamma" and name in ("rbf", "laplacian"))
    ]
    return f"{name} ({', '.join(params)})" if params else str(name)


def _fmt_num(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    v = float(v)
    if v == 0 or 1e-4 <= abs(v) < 1e5:
        return f"{v:.3g}"
    return f"{v:.2e}"


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
    fig = _figure("scree")
    ax = fig.add_subplot(1, 1, 1)
    if ev.size <= 64:
        ax.bar(k, ev, color=_KPCA_COLOUR, alpha=0.8, label="eigenvalue")
    else:
        ax.plot(k, ev, color=_KPCA_COLOUR, lw=1.5, label="eigenvalue")
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
    return _save(fig, path)


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
    fig = _figure("scatter")
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
    return _save(fig, path)


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
    fig = _figure("accuracy_vs_components")
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(ks, 100 * ak, "o-", color=_KPCA_COLOUR, lw=2, label=f"kernel PCA, {kernel_label}")
    ok = ~np.isnan(ap)
    ax.plot(ks[ok], 100 * ap[ok], "s--", color=_PCA_COLOUR, lw=2, label="linear PCA")
    if majority is not None:
        ax.axhline(100 * majority, color="grey", ls=":", lw=1, label="majority class")
    if sweep.get("pca_max_components"):
        ax.axvline(sweep["pca_max_components"], color=_PCA_COLOUR, ls=":", lw=1)
        ax.annotate(
            "linear PCA has no more components",
            (sweep["pca_max_components"], 0.02),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            color=_PCA_COLOUR,
            rotation=90,
            ha="right",
            va="bottom",
        )
    if ks.size and ks.max() >= 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks)
        ax.set_xticklabels([str(int(k)) for k in ks], fontsize=8)
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
    return _save(fig, path)


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
    fig = _figure("novelty")
    ax = fig.add_subplot(1, 1, 1)
    if both.size:
        lo = float(both.min())
        hi = float(np.quantile(both, 0.995))
        if not hi > lo:
            hi = lo + 1e-12 + abs(lo) * 1e-6
        bins = np.linspace(lo, hi, 50)
        if tr.size:
            out = int(np.sum(tr > hi))
            ax.hist(
                np.minimum(tr, hi),
                bins=bins,
                density=True,
                alpha=0.55,
                color="#7f7f7f",
                label=f"training rows (n={tr.size}"
                + (f", {out} beyond axis" if out else "")
                + ")",
            )
        if te.size:
            out = int(np.sum(te > hi))
            ax.hist(
                np.minimum(te, hi),
                bins=bins,
                density=True,
                alpha=0.55,
                color="#9467bd",
                label=f"held-out rows (n={te.size}"
                + (f", {out} beyond axis" if out else "")
                + ")",
            )
        if threshold is not None and math.isfinite(threshold):
            ax.axvline(
                threshold,
                color="#d62728",
                ls="--",
                lw=1.5,
                label=f"training 99th percentile ({_fmt_num(threshold)})",
            )
    ax.set_xlabel("novelty score: squared distance to the principal subspace in feature space")
    ax.set_ylabel("density")
    ax.legend(fontsize=9, loc="upper right")
    ax.set_title(title or "Novelty scores (score_samples)")
    fig.tight_layout()
    return _save(fig, path)


def plot_gamma_cv(
    gamma_sweep: dict[str, Any], path: Any = None, *, title: str | None = None
) -> bytes:
    """Cross-validated accuracy vs k, one line per gamma (best point marked)."""
    from matplotlib import colormaps

    ks = np.asarray(gamma_sweep["n_components"], dtype=np.float64)
    gammas = gamma_sweep["gamma"]
    cmap = colormaps["viridis"]
    fig = _figure("gamma_cv")
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
            label=f"gamma={_fmt_num(g)}",
        )
    best = gamma_sweep["best"]
    ax.plot(
        [best["n_components"]],
        [100 * best["cv_accuracy"]],
        marker="*",
        ms=14,
        color="#d62728",
        ls="",
        label=f"best: gamma={_fmt_num(best['gamma'])}, k={best['n_components']}",
    )
    if ks.size and ks.max() >= 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks)
        ax.set_xticklabels([str(int(k)) for k in ks], fontsize=8)
    ax.set_xlabel("number of components k")
    ax.set_ylabel(f"{gamma_sweep.get('cv_folds', '')}-fold CV accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "Kernel coefficient by cross-validation on the training split")
    fig.tight_layout()
    return _save(fig, path)


# ---------------------------------------------------------------------- markdown
def _pct(v: Any) -> str:
    return "—" if v is None else f"{100 * float(v):.2f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


_CLASSIFIER_NAMES = {
    "logistic": "logistic regression (lbfgs)",
    "linear_svc": "linear SVM",
    "sgd": "SGD logistic regression (streamed in chunks)",
}


_SCALE_NAMES = {
    "none": "none (raw values)",
    "standard": "standard (mean 0, std 1 on the training rows)",
    "robust": "robust (median 0, inter-quartile range 1 on the training rows)",
}


def _preprocess_rows(pre: dict[str, Any] | None) -> list[list[Any]]:
    """The report's row about feature scaling (none for a model without a preprocess
    block); linear PCA sees the same scaled features."""
    if not pre:
        return []
    text = _SCALE_NAMES.get(pre["scale"], pre["scale"])
    ratio = pre.get("spread_ratio")
    if ratio is not None:
        text += (
            f"; raw column spreads differ by {_fmt_num(ratio)}x "
            f"(widest {pre.get('widest')}, narrowest {pre.get('narrowest')})"
        )
    if pre.get("constant_columns"):
        text += f"; {pre['constant_columns']} constant column(s) scaled by 1"
    return [["Feature scaling", text + " (kernel and linear PCA alike)"]]


def report_markdown(
    metrics: dict[str, Any],
    *,
    images: dict[str, str] | None = None,
    title: str | None = None,
    description: str | None = None,
) -> str:
    """The report page: data, model, accuracy table with the margin, and how to read each plot.

    ``images`` maps plot names (``scree``, ``scatter``, ``accuracy_vs_components``,
    ``novelty``, ``gamma_cv``) to relative file names; plots not listed are
    left out of the page.
    """
    images = images or {}
    data, model, clf = metrics["data"], metrics["model"], metrics["classifier"]
    kp, pc, sweep = metrics["kpca"], metrics["pca"], metrics["sweep"]
    klabel = _kernel_label(model.get("kernel"))
    n_test = data["n_test"]
    lines = [f"# {title or 'Kernel PCA report'}", ""]
    if description:
        lines += [description, ""]
    classes = data["classes"]
    cls_txt = ", ".join(classes[:20]) + (
        f", ... ({len(classes)} in all)" if len(classes) > 20 else ""
    )
    std = "standardised components" if clf.get("standardize") else "raw components"
    lines += [
        _table(
            ["", ""],
            [
                ["Rows", f"{data['n_rows']} ({data['n_train']} training, {n_test} held out)"],
                ["Features", data["n_features"]],
                ["Classes", f"{len(classes)}: {cls_txt}"],
                ["Kernel", klabel],
                [
                    "Solver",
                    f"{model.get('eigen_solver') or '—'}, {model['n_components']} components",
                ],
                [
                    "Classifier",
                    f"{_CLASSIFIER_NAMES.get(clf['name'], clf['name'])} on {std}, "
                    f"C={_fmt_num(clf.get('C'))}",
                ],
                *_preprocess_rows(metrics.get("preprocess")),
            ],
        ),
        "",
    ]
    warning = (metrics.get("preprocess") or {}).get("warning")
    if warning:
        lines += [f"**Warning: {warning}**", ""]

    lines += [
        "## Classification of held-out rows",
        "",
        "The model was fitted on the training rows only; held-out rows were embedded "
        "with the saved model's `transform`. The same linear classifier is trained on "
        "each set of features.",
        "",
    ]
    lines += [
        _table(
            ["Features", "Components", "Accuracy", "Balanced accuracy", "Macro F1"],
            [
                [
                    f"kernel PCA, {klabel}",
                    kp["n_components"],
                    _pct(kp["accuracy"]),
                    _pct(kp["balanced_accuracy"]),
                    _pct(kp["macro_f1"]),
                ],
                [
                    "linear PCA ("
                    + ("incremental" if pc.get("method") == "incremental_pca" else "exact")
                    + ")",
                    pc["n_components"],
                    _pct(pc["accuracy"]),
                    _pct(pc["balanced_accuracy"]),
                    _pct(pc["macro_f1"]),
                ],
            ],
        ),
        "",
    ]
    margin = metrics.get("margin")
    if margin is not None:
        verdict = (
            "kernel PCA is ahead"
            if margin > 0
            else "linear PCA is ahead"
            if margin < 0
            else "a tie"
        )
        lines += [
            f"**Margin: {100 * margin:+.2f} percentage points** ({verdict}; one held-out "
            f"row is {100 / n_test:.2f} points).",
            "",
        ]
    if not kp.get("converged", True) or not pc.get("converged", True):
        lines += [
            "Note: a classifier stopped at its iteration cap (raise evaluate.max_iter).",
            "",
        ]

    if "accuracy_vs_components" in images:
        lines += [
            "## Accuracy vs number of components",
            "",
            f"![accuracy vs components]({images['accuracy_vs_components']})",
            "",
            "How to read: each point is the held-out accuracy of the classifier trained on "
            "the first k components. Components nest, so no refit is involved. Where the "
            "kernel PCA curve sits above the linear PCA curve, the nonlinear features "
            "carry class information a linear projection misses; where a curve flattens, "
            "more components buy little: pick the smallest k on the plateau.",
            "",
        ]
    rows = [
        [k, _pct(a), _pct(b), "—" if a is None or b is None else f"{100 * (a - b):+.2f}"]
        for k, a, b in zip(sweep["n_components"], sweep["kpca_accuracy"], sweep["pca_accuracy"])
    ]
    lines += [_table(["k", "kernel PCA", "linear PCA", "margin (points)"], rows), ""]
    if sweep.get("skipped"):
        lines += [f"Skipped sweep points above the embedding's k: {sweep['skipped']}.", ""]

    gs = metrics.get("gamma_sweep")
    if gs and "best" in gs:
        best = gs["best"]
        lines += [
            "## Kernel coefficient by cross-validation",
            "",
            f"{gs['cv_folds']}-fold cross-validation on {gs['n_rows']} training rows "
            f"(kernel PCA refitted per fold; held-out rows unused). Fitted gamma: "
            f"{_fmt_num(gs.get('fitted_gamma'))}. Best: **gamma={_fmt_num(best['gamma'])}, "
            f"k={best['n_components']}** ({_pct(best['cv_accuracy'])}).",
            "",
        ]
        if "gamma_cv" in images:
            lines += [f"![gamma cross-validation]({images['gamma_cv']})", ""]
        lines += [
            _table(
                ["gamma"] + [str(k) for k in gs["n_components"]],
                [
                    [_fmt_num(g)] + [_pct(v) for v in row]
                    for g, row in zip(gs["gamma"], gs["cv_accuracy"])
                ],
            ),
            "",
        ]
    elif gs and "skipped" in gs:
        lines += [f"Gamma sweep skipped: {gs['skipped']}.", ""]

    if "scree" in images:
        evr = metrics["spectrum"]["explained_variance_ratio"]
        lines += [
            "## Spectrum",
            "",
            f"![scree plot]({images['scree']})",
            "",
            f"How to read: bars are the eigenvalues of the centred training kernel matrix "
            f"(variance along each component, times n); the line is the share of the "
            f"total feature-space variance captured by the first k components "
            f"({_pct(sum(evr))} with all {len(evr)}). A sharp elbow means a few "
            f"components carry the structure; a slow decay means the kernel spreads "
            f"variance widely (for rbf, often a gamma that is too large).",
            "",
        ]
    if "scatter" in images:
        lines += [
            "## First two components",
            "",
            f"![scatter plot]({images['scatter']})",
            "",
            "How to read: every point is a row (a seeded subsample of at most "
            f"{metrics.get('config', {}).get('max_scatter_points', '—')} rows), placed by "
            "its first two kernel principal components and coloured by class. Classes "
            "that form separate clouds here are easy for a linear classifier; overlap "
            "in two components can still separate with more of them (see the accuracy "
            "curve).",
            "",
        ]
    nov = metrics.get("novelty") or {}
    if "novelty" in images:
        frac = nov.get("test_fraction_above_train_p99")
        lines += [
            "## Novelty scores",
            "",
            f"![novelty histogram]({images['novelty']})",
            "",
            "How to read: `score_samples` is each row's squared distance to the principal "
            "subspace in feature space (reconstruction error). Held-out rows drawn from "
            "the same distribution as the training rows have a similar histogram; a heavy "
            "right tail marks rows unlike anything the model was fitted on. "
            + (
                f"{_pct(frac)} of held-out rows score above the training rows' 99th "
                f"percentile (about 1% is expected)."
                if frac is not None
                else ""
            ),
            "",
        ]

    if len(classes) <= 20:
        lines += [
            "## Per-class results (kernel PCA)",
            "",
            _table(
                ["class", "precision", "recall", "F1", "support"],
                [
                    [
                        c["class"],
                        _pct(c["precision"]),
                        _pct(c["recall"]),
                        _pct(c["f1"]),
                        c["support"],
                    ]
                    for c in kp["per_class"]
                ],
            ),
            "",
            "Confusion matrix (rows: true class, columns: predicted):",
            "",
        ]
        lines += [
            _table(
                ["true \\ pred"] + classes,
                [[classes[i]] + row for i, row in enumerate(kp["confusion_matrix"])],
            ),
            "",
        ]
    lines += ["All numbers are in `metrics.json` next to this page.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------- driver
def write_report(
    out_dir: Any,
    metrics: dict[str, Any],
    *,
    scatter: tuple[Any, Any] | None = None,
    novelty: tuple[Any, Any] | None = None,
    title: str | None = None,
    description: str | None = None,
) -> dict[str, str]:
    """Write the plots and ``report.md`` into ``<out_dir>/report/``.

    Parameters
    ----------
    out_dir : str, Path or Location
        The run folder (the report goes to its ``report/`` folder).
    metrics : dict
        The evaluate stage's metrics (:data:`pipeline.evaluate.METRICS_SCHEMA`).
    scatter : (embedding, labels), optional
        Rows to draw: ``embedding`` of shape (m, >= 1), ``labels`` int codes.
        Without it no scatter.png is drawn.
    novelty : (test_scores, train_scores), optional
        ``score_samples`` of held-out and training rows. Without it no
        novelty.png is drawn.
    title, description : str, optional

    Returns
    -------
    files : dict
        Plot name -> path (or URL) of every file written, plus ``"report"``.
    """
    out = out_dir if isinstance(out_dir, Location) else Location(str(out_dir))
    rep = out.child("report")
    rep.makedirs()
    model = metrics.get("model", {})
    klabel = _kernel_label(model.get("kernel"))
    images: dict[str, str] = {}
    written: dict[str, str] = {}

    def emit(name: str, data: bytes) -> None:
        loc = rep.child(f"{name}.png")
        _write_bytes(loc, data)
        images[name] = f"{name}.png"
        written[name] = str(loc)

    spec = metrics["spectrum"]
    emit(
        "scree",
        plot_scree(
            spec["eigenvalues"],
            spec["explained_variance_ratio"],
            title=f"Scree plot: kernel PCA, {klabel}",
        ),
    )
    if scatter is not None:
        emb, lab = scatter
        emit(
            "scatter",
            plot_scatter(
                emb,
                lab,
                classes=metrics["data"]["classes"],
                max_points=int(metrics.get("config", {}).get("max_scatter_points", 5000)),
                title=f"First two kernel principal components ({klabel})",
            ),
        )
    counts = metrics["data"].get("test_class_counts") or []
    majority = max(counts) / sum(counts) if counts and sum(counts) else None
    emit(
        "accuracy_vs_components",
        plot_accuracy(metrics["sweep"], kernel_label=klabel, majority=majority),
    )
    if novelty is not None:
        emit(
            "novelty",
            plot_novelty(
                novelty[0],
                novelty[1],
                threshold=(metrics.get("novelty") or {}).get("train_p99"),
            ),
        )
    gs = metrics.get("gamma_sweep")
    if gs and "best" in gs:
        emit("gamma_cv", plot_gamma_cv(gs))
    md = report_markdown(metrics, images=images, title=title, description=description)
    md_loc = rep.child("report.md")
    _write_bytes(md_loc, md.encode("utf-8"))
    written["report"] = str(md_loc)
    logger.info("report: wrote %s to %s", ", ".join(sorted(written)), rep)
    return written


def artifact_summary(metrics: dict[str, Any], *, report_dir: Any = None) -> dict[str, Any]:
    """Markdown and a table for Prefect artifacts (``create_markdown_artifact``,
    ``create_table_artifact``); this module does not import Prefect.

    Returns
    -------
    dict with ``key`` (a valid artifact key), ``markdown`` (headline numbers,
    the accuracy-vs-k table and where the full report is), ``table`` (one row
    per k: ``n_components``, ``kpca_accuracy``, ``pca_accuracy``, ``margin``)
    and ``description``.
    """
    if metrics.get("status") != "complete":
        return {
            "key": "kpca-evaluation",
            "markdown": f"Evaluation skipped: {metrics.get('reason', 'no reason given')}.",
            "table": [],
            "description": "kernel PCA evaluation (skipped)",
        }
    kp, pc, sweep, data = metrics["kpca"], metrics["pca"], metrics["sweep"], metrics["data"]
    klabel = _kernel_label(metrics["model"].get("kernel"))
    table = [
        {
            "n_components": int(k),
            "kpca_accuracy": a,
            "pca_accuracy": b,
            "margin": None if a is None or b is None else a - b,
        }
        for k, a, b in zip(sweep["n_components"], sweep["kpca_accuracy"], sweep["pca_accuracy"])
    ]
    where = f"\n\nFull report with plots: `{report_dir}/report.md`" if report_dir else ""
    md = (
        "\n".join(
            [
                "# Kernel PCA evaluation",
                "",
                f"{data['n_train']} training / {data['n_test']} held-out rows, "
                f"{len(data['classes'])} classes; kernel {klabel}; "
                f"classifier {metrics['classifier']['name']}.",
                "",
                _table(
                    ["Features", "k", "Held-out accuracy"],
                    [
                        ["kernel PCA", kp["n_components"], _pct(kp["accuracy"])],
                        ["linear PCA", pc["n_components"], _pct(pc["accuracy"])],
                    ],
                ),
                "",
                f"**Margin: {100 * (metrics['margin'] or 0.0):+.2f} points.**",
                "",
                _table(
                    ["k", "kernel PCA", "linear PCA"],
                    [
                        [r["n_components"], _pct(r["kpca_accuracy"]), _pct(r["pca_accuracy"])]
                        for r in table
                    ],
                ),
            ]
        )
        + where
    )
    return {
        "key": "kpca-evaluation",
        "markdown": md,
        "table": table,
        "description": f"kernel PCA vs linear PCA, held-out accuracy (k={kp['n_components']})",
    }
