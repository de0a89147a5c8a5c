"""report.md: the page that ties the plots together, one function per section.

Each ``_..._section`` returns the section's lines (markdown, a blank line after
every block); :func:`report_markdown` joins them in page order.
"""

from __future__ import annotations

from typing import Any

from .formatting import fmt_num, kernel_label, md_table, pct

__all__ = ["report_markdown"]

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
    klabel = kernel_label(metrics["model"].get("kernel"))
    lines = [f"# {title or 'Kernel PCA report'}", ""]
    if description:
        lines += [description, ""]
    lines += _summary_section(metrics, klabel)
    lines += _classification_section(metrics, klabel)
    lines += _sweep_section(metrics["sweep"], images)
    lines += _gamma_section(metrics.get("gamma_sweep"), images)
    lines += _spectrum_section(metrics, images)
    lines += _scatter_section(metrics, images)
    lines += _novelty_section(metrics, images)
    lines += _per_class_section(metrics)
    lines += ["All numbers are in `metrics.json` next to this page.", ""]
    return "\n".join(lines)


def _summary_section(metrics: dict[str, Any], klabel: str) -> list[str]:
    """The table of data, kernel, solver, classifier and scaling (and a scaling warning)."""
    data, model, clf = metrics["data"], metrics["model"], metrics["classifier"]
    classes = data["classes"]
    cls_txt = ", ".join(classes[:20]) + (
        f", ... ({len(classes)} in all)" if len(classes) > 20 else ""
    )
    std = "standardised components" if clf.get("standardize") else "raw components"
    rows = [
        ["Rows", f"{data['n_rows']} ({data['n_train']} training, {data['n_test']} held out)"],
        ["Features", data["n_features"]],
        ["Classes", f"{len(classes)}: {cls_txt}"],
        ["Kernel", klabel],
        ["Solver", f"{model.get('eigen_solver') or '—'}, {model['n_components']} components"],
        [
            "Classifier",
            f"{_CLASSIFIER_NAMES.get(clf['name'], clf['name'])} on {std}, "
            f"C={fmt_num(clf.get('C'))}",
        ],
        *_preprocess_rows(metrics.get("preprocess")),
    ]
    lines = [md_table(["", ""], rows), ""]
    warning = (metrics.get("preprocess") or {}).get("warning")
    if warning:
        lines += [f"**Warning: {warning}**", ""]
    return lines


def _preprocess_rows(pre: dict[str, Any] | None) -> list[list[Any]]:
    """The report's row about feature scaling (none for a model without a preprocess
    block); linear PCA sees the same scaled features."""
    if not pre:
        return []
    text = _SCALE_NAMES.get(pre["scale"], pre["scale"])
    ratio = pre.get("spread_ratio")
    if ratio is not None:
        text += (
            f"; raw column spreads differ by {fmt_num(ratio)}x "
            f"(widest {pre.get('widest')}, narrowest {pre.get('narrowest')})"
        )
    if pre.get("constant_columns"):
        text += f"; {pre['constant_columns']} constant column(s) scaled by 1"
    return [["Feature scaling", text + " (kernel and linear PCA alike)"]]


