"""The evaluation as Prefect artifacts: headline markdown and a per-k table."""

from __future__ import annotations

from typing import Any

from .formatting import kernel_label, md_table, pct

__all__ = ["artifact_summary"]


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
    klabel = kernel_label(metrics["model"].get("kernel"))
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
                md_table(
                    ["Features", "k", "Held-out accuracy"],
                    [
                        ["kernel PCA", kp["n_components"], pct(kp["accuracy"])],
                        ["linear PCA", pc["n_components"], pct(pc["accuracy"])],
                    ],
                ),
                "",
                f"**Margin: {100 * (metrics['margin'] or 0.0):+.2f} points.**",
                "",
                md_table(
                    ["k", "kernel PCA", "linear PCA"],
                    [
                        [r["n_components"], pct(r["kpca_accuracy"]), pct(r["pca_accuracy"])]
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
