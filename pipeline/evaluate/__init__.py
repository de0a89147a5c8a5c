"""Evaluate stage: how good is the embedding for downstream classification?

Kernel PCA's classic result (Schölkopf, Smola and Müller 1998) is that a
*linear* classifier on nonlinear principal components does as well as a
nonlinear classifier on the raw inputs. This stage lets a user check that on
their own data, in the same run that produced the embedding:

1. a linear classifier (logistic regression, linear SVM, or SGD for
   embeddings too large for memory) is trained on the training rows of the
   kernel PCA embedding and scored on the held-out rows, which the pipeline
   embedded with the saved model's ``transform`` (the model never saw them);
2. the same classifier is trained on linear PCA with the same number of
   components (fitted on the training rows only) as a baseline;
3. accuracy is swept over the number of components ``k``: kernel PCA
   components nest (the first ``k`` columns of the embedding are the
   ``k``-component embedding), so the sweep needs no refit;
4. optionally, the kernel coefficient ``gamma`` is chosen by
   cross-validation on (a subsample of) the training split;
5. ``<out>/report/metrics.json`` is written (the typed model
   :class:`~pipeline.evaluate.metrics.Metrics`; its generated JSON schema is
   :data:`METRICS_SCHEMA`) and :func:`pipeline.evaluate.report.write_report` draws
   the plots and report.md.

Modules: ``split`` (the seeded train/test split), ``classify`` (classifiers,
confusion matrices, metrics, the component sweep), ``baseline`` (linear PCA),
``gamma`` (the cross-validated gamma sweep), ``metrics`` (the metrics.json model),
``run_folder`` (what the stage reads from a run folder, checked), ``stage``
(:func:`evaluate_run`: the steps above over one run folder) and ``report`` (the
plots, report.md and the Prefect artifact summary). The
array-level functions (:func:`make_split`, :func:`evaluate_embeddings`,
:func:`linear_pca_baseline`, :func:`component_sweep`, :func:`gamma_cv_sweep`)
work on numpy or dask arrays and know nothing about run folders;
:func:`evaluate_run` is the stage that reads a run folder (layout in
docs/artifacts.md).

Memory model: with ``classifier="logistic"`` or ``"linear_svc"`` the training
embedding (``n_train x k`` float64) is loaded; with ``"sgd"`` only one row
chunk at a time is (a scaling pass, ``sgd_epochs`` passes, one test pass, all
sweep points trained from the same pass). The linear PCA baseline loads the
training rows of X only when they fit in ``baseline_memory_mb``; otherwise it
streams them through :class:`~sklearn.decomposition.IncrementalPCA`.
Held-out rows are always predicted chunk by chunk. Novelty scores and the
scatter plot use documented subsamples (``max_novelty_points``,
``max_scatter_points``). The split mask is held in memory (1 byte per row).
"""

from ..config import SGD_MIN_ROWS, EvaluateConfig
from ..errors import EvaluationError
from .baseline import linear_pca_baseline
from .classify import (
    classification_metrics,
    component_sweep,
    evaluate_embeddings,
    resolve_classifier,
    resolve_sweep,
)
from .gamma import gamma_cv_sweep
from .metrics import METRICS_SCHEMA, METRICS_SCHEMA_VERSION
from .split import make_split
from .stage import evaluate_run

__all__ = [
    "METRICS_SCHEMA",
    "METRICS_SCHEMA_VERSION",
    "SGD_MIN_ROWS",
    "EvaluateConfig",
    "EvaluationError",
    "classification_metrics",
    "component_sweep",
    "evaluate_embeddings",
    "evaluate_run",
    "gamma_cv_sweep",
    "linear_pca_baseline",
    "make_split",
    "resolve_classifier",
    "resolve_sweep",
]
