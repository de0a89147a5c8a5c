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
a table for Prefect artifacts (this package does not import Prefect).

Modules: ``canvas`` (sizes, the Agg figure, PNG bytes, atomic writes),
``formatting`` (numbers, kernel labels, markdown tables), ``plots`` (the five
plots), ``markdown`` (report.md, one function per section), ``write``
(:func:`write_report`) and ``summary`` (:func:`artifact_summary`). Matplotlib
is imported inside the functions that draw, so importing this package is light.
"""

from .canvas import DPI, FIGSIZES, png_size
from .markdown import report_markdown
from .plots import plot_accuracy, plot_gamma_cv, plot_novelty, plot_scatter, plot_scree
from .summary import artifact_summary
from .write import write_report

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
