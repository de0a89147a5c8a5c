"""Write a run's report: every plot the metrics allow, then report.md, into ``report/``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pipeline.output import Location

from .canvas import write_bytes
from .formatting import kernel_label
from .markdown import report_markdown
from .plots import plot_accuracy, plot_gamma_cv, plot_novelty, plot_scatter, plot_scree

__all__ = ["write_report"]

logger = logging.getLogger("pipeline.report")


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
    images: dict[str, str] = {}
    written: dict[str, str] = {}
    for name, data in _draw_plots(metrics, scatter, novelty):
        loc = rep.child(f"{name}.png")
        write_bytes(loc, data)
        images[name] = f"{name}.png"
        written[name] = str(loc)
    md = report_markdown(metrics, images=images, title=title, description=description)
    md_loc = rep.child("report.md")
    write_bytes(md_loc, md.encode("utf-8"))
    written["report"] = str(md_loc)
    logger.info("report: wrote %s to %s", ", ".join(sorted(written)), rep)
    return written


def _draw_plots(
    metrics: dict[str, Any],
    scatter: tuple[Any, Any] | None,
    novelty: tuple[Any, Any] | None,
) -> Iterator[tuple[str, bytes]]:
    """(name, PNG bytes) of each plot in page order, drawn one at a time (a generator)."""
    klabel = kernel_label(metrics.get("model", {}).get("kernel"))
    spec = metrics["spectrum"]
    yield (
        "scree",
        plot_scree(
            spec["eigenvalues"],
            spec["explained_variance_ratio"],
            title=f"Scree plot: kernel PCA, {klabel}",
        ),
    )
    if scatter is not None:
        emb, lab = scatter
        yield (
            "scatter",
            plot_scatter(
                emb,
                lab,
                classes=metrics["data"]["classes"],
                max_points=int(metrics.get("config", {}).get("max_scatter_points", 5000)),
                title=f"First two kernel principal components ({klabel})",
            ),
        )
    yield (
        "accuracy_vs_components",
        plot_accuracy(metrics["sweep"], kernel_label=klabel, majority=_majority_share(metrics)),
    )
    if novelty is not None:
        threshold = (metrics.get("novelty") or {}).get("train_p99")
        yield "novelty", plot_novelty(novelty[0], novelty[1], threshold=threshold)
    gs = metrics.get("gamma_sweep")
    if gs and "best" in gs:
        yield "gamma_cv", plot_gamma_cv(gs)


def _majority_share(metrics: dict[str, Any]) -> float | None:
    """Held-out accuracy of always predicting the most frequent held-out class."""
    counts = metrics["data"].get("test_class_counts") or []
    return max(counts) / sum(counts) if counts and sum(counts) else None
