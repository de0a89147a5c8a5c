"""The typed model of ``report/metrics.json``; its JSON schema is generated from it.

:class:`Metrics` is what the evaluate stage writes (and validates before writing);
:data:`METRICS_SCHEMA` is ``Metrics.model_json_schema()`` (JSON Schema draft 2020-12),
kept in docs/metrics.schema.json for readers that do not run Python
(``python -m pipeline.evaluate.metrics > docs/metrics.schema.json``; a test keeps the
two equal). Bump :data:`METRICS_SCHEMA_VERSION` when a reader of an old file would
misread the new one.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "METRICS_SCHEMA",
    "METRICS_SCHEMA_VERSION",
    "Baseline",
    "Classification",
    "ClassifierInfo",
    "DataSummary",
    "GammaBest",
    "GammaSkipped",
    "GammaSweep",
    "Metrics",
    "ModelSummary",
    "Novelty",
    "PerClass",
    "Preprocess",
    "Quantiles",
    "Spectrum",
    "Sweep",
]

METRICS_SCHEMA_VERSION = 1

Prob = Annotated[float, Field(ge=0, le=1)]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]


class _Section(BaseModel):
    # every key is declared: a new number needs a field here (and a schema that says so)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PerClass(_Section):
    """One class's scores on the held-out rows (None: undefined, e.g. never predicted)."""

    class_: str = Field(alias="class")
    precision: Prob | None
    recall: Prob | None
    f1: Prob | None
    support: Count


class Classification(_Section):
    """A linear classifier trained on the training rows, scored on the held-out rows."""

    accuracy: Prob
    balanced_accuracy: Prob | None
    macro_f1: Prob | None
    n_test: Positive
    n_components: Positive
    converged: bool
    per_class: list[PerClass]
    confusion_matrix: list[list[Count]] = Field(
        description="confusion_matrix[i][j]: held-out rows of class i predicted as j"
    )


class Baseline(Classification):
    """The same classifier on linear PCA of the same rows."""

    method: Literal["pca", "incremental_pca"]
    explained_variance_ratio: list[float]


class DataSummary(_Section):
    n_rows: Annotated[int, Field(ge=2)]
    n_features: Positive
    n_train: Positive
    n_test: Positive
    classes: list[str] = Field(min_length=2)
    train_class_counts: list[int] | None
    test_class_counts: list[int]


class ModelSummary(_Section):
    kernel: dict[str, Any]
    n_components: Positive
    eigen_solver: str | None
    gamma: float | None


class ClassifierInfo(_Section):
    name: Literal["logistic", "linear_svc", "sgd"]
    C: float
    standardize: bool
    max_iter: int | None
    sgd_epochs: int | None


class Sweep(_Section):
    """Accuracy by number of components (kernel PCA components nest: no refit)."""

    n_components: list[Positive] = Field(min_length=1)
    kpca_accuracy: list[Prob]
    pca_accuracy: list[Prob | None] = Field(description="None above linear PCA's last k")
    skipped: list[int] = Field(description="asked-for k above the embedding's k")
    pca_max_components: Positive | None = Field(
        None, description="linear PCA's k when it is below kernel PCA's (written only then)"
    )


class GammaBest(_Section):
    gamma: float
    n_components: int
    cv_accuracy: Prob


class GammaSweep(_Section):
    """Cross-validated accuracy by kernel coefficient (rows) and number of components."""

    gamma: list[Annotated[float, Field(gt=0)]]
    n_components: list[int]
    cv_accuracy: list[list[Prob | None]]
    cv_std: list[list[float | None]]
    best: GammaBest
    cv_folds: int
    n_rows: int
    dropped_component_warnings: int
    classifier: str
    fitted_gamma: float


class GammaSkipped(_Section):
    skipped: str = Field(description="why no gamma was swept (e.g. a kernel without gamma)")


class Quantiles(_Section):
    min: float
    p05: float
    p25: float
    median: float
    p75: float
    p95: float
    p99: float
    max: float


class Novelty(_Section):
    """Reconstruction error in feature space (``score_samples``) of sampled rows."""

    n_test_scored: Count
    n_train_scored: Count
    test_quantiles: Quantiles | None
    train_quantiles: Quantiles | None
    train_p99: float | None
    test_fraction_above_train_p99: Prob | None


class Spectrum(_Section):
    eigenvalues: list[float]
    explained_variance_ratio: list[float]


class Preprocess(_Section):
    """The feature scaling the model applies (fitted on the training rows), and how far
    apart the raw columns' spreads are."""

    scale: Literal["none", "standard", "robust"]
    n_rows: Count = Field(description="training rows the scaling was fitted on")
    constant_columns: Count = Field(description="columns with zero spread (scaled by 1)")
    spread_ratio: float | None = Field(
        description="widest over narrowest non-constant column spread (std; IQR for robust)"
    )
    widest: str | None
    narrowest: str | None
    warning: str | None = Field(
        description="set when spreads differ by more than 1e3 and scale is 'none'"
    )


class Metrics(_Section):
    """A complete ``report/metrics.json``."""

    model_config = ConfigDict(
        title="kpca-dask evaluate metrics",
        json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"},
    )

    schema_version: Literal[1] = METRICS_SCHEMA_VERSION
    status: Literal["complete"] = "complete"
    created: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    data: DataSummary
    model: ModelSummary
    classifier: ClassifierInfo
    # headline numbers as top-level scalars (the manifest keeps scalars)
    n_components: Positive
    kpca_accuracy: Prob
    pca_accuracy: Prob
    margin: Annotated[float, Field(ge=-1, le=1)]
    kpca: Classification
    pca: Baseline
    sweep: Sweep
    gamma_sweep: GammaSweep | GammaSkipped | None
    novelty: Novelty
    spectrum: Spectrum
    preprocess: Preprocess | None = Field(
        None, description="the model's feature scaling (absent: a model without one)"
    )
    config: dict[str, Any] = Field(description="the evaluate section of the run's config")
    timings: dict[str, float] = Field(description="seconds per step")

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON object written to metrics.json (``sweep.pca_max_components`` only
        when linear PCA has fewer components than kernel PCA; ``preprocess`` only when the
        model records its scaling)."""
        skip: dict[str, Any] = {}
        if self.sweep.pca_max_components is None:
            skip["sweep"] = {"pca_max_components"}
        if self.preprocess is None:  # a model saved without a preprocess block
            skip["preprocess"] = True
        return self.model_dump(mode="json", by_alias=True, exclude=skip or None)


#: JSON Schema (draft 2020-12) of a complete ``report/metrics.json``, generated.
METRICS_SCHEMA: dict[str, Any] = Metrics.model_json_schema(by_alias=True)


if __name__ == "__main__":
    print(json.dumps(METRICS_SCHEMA, indent=2, sort_keys=True))