def _classification_section(metrics: dict[str, Any], klabel: str) -> list[str]:
    """Held-out accuracy of kernel PCA and linear PCA features, and the margin."""
    kp, pc = metrics["kpca"], metrics["pca"]
    pca_name = "incremental" if pc.get("method") == "incremental_pca" else "exact"
    lines = [
        "## Classification of held-out rows",
        "",
        "The model was fitted on the training rows only; held-out rows were embedded "
        "with the saved model's `transform`. The same linear classifier is trained on "
        "each set of features.",
        "",
        md_table(
            ["Features", "Components", "Accuracy", "Balanced accuracy", "Macro F1"],
            [
                _scores_row(f"kernel PCA, {klabel}", kp),
                _scores_row(f"linear PCA ({pca_name})", pc),
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
            f"row is {100 / metrics['data']['n_test']:.2f} points).",
            "",
        ]
    if not kp.get("converged", True) or not pc.get("converged", True):
        lines += [
            "Note: a classifier stopped at its iteration cap (raise evaluate.max_iter).",
            "",
        ]
    return lines


def _scores_row(name: str, scores: dict[str, Any]) -> list[Any]:
    return [
        name,
        scores["n_components"],
        pct(scores["accuracy"]),
        pct(scores["balanced_accuracy"]),
        pct(scores["macro_f1"]),
    ]


def _sweep_section(sweep: dict[str, Any], images: dict[str, str]) -> list[str]:
    """The accuracy-vs-k plot (when drawn) and the table of both curves."""
    lines: list[str] = []
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
        [k, pct(a), pct(b), "—" if a is None or b is None else f"{100 * (a - b):+.2f}"]
        for k, a, b in zip(sweep["n_components"], sweep["kpca_accuracy"], sweep["pca_accuracy"])
    ]
    lines += [md_table(["k", "kernel PCA", "linear PCA", "margin (points)"], rows), ""]
    if sweep.get("skipped"):
        lines += [f"Skipped sweep points above the embedding's k: {sweep['skipped']}.", ""]
    return lines


def _gamma_section(gs: dict[str, Any] | None, images: dict[str, str]) -> list[str]:
    """The cross-validated gamma sweep: best point, plot and table; or why it was skipped."""
    if not gs:
        return []
    if "best" not in gs:
        return [f"Gamma sweep skipped: {gs['skipped']}.", ""] if "skipped" in gs else []
    best = gs["best"]
    lines = [
        "## Kernel coefficient by cross-validation",
        "",
        f"{gs['cv_folds']}-fold cross-validation on {gs['n_rows']} training rows "
        f"(kernel PCA refitted per fold; held-out rows unused). Fitted gamma: "
        f"{fmt_num(gs.get('fitted_gamma'))}. Best: **gamma={fmt_num(best['gamma'])}, "
        f"k={best['n_components']}** ({pct(best['cv_accuracy'])}).",
        "",
    ]
    if "gamma_cv" in images:
        lines += [f"![gamma cross-validation]({images['gamma_cv']})", ""]
    rows = [
        [fmt_num(g)] + [pct(v) for v in row] for g, row in zip(gs["gamma"], gs["cv_accuracy"])
    ]
    lines += [md_table(["gamma"] + [str(k) for k in gs["n_components"]], rows), ""]
    return lines


def _spectrum_section(metrics: dict[str, Any], images: dict[str, str]) -> list[str]:
    """The scree plot and how to read it."""
    if "scree" not in images:
        return []
    evr = metrics["spectrum"]["explained_variance_ratio"]
    return [
        "## Spectrum",
        "",
        f"![scree plot]({images['scree']})",
        "",
        f"How to read: bars are the eigenvalues of the centred training kernel matrix "
        f"(variance along each component, times n); the line is the share of the "
        f"total feature-space variance captured by the first k components "
        f"({pct(sum(evr))} with all {len(evr)}). A sharp elbow means a few "
        f"components carry the structure; a slow decay means the kernel spreads "
        f"variance widely (for rbf, often a gamma that is too large).",
        "",
    ]


def _scatter_section(metrics: dict[str, Any], images: dict[str, str]) -> list[str]:
    """The first-two-components scatter plot and how to read it."""
    if "scatter" not in images:
        return []
    return [
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


def _novelty_section(metrics: dict[str, Any], images: dict[str, str]) -> list[str]:
    """The novelty histogram, how to read it and the share of held-out rows above p99."""
    if "novelty" not in images:
        return []
    frac = (metrics.get("novelty") or {}).get("test_fraction_above_train_p99")
    return [
        "## Novelty scores",
        "",
        f"![novelty histogram]({images['novelty']})",
        "",
        "How to read: `score_samples` is each row's squared distance to the principal "
        "subspace in feature space (reconstruction error). Held-out rows drawn from "
        "the same distribution as the training rows have a similar histogram; a heavy "
        "right tail marks rows unlike anything the model was fitted on. "
        + (
            f"{pct(frac)} of held-out rows score above the training rows' 99th "
            f"percentile (about 1% is expected)."
            if frac is not None
            else ""
        ),
        "",
    ]


def _per_class_section(metrics: dict[str, Any]) -> list[str]:
    """Per-class scores and the confusion matrix (up to 20 classes)."""
    classes, kp = metrics["data"]["classes"], metrics["kpca"]
    if len(classes) > 20:
        return []
    per_class = [
        [c["class"], pct(c["precision"]), pct(c["recall"]), pct(c["f1"]), c["support"]]
        for c in kp["per_class"]
    ]
    confusion = [[classes[i]] + row for i, row in enumerate(kp["confusion_matrix"])]
    return [
        "## Per-class results (kernel PCA)",
        "",
        md_table(["class", "precision", "recall", "F1", "support"], per_class),
        "",
        "Confusion matrix (rows: true class, columns: predicted):",
        "",
        md_table(["true \\ pred"] + classes, confusion),
        "",
    ]
