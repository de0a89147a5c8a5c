"""The sections of a run's config for the stages after the fit and around it:
``evaluate``, ``preprocess``, ``denoise`` and ``update``."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .credentials import check_storage_options
from .sections import _estimator_rule, _Model

#: ``classifier="auto"`` switches from LogisticRegression (lbfgs, whole
#: training embedding in memory) to SGD (chunk by chunk) above this many
#: training rows. lbfgs time grows super-linearly with rows, SGD's linearly
#: (docs/tuning.md). The sweep fits two classifiers per sweep point
#: (kernel PCA and the baseline), so above ~50 000 rows lbfgs would make the
#: evaluate stage slower than the fit it evaluates; SGD also bounds memory by
#: one chunk instead of the whole embedding.
SGD_MIN_ROWS = 50_000


class EvaluateConfig(BaseModel):
    """The ``evaluate`` section of the pipeline config: classification of the embedding."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool | Literal["auto"] = Field(
        "auto",
        description="Run the evaluate stage: true, false, or 'auto' (when the input "
        "has a label column). With true and no labels the run fails "
        "before anything is fitted.",
    )
    test_fraction: float = Field(
        0.2,
        description="Share of labelled rows held out for testing, in (0, 1). The split "
        "is drawn before fitting (stored as <out>/split) and the model never "
        "sees held-out rows.",
    )
    stratify: bool = Field(
        True,
        description="Hold out the same share of every class (exact per class when the "
        "labels fit in memory, in expectation when they are a dask array).",
    )
    classifier: Literal["auto", "logistic", "linear_svc", "sgd"] = Field(
        "auto",
        description="Linear classifier trained on the embedding: 'logistic' "
        "(LogisticRegression, lbfgs), 'linear_svc' (LinearSVC), 'sgd' "
        "(SGDClassifier with log loss, trained chunk by chunk with "
        "partial_fit), or 'auto': logistic up to sgd_min_rows training "
        "rows, sgd above.",
    )
    sgd_min_rows: int = Field(
        SGD_MIN_ROWS,
        description="Training rows above which classifier='auto' uses SGD "
        "(lbfgs slows super-linearly with rows; docs/tuning.md).",
    )
    sgd_epochs: int = Field(
        5, description="Passes over the training rows for classifier='sgd'."
    )
    standardize: bool = Field(
        True,
        description="Scale every component to unit variance (StandardScaler fitted on "
        "training rows) before the classifier; kernel PCA components have "
        "very different variances, and L2-regularised classifiers are "
        "scale-sensitive.",
    )
    C: float = Field(
        1.0,
        description="Inverse regularisation strength of the classifier "
        "(SGD uses alpha = 1 / (C * n_train), the same objective).",
    )
    max_iter: int = Field(2000, description="Iteration cap of logistic / linear_svc.")
    sweep_components: list[int] | Literal["auto"] | None = Field(
        "auto",
        description="Numbers of components k at which accuracy is measured (kernel PCA "
        "and the linear PCA baseline); 'auto' takes about 1.5x steps "
        "(1, 2, 3, 4, 6, 8, 12, ...) up to the embedding's k; null only "
        "evaluates the full k. Values above the embedding's k are skipped.",
    )
    gamma_sweep: list[float] | Literal["auto"] | None = Field(
        None,
        description="Optional kernel coefficients to compare by cross-validation on the "
        "training split (kernel PCA refitted per fold on a subsample of "
        "cv_max_rows rows); 'auto' tries the fitted gamma times 1/4, 1/2, "
        "1, 2, 4. Evidence for choosing gamma and k; the run's model is not "
        "changed. Only for kernels with a gamma (rbf, laplacian, poly, "
        "sigmoid).",
    )
    cv_folds: int = Field(
        3, description="Stratified folds of the gamma cross-validation (2-20)."
    )
    cv_max_rows: int = Field(
        2000,
        description="Training rows subsampled for the gamma cross-validation (each fold "
        "fit is a dense kernel matrix on ~(1 - 1/cv_folds) of them).",
    )
    baseline_memory_mb: float = Field(
        512.0,
        description="Fit the linear PCA baseline with scikit-learn's PCA when the "
        "training rows of X fit in this many MB (float64), otherwise stream "
        "them through IncrementalPCA chunk by chunk.",
    )
    max_scatter_points: int = Field(
        5000, description="Rows drawn (uniformly, seeded) for the 2-D scatter plot."
    )
    max_novelty_points: int = Field(
        5000,
        description="Held-out rows (and as many training rows) scored with "
        "model.score_samples for the novelty histogram; each score costs "
        "one kernel evaluation per training row (exact models) or landmark.",
    )
    random_state: int = Field(0, description="Seed of the split, subsamples, CV folds and SGD.")
    report: bool = Field(
        True, description="Write the plots and report.md next to metrics.json."
    )

    # -- validators: messages name the field, the value and the fix ----------------
    @field_validator("test_fraction")
    @classmethod
    def _check_test_fraction(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.0 < v < 1.0):
            raise ValueError(
                f"test_fraction must be strictly between 0 and 1 (the share of labelled rows "
                f"held out for testing, e.g. 0.2); got {v!r}"
            )
        return v

    @field_validator(
        "sgd_min_rows", "sgd_epochs", "max_iter", "max_scatter_points", "max_novelty_points"
    )
    @classmethod
    def _check_positive_int(cls, v: int, info: Any) -> int:
        if v < 1:
            raise ValueError(f"{info.field_name} must be a positive integer; got {v!r}")
        return v

    @field_validator("C", "baseline_memory_mb")
    @classmethod
    def _check_positive_real(cls, v: float, info: Any) -> float:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{info.field_name} must be a positive finite number; got {v!r}")
        return v

    @field_validator("cv_folds")
    @classmethod
    def _check_folds(cls, v: int) -> int:
        if not 2 <= v <= 20:
            raise ValueError(
                f"cv_folds must be between 2 and 20 (cross-validation needs at "
                f"least two folds); got {v!r}"
            )
        return v

    @field_validator("cv_max_rows")
    @classmethod
    def _check_cv_rows(cls, v: int) -> int:
        if v < 20:
            raise ValueError(
                f"cv_max_rows must be at least 20 (each fold needs rows of every "
                f"class); got {v!r}"
            )
        return v

    @field_validator("sweep_components")
    @classmethod
    def _check_sweep(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError(
                    "sweep_components must not be empty: list some k (e.g. "
                    "[2, 4, 8, 16]), or use 'auto', or null for the full k only"
                )
            bad = [k for k in v if k < 1]
            if bad:
                raise ValueError(
                    f"sweep_components must be positive numbers of components; got {bad}"
                )
            return sorted(set(v))
        return v

    @field_validator("gamma_sweep")
    @classmethod
    def _check_gammas(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError(
                    "gamma_sweep must not be empty: list kernel coefficients "
                    "(e.g. [0.01, 0.1, 1]), use 'auto', or null to skip it"
                )
            bad = [g for g in v if not (math.isfinite(g) and g > 0)]
            if bad:
                raise ValueError(
                    f"gamma_sweep values must be positive finite numbers; got {bad}"
                )
            return sorted(set(float(g) for g in v))
        return v


#: Names an output array may not take: the other artifacts of a run.
RESERVED_NAMES = {
    "embedding",
    "spectrum",
    "labels",
    "ids",
    "split",
    "model",
    "report",
    "work",
    "manifest",
    "embedding.parquet",
}


class PreprocessConfig(_Model):
    """Feature scaling, fitted on the training rows and stored with the model."""

    scale: Literal["standard", "robust", "none"] = Field(
        "standard",
        description="'standard': subtract the mean, divide by the standard deviation "
        "(scikit-learn's StandardScaler); 'robust': median and inter-quartile "
        "range (RobustScaler; exact up to 16 million training rows, "
        "approximate beyond); 'none': the raw values (the run warns when "
        "column spreads differ by more than 1e3). Fitted on the training rows "
        "only, stored in the model, applied by transform and undone by the "
        "pre-image; gamma: scale is computed after scaling. Constant columns "
        "are scaled by 1. Why 'standard' is the default: docs/evaluate.md.",
    )


class DenoiseConfig(BaseModel):
    """Pre-images of the embedding ("denoised" rows), written next to the embedding."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        False,
        description="Write denoised rows (pre-images of their embedding). The solve "
        "stage then also fits the pre-image map (fit_inverse_transform).",
    )
    preimage: Literal["auto", "learned", "fixed_point", "exact"] = Field(
        "auto",
        description="'learned': kernel ridge regression from the embedding back to the "
        "inputs (scikit-learn's map); 'fixed_point': Mika et al.'s iteration "
        "(rbf only), started from the learned one; 'exact': linear kernel "
        "only (linear PCA's reconstruction); 'auto': exact for the linear "
        "kernel, learned otherwise.",
    )
    alpha: float = Field(
        1.0, description="Ridge term of the learned pre-image (scikit-learn's alpha)."
    )
    sample_size: int | Literal["auto"] = Field(
        "auto",
        description="Training rows the learned pre-image is fitted on (one "
        "sample_size^2 solve): 'auto' is the landmarks for Nyström, "
        "min(n_train, 2048) rows for exact solvers; all rows if larger "
        "than the training set.",
    )
    tol: float = Field(
        1e-5,
        description="Fixed point: converged when a step moves a row "
        "by at most tol times the data scale.",
    )
    max_iter: int = Field(
        100,
        description="Fixed point: iteration cap; rows that do not "
        "converge keep the learned pre-image.",
    )
    rows: Literal["all", "held_out", "train"] = Field(
        "all",
        description="Which ingested rows to denoise: every row, only the held-out "
        "(evaluation) rows, or only the training rows.",
    )
    max_rows: int | None = Field(
        None,
        ge=1,
        description="Denoise at most this many of the selected rows (the first "
        "ones, in row order); null for all of them.",
    )
    output_name: str = Field(
        "denoised",
        description="Array name under the run folder; the row index of a subset "
        "goes to '<output_name>_rows'.",
    )

    _estimator_rules = _estimator_rule("denoise")

    @field_validator("output_name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if (
            not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", v)
            or v in RESERVED_NAMES
            or v.startswith("..")
        ):
            raise ValueError(
                f"output_name {v!r} must be a plain array name (letters, digits, "
                f"_ . -) other than {sorted(RESERVED_NAMES)}"
            )
        return v


class UpdateConfig(_Model):
    """`kpca update`: the drift checks on a new batch and what to do about drift."""

    base: str | None = Field(
        None,
        description="The published run an update starts from (set by `kpca update RUN`); "
        "null for a full run.",
    )
    base_storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec options of the base run when it is an object-store URL (set by "
        "`kpca update --storage-options`); credentials are refused, as in "
        "output.storage_options.",
    )
    reembed: bool = Field(
        False,
        description="After a merge, embed every row again with the updated model (reads all "
        "rows); false keeps the published rows' embedding and appends the batch's. Refits "
        "always embed every row.",
    )
    policy: Literal["auto", "merge", "refresh_landmarks", "refit"] = Field(
        "auto",
        description="'merge': add the batch to the Nyström statistics (exact, reads only "
        "the batch); 'refresh_landmarks': new landmarks and a fit on all rows; 'refit': a "
        "fit on all rows with the configured solver; 'auto': merge unless the drift report "
        "flags the batch, then `on_drift`.",
    )
    on_drift: Literal["merge", "refresh_landmarks", "refit"] = Field(
        "refresh_landmarks",
        description="What policy 'auto' does with a flagged batch. An exact base model "
        "(dense, randomized, arpack) has no landmarks: 'refresh_landmarks' refits it with "
        "its own solver (an explicit `policy: refresh_landmarks` makes it Nyström).",
    )
    kernel_params: Literal["keep", "resolve"] = Field(
        "keep",
        description="'keep': a refit or refresh_landmarks uses the base model's kernel "
        "parameters (gamma resolved once, at the first fit); 'resolve': resolve them "
        "again from the config on every row (e.g. gamma: scale). The report and the "
        "manifest (update.changes) say which changed and why.",
    )
    unlabelled: bool = Field(
        False,
        description="Accept a batch without the base run's label column (`kpca update "
        "--unlabelled`): its rows get no label (code -1, an empty label in Parquet); the "
        "base rows keep theirs.",
    )
    no_ids: bool = Field(
        False,
        description="Accept a batch without the base run's id column (`kpca update "
        "--no-ids`): the new run then has no ids array (its first rows are the base run's, "
        "in order; join them through the base run's ids).",
    )

    batch: dict[str, Any] | None = Field(
        None,
        description="The batch's identity (path, sha256, size, etag, version_id; set by "
        "`kpca update`), recorded in the lineage: a batch is merged once (docs/update.md).",
    )
    duplicate_ids: Literal["refuse", "keep"] = Field(
        "refuse",
        description="A batch carrying ids the series already has: 'refuse' (the update "
        "fails in one line naming a few, nothing published: ids stay unique join keys); "
        "'keep' adds the rows anyway (a re-sent id is a new observation; finding "
        "duplicate_ids).",
    )

    @field_validator("base_storage_options")
    @classmethod
    def _no_base_credentials(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_storage_options(v, "update.base_storage_options")

    novelty_pvalue: float = Field(
        1e-3,
        gt=0,
        lt=1,
        description="Flag the batch when the two-sample KS test of its novelty scores "
        "against the training rows' has a p-value below this (the false-positive rate on "
        "i.i.d. batches).",
    )
    novelty_effect: float = Field(
        1.25,
        ge=1,
        description="A novelty flag also needs the batch's median novelty score to be at "
        "least this many times the training rows' (a large batch makes tiny differences "
        "significant).",
    )
    captured_drop: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Flag the batch when the share of its kernel variance the components "
        "capture is this much (absolute) below the training rows'.",
    )
    mean_shift: float = Field(
        0.5,
        gt=0,
        description="Flag the batch when its embedding mean moves by more than this many "
        "training standard deviations along any component.",
    )
    spread_ratio: float = Field(
        2.0,
        gt=1,
        description="Flag the batch when its embedding spread along any component is more "
        "than this factor above or below the training rows'.",
    )
    reference_rows: int = Field(
        4096,
        ge=50,
        description="Training rows sampled (seeded, landmarks excluded) as the drift "
        "reference.",
    )
