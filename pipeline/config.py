"""The one validated configuration of a pipeline run (pydantic v2, loadable from YAML).

Every field is documented (``Field(description=...)``), unknown keys are
refused, and values are checked with messages that name the field and the
fix. ``PipelineConfig.from_yaml(path)`` uses ``yaml.safe_load``: a config file
can never execute code. Secrets never belong here: object-store credentials
come from the environment (or a Prefect block in the flows), and storage
options that look like credentials are refused.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .errors import UserError

__all__ = [
    "InputConfig",
    "KernelConfig",
    "SolverConfig",
    "ChunkConfig",
    "KernelStoreConfig",
    "OutputConfig",
    "TLSConfig",
    "ClusterConfig",
    "DenoiseConfig",
    "EvaluateConfig",
    "PreprocessConfig",
    "PipelineConfig",
    "RESERVED_NAMES",
    "SGD_MIN_ROWS",
    "ConfigError",
    "check_storage_options",
    "load_config",
    "parse_storage_options",
    "format_validation_error",
]

#: storage_options keys that carry credentials: refused in config files.
SECRET_KEYS = {
    "key",
    "secret",
    "token",
    "password",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "client_secret",
    "account_key",
    "sas_token",
    "credentials",
    "session_token",
    # short names compared whole (as parts of other names they mean other things)
    "sig",
    "sas",
    "auth",
    "pwd",
    "pass",
    "passphrase",
    "cookie",
    "apikey",
    "x-api-key",
}
#: ... and words that mark a credential anywhere in a key's name (api_key, connection_string,
#: an Authorization header, X-Amz-Security-Token, refresh_token...), case-insensitive.
SECRET_WORDS = (
    "secret",
    "password",
    "passwd",
    "token",
    "signature",
    "credential",
    "private_key",
    "privatekey",
    "api_key",
    "api-key",
    "apikey",
    "access_key",
    "accesskey",
    "account_key",
    "accountkey",
    "connection_string",
    "connectionstring",
    "authorization",
    "sas_",
    "_sas",
    "bearer",
    "cookie",
)
#: values that are credentials whatever their key is called (never echoed in messages)
_SECRET_VALUES = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("an HTTP authorization value", re.compile(r"^\s*(Bearer|Basic|Token)\s+\S{8,}", re.I)),
    (
        "an Azure connection string or SAS",
        re.compile(r"(AccountKey|SharedAccessSignature|SharedAccessKey)=|[?&]sig=", re.I),
    ),
    ("a JSON web token", re.compile(r"\beyJ[\w-]{8,}\.[\w-]{8,}\.")),
    (
        "an API token",
        re.compile(
            r"\b(gh[pousr]_[A-Za-z0-9]{20,}|xox[abp]-[\w-]{10,}|"
            r"sk-[A-Za-z0-9]{20,}|AIza[\w-]{30,})"
        ),
    ),
    ("a long hex string", re.compile(r"^[0-9a-fA-F]{32,}$")),
    (
        "a long base64 string",
        re.compile(
            r"^(?=[^0-9]*[0-9])(?=[^a-z]*[a-z])(?=[^A-Z]*[A-Z])[A-Za-z0-9+/]{32,}={0,2}$"
        ),
    ),
)


def _secret_value(v: Any) -> str | None:
    """What kind of credential a string value looks like (None: it does not)."""
    if not isinstance(v, str):
        return None
    for what, pattern in _SECRET_VALUES:
        if pattern.search(v):
            return what
    return None


#: values of a credential-named key that name a way to authenticate, not a secret: gcsfs's
#: ``token`` methods ("anon" is how public GCS buckets are read)
NON_SECRET_VALUES = {"anon", "google_default", "cache", "cloud", "browser"}


def _is_secret_key(k: Any, v: Any = "?") -> bool:
    """Whether option ``k`` (with value ``v``) carries a credential. No value (None, a
    bool: ``anon: true``) and a named authentication method (``token: anon``) do not."""
    if v is None or isinstance(v, bool):
        return False
    if isinstance(v, str) and v.strip().lower() in NON_SECRET_VALUES:
        return False
    name = str(k).lower()
    return name in SECRET_KEYS or any(w in name for w in SECRET_WORDS)


def _secret_keys(options: Any, prefix: str = "") -> list[str]:
    """Keys (dotted, at any depth: client_kwargs, headers, config_kwargs...) that carry
    credentials, by their name or by the shape of their value (a value is never returned,
    only where it is)."""
    found = []
    if isinstance(options, dict):
        for k, v in options.items():
            name = f"{prefix}{k}"
            what = _secret_value(v)
            if _is_secret_key(k, v):
                found.append(name)
            elif what:
                found.append(f"{name} (its value looks like {what})")
            found += _secret_keys(v, name + ".")
    elif isinstance(options, (list, tuple)):
        for i, v in enumerate(options):
            what = _secret_value(v)
            if what:
                found.append(f"{prefix}{i} (its value looks like {what})")
            found += _secret_keys(v, f"{prefix}{i}.")
    return found


def _check_url(v: str, what: str) -> str:
    if not v.strip():
        raise ValueError(f"{what} path is empty")
    if "://" in v:
        netloc = v.split("://", 1)[1].split("/", 1)[0]
        if "@" in netloc:
            raise ValueError(
                "URLs with embedded credentials (user:password@host) are refused; "
                "use the environment for credentials."
            )
        query = v.split("?", 1)[1] if "?" in v else ""
        from urllib.parse import unquote

        pairs = [q.split("=", 1) for q in query.replace(";", "&").split("&") if q]
        params = {unquote(p[0]): unquote(p[1]) if len(p) > 1 else "" for p in pairs}
        bad = _secret_keys(params)
        if bad:
            names = [b.split(" ", 1)[0] for b in bad]
            raise ValueError(
                f"URLs with credentials in the query string ({names}) are "
                "refused; use the environment for credentials."
            )
    return v


def check_storage_options(v: Any, what: str = "storage_options") -> dict[str, Any]:
    """``v`` if it is a mapping of fsspec options without credentials; else ValueError
    naming the keys (never their values) and where credentials belong."""
    if not isinstance(v, dict):
        raise ValueError(f"{what} must be a mapping of fsspec options, not {type(v).__name__}")
    bad = sorted(_secret_keys(v))
    if bad:
        raise ValueError(
            f"{what} must not hold credentials ({bad}); set them in the "
            "environment (e.g. AWS_ACCESS_KEY_ID) or a Prefect block instead."
        )
    return v


#: the smallest ``cluster.memory_limit`` a worker can run in
MIN_WORKER_MEMORY = 256 << 20


class ConfigError(UserError, ValueError):
    """A configuration file or object is invalid (message lists every problem)."""


class _Model(BaseModel):
    # hide_input_in_errors: a refused credential is never echoed, also by pydantic's own
    # error text (the Python API, Prefect parameters), not only by load_config's summary
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, hide_input_in_errors=True
    )


class InputConfig(_Model):
    """Where the data are and which columns to use."""

    path: str = Field(
        description="Input file, folder or URL (local path or any fsspec URL, "
        "e.g. s3://bucket/data.parquet; s3 needs s3fs installed)."
    )
    format: Literal["auto", "npy", "csv", "parquet", "zarr"] = Field(
        "auto",
        description="Input format; 'auto' infers it from the path's suffix "
        "(.npy, .csv, .parquet/.pq or a folder of Parquet files, .zarr).",
    )
    columns: list[str] | None = Field(
        None,
        description="Feature columns by name for CSV/Parquet (default: every column "
        "except the label, id and excluded columns; numeric and bool columns only).",
    )
    exclude_columns: list[str] | None = Field(
        None,
        description="Columns that are not features, left out of the default selection "
        "(e.g. a numeric code or timestamp; non-numeric columns are left out anyway, "
        "with a warning this silences; docs/config.md, 'Feature columns').",
    )
    label_column: str | None = Field(
        None, description="Optional class label column, kept alongside (enables evaluation)."
    )
    id_column: str | None = Field(None, description="Optional row id column, kept alongside.")
    zarr_array: str | None = Field(
        None,
        description="Array path inside a zarr group input (default: the root array or 'X').",
    )
    nonfinite: Literal["error", "drop"] = Field(
        "error",
        description="NaN/inf policy: 'error' stops before anything is written; "
        "'drop' removes such rows and reports how many.",
    )
    missing_chunks: Literal["error", "fill"] = Field(
        "error",
        description="zarr input whose store lacks chunk files: 'error' refuses it "
        "(zarr would read them as zeros); 'fill' reads them as the "
        "array's fill value, deliberately (zarr writes no chunk equal to "
        "the fill value unless write_empty_chunks is set).",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra fsspec options (e.g. {'anon': true} or an "
        "endpoint_url). Credentials are refused here: use the environment.",
    )

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_storage_options(v)

    @field_validator("path")
    @classmethod
    def _no_embedded_credentials(cls, v: str) -> str:
        return _check_url(v, "input")

    @field_validator("zarr_array")
    @classmethod
    def _inside_the_store(cls, v: str | None) -> str | None:
        if v is None:
            return v
        import posixpath

        norm = posixpath.normpath(v.replace("\\", "/"))
        if (
            not v.strip()
            or v.startswith(("/", "\\"))
            or norm == ".."
            or norm.startswith("../")
            or "://" in v
        ):
            raise ValueError(
                f"zarr_array {v!r} must be a relative path inside the input store "
                "(no '..', no leading '/', no URL)"
            )
        return v


def _estimator_rule(section: str) -> Any:
    """A validator that checks a section's fields by the estimator's own rules for the
    parameters they set (pipeline/fitspec.py; kpca_dask/plan.py): one validation system
    for estimator parameters, run when the file is loaded; pydantic checks the types."""

    def check(cls: Any, v: Any, info: ValidationInfo) -> Any:
        from .fitspec import check_field

        field = cls.model_fields[info.field_name]
        nullable = field.annotation is None or type(None) in get_args(field.annotation)
        return check_field(f"{section}.{info.field_name}", v, nullable=nullable)

    return field_validator("*")(classmethod(check))


class KernelConfig(_Model):
    """The kernel (names as in scikit-learn; default rbf with gamma 'scale', not linear)."""

    name: Literal["linear", "poly", "rbf", "laplacian", "sigmoid", "cosine"] = Field(
        "rbf", description="Kernel function."
    )
    gamma: float | Literal["scale"] | None = Field(
        "scale",
        description="Kernel coefficient: a positive number, null for 1/n_features, "
        "or 'scale' for the median heuristic.",
    )
    degree: float = Field(3, description="Degree of the polynomial kernel.")
    coef0: float = Field(1.0, description="Independent term of the poly/sigmoid kernels.")

    _estimator_rules = _estimator_rule("kernel")


class SolverConfig(_Model):
    """Which eigensolver, how many components, and its accuracy knobs."""

    n_components: int = Field(16, description="Number of principal components.")
    eigen_solver: Literal["auto", "dense", "randomized", "nystroem"] = Field(
        "auto",
        description="'dense' (n <= ~20k), 'randomized' (exact, implicit kernel "
        "matrix), 'nystroem' (linear in n), or 'auto'.",
    )
    dtype: Literal["float32", "float64"] = Field(
        "float32",
        description="Precision of kernel evaluation (float32 is 2-3x faster, "
        "eigenvalues typically within 1e-7 relative).",
    )
    n_oversamples: int = Field(16, description="Extra columns of the randomized block.")
    n_power_iter: int | Literal["auto"] = Field(
        "auto", description="Randomized passes after the first, or 'auto' (stop at tol)."
    )
    tol: float | None = Field(
        None,
        gt=0,
        description="Convergence tolerance of the randomized solver (default by dtype).",
    )
    max_iter: int = Field(20, description="Cap on randomized passes.")
    random_state: int | None = Field(0, description="Seed (test matrix, landmarks, split).")
    max_residual: float | None = Field(
        1e-2,
        gt=0,
        description="Largest certified residual ||Kc v - lambda v|| / lambda a "
        "published model may have (typical: 1e-4 float32, 1e-7 float64); "
        "a fit above it is refused, not published. null disables.",
    )
    n_landmarks: int | None = Field(
        None, description="Nyström landmarks m (default chosen by the solver)."
    )
    landmark_method: Literal["uniform", "kmeans++", "rpcholesky"] = Field(
        "rpcholesky", description="How Nyström landmarks are chosen."
    )
    keep_statistics: bool | Literal["auto"] = Field(
        True,
        description="Nyström: keep the sufficient statistics (m x m float64) in the model so "
        "that `kpca update` adds rows exactly (docs/update.md); true makes the Nyström "
        "solve use one covariance pass; 'auto' keeps them only when that method is chosen "
        "anyway.",
    )

    _estimator_rules = _estimator_rule("solver")


class ChunkConfig(_Model):
    """How data are chunked."""

    target_chunk_mb: float = Field(
        64.0,
        gt=0,
        allow_inf_nan=False,
        description="Target size of one ingested row chunk in MB (50-200 MB suits clusters).",
    )
    block_rows: int | Literal["auto"] = Field(
        "auto",
        description="Rows per block of the kernel partition ('auto': ~2048, ~4096 from "
        "50 000 rows, larger beyond ~350 000; docs/scaling.md).",
    )

    _estimator_rules = _estimator_rule("chunks")


class KernelStoreConfig(_Model):
    """Whether the exact path materialises the kernel matrix in zarr."""

    materialize: Literal["auto", "always", "never"] = Field(
        "auto",
        description="'auto' materialises when reading a stored block is cheaper than "
        "recomputing it (large n_features; see docs/kernel-store.md).",
    )
    verify: bool = Field(
        True,
        description="On resume, re-read blocks marked done and check "
        "their checksum before skipping them.",
    )


class OutputConfig(_Model):
    """Where the artifacts go."""

    path: str = Field("kpca-output", description="Output folder or URL of this run.")
    parquet: bool = Field(
        True,
        description="Also write the embedding as Parquet (id, label, "
        "components) for downstream tools.",
    )
    overwrite: bool = Field(
        False, description="Replace a complete run at the same path (otherwise refused)."
    )
    keep_versions: int = Field(
        7,
        ge=1,
        le=1000,
        description="How many published versions of the output are kept (the published "
        "one included); older ones are deleted after a new one is published.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec options of the output location (and of its work/ and model/ "
        "folders), e.g. an endpoint_url; never borrowed from input.storage_options. "
        "Credentials are refused here: use the environment.",
    )

    @field_validator("path")
    @classmethod
    def _sane_output(cls, v: str) -> str:
        return _check_url(v, "output")

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_storage_options(v)


class TLSConfig(_Model):
    """TLS material for a tls:// scheduler (file paths, never key contents)."""

    ca_file: str = Field(description="CA certificate file (PEM).")
    client_cert: str = Field(description="Client certificate file (PEM).")
    client_key: str = Field(description="Client private key file (PEM).")


class ClusterConfig(_Model):
    """The Dask cluster to run on."""

    address: str = Field(
        "",
        description="Scheduler address (tcp://host:8786 or "
        "tls://host:8786); empty starts a local cluster.",
    )
    n_workers: int | None = Field(
        None, ge=1, description="Local cluster workers (default: one per core)."
    )
    threads_per_worker: int = Field(1, ge=1, description="Threads per local worker.")
    memory_limit: str = Field(
        "auto", description="Memory limit per local worker, e.g. '4GiB' or 'auto'."
    )
    dashboard_address: str | None = Field(
        "127.0.0.1:0",
        description="Local dashboard bind address (localhost only by default; "
        "null disables it).",
    )
    tls: TLSConfig | None = Field(None, description="TLS files for a tls:// scheduler.")
    connect_timeout: float = Field(30.0, gt=0, description="Seconds to wait for the scheduler.")
    paused_timeout: float | None = Field(
        300.0,
        gt=0,
        description="Fail the run when every worker has been paused at its "
        "memory limit for this many seconds with work pending (a paused worker whose memory "
        "never drops would wait forever); null waits forever.",
    )
    worker_timeout: float | None = Field(
        120.0,
        gt=0,
        description="Seconds a Dask worker may go without answering (no heartbeat to the "
        "scheduler, no reply to the visibility probe) before the run stops with one line "
        "naming it (exit 1); a stopped or cut-off worker would otherwise hang the run for "
        "ever. Well above the workers' heartbeat interval (0.5-5 s); null waits forever. "
        "See docs/cluster.md.",
    )

    @field_validator("memory_limit")
    @classmethod
    def _sane_memory_limit(cls, v: str) -> str:
        """'auto' or a size of at least 256 MiB: a worker below it dies (or pauses) on its
        first block, and the run ends in a traceback from deep inside Dask."""
        if v.strip().lower() == "auto":
            return v
        from dask.utils import parse_bytes

        try:
            n = parse_bytes(v)
        except (ValueError, TypeError):
            raise ValueError(
                f"memory_limit {v!r} is not a size; write e.g. '4GiB' or 'auto'"
            ) from None
        if n < MIN_WORKER_MEMORY:
            raise ValueError(
                f"memory_limit {v!r} is below the minimum: a worker needs at "
                "least 256 MiB (e.g. '4GiB', or 'auto')"
            )
        return v

    @model_validator(mode="after")
    def _tls_matches_scheme(self):
        if self.address.startswith("tls://") and self.tls is None:
            raise ValueError(
                "a tls:// address needs the 'tls' section (ca_file, client_cert, client_key)"
            )
        if self.address and not self.address.startswith(("tcp://", "tls://", "inproc://")):
            raise ValueError(
                f"scheduler address {self.address!r} must start with tcp:// or "
                "tls:// (or be empty for a local cluster)"
            )
        return self


# ---------------------------------------------------------------- evaluate, denoise
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


class PipelineConfig(_Model):
    """A whole pipeline run."""

    input: InputConfig
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    kernel: KernelConfig = Field(default_factory=KernelConfig)
    solver: SolverConfig = Field(default_factory=SolverConfig)
    chunks: ChunkConfig = Field(default_factory=ChunkConfig)
    kernel_store: KernelStoreConfig = Field(default_factory=KernelStoreConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    denoise: DenoiseConfig = Field(default_factory=DenoiseConfig)
    update: UpdateConfig = Field(default_factory=UpdateConfig)

    @classmethod
    def from_yaml(cls, path: str | Path) -> PipelineConfig:
        """Load and validate a YAML file (``yaml.safe_load``: no code runs)."""
        return load_config(path)

    def to_json_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line for one problem ("invalid configuration in run.yaml: kernel.gamma: ..."),
    else a header line and one line per problem."""
    lines = [f"invalid configuration in {source}:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/config.md)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"  - {where}: {msg}")
    if len(lines) == 2:
        return f"{lines[0]} {lines[1].removeprefix('  - ')}"
    return "\n".join(lines)


#: bounds on a config file: its size, YAML aliases (an alias bomb expands exponentially
#: when the mapping is walked) and nodes (scalars, lists and mappings)
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no code runs) that stops at MAX_YAML_ALIASES aliases and
    MAX_YAML_NODES nodes while composing, before anything is expanded."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _YamlBoundError(f"more than {MAX_YAML_ALIASES} YAML aliases (*name)")
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise _YamlBoundError(f"more than {MAX_YAML_NODES} YAML nodes")
        return super().compose_node(parent, index)


class _YamlBoundError(Exception):
    pass


def _safe_yaml(text: str) -> Any:
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_config(source: str | Path | dict[str, Any]) -> PipelineConfig:
    """Validate a config from a YAML path or a dict; raise ConfigError listing every problem."""
    name = str(source) if not isinstance(source, dict) else "the given mapping"
    if isinstance(source, dict):
        data = source
    else:
        p = Path(source)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist (or is not a file)")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"config file {p} is larger than a config can be "
                f"({MAX_CONFIG_BYTES} bytes); point at the run's YAML file."
            )
        try:
            data = _safe_yaml(p.read_text())
        except _YamlBoundError as exc:
            raise ConfigError(
                f"config file {p} has {exc}: refused (an alias bomb?); write the values out."
            ) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {p} is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); save it as UTF-8 YAML."
            ) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(
                f"config file {p} is not valid YAML ({what}{where}); fix its "
                "syntax (see deploy/examples/run.yaml)."
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, name)) from None


#: the largest storage-options file a command reads
MAX_OPTIONS_BYTES = 64 << 10


def parse_storage_options(value: str | None, flag: str = "--storage-options") -> dict[str, Any]:
    """A command's ``--storage-options``: inline JSON (``'{"anon": true}'``) or the path
    of a small YAML/JSON file holding one mapping; ``{}`` for None or empty. Credential
    keys are refused as in a config's ``storage_options`` (ConfigError, one line)."""
    if value is None or not value.strip():
        return {}
    text = value.strip()
    if text.startswith("{"):
        source = ""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(
                f"{flag} is not valid JSON ({exc}); pass a JSON object such as "
                "'{\"anon\": true}' or the path of a YAML file."
            ) from None
    else:
        p = Path(text)
        source = f" (in {p})"
        if not p.is_file():
            raise ConfigError(
                f"{flag} {text!r} is neither a JSON object nor an existing file; pass "
                '\'{"client_kwargs": {"endpoint_url": "..."}}\' or the path of a YAML file.'
            )
        if p.stat().st_size > MAX_OPTIONS_BYTES:
            raise ConfigError(
                f"{flag} file {p} is larger than storage options can be "
                f"({MAX_OPTIONS_BYTES} bytes); point at a small YAML/JSON mapping."
            )
        try:
            data = _safe_yaml(p.read_text())
        except (_YamlBoundError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{flag} file {p} is not a valid YAML/JSON mapping "
                f"({str(exc).splitlines()[0]}); fix its syntax."
            ) from None
    if data is None:
        return {}
    try:
        return check_storage_options(data, flag)
    except ValueError as exc:
        raise ConfigError(f"{exc}{source}") from None


def _type_name(t: Any) -> str:
    if isinstance(t, type):
        return t.__name__
    text = str(t).replace("typing.", "").replace("NoneType", "None")
    for cls in (str, int, float, bool, dict, list):
        text = text.replace(f"<class '{cls.__name__}'>", cls.__name__)
    if text.startswith("Union[") and text.endswith("]"):
        text = " | ".join(part.strip() for part in text[6:-1].split(", ") if part)
    return text.replace("pipeline.config.", "").replace("__main__.", "")


#: prose after a section's table in docs/config.md (the policies its fields select)
REFERENCE_NOTES: dict[str, str] = {
    "input": """### Feature columns (CSV and Parquet)

Which columns of a table are features (pipeline/features.py):

- **Numeric** columns (integers, floats) are features. Without `input.columns`, every
  column except `id_column`, `label_column` and `exclude_columns` is a feature, in the
  table's order.
- **bool** columns are features, as 0/1. The run logs a note naming them and
  `kpca info` lists them ("bool as 0/1"); list `input.columns` or `exclude_columns` to
  leave them out.
- **Text, categorical, datetime and timedelta** columns are not features. Without
  `input.columns` they are left out with a warning naming them and their kind, recorded
  as left out in the run's features block and listed by `kpca info` ("left out (not
  numeric)"); `input.exclude_columns` leaves them out without the warning. Listed in
  `input.columns` they are refused in one line (encode them as numbers first: one-hot,
  epoch seconds...). A table with no numeric column is refused.
- NaN or infinity in a feature column stops the run naming the first row and column
  (`nonfinite: drop` drops such rows instead).

The run records what it used, its *features block*: names in order, dtypes, bool
columns, the id and label columns, the columns left out, and how the features were
chosen (`columns`: listed in `input.columns`; `all`: every column but the id, label,
excluded and non-numeric ones; `positions`: NPY and zarr input, whose columns have no
names). It is saved with the model (its `features`
block: `KernelPCA.feature_names_in_` and `features_` after `kpca_dask.load`) and in
the manifest (`input.features`); `kpca info` lists it.

`kpca transform RUN DATA` (and `--inverse`) selects the model's features from a table
**by name, in any order**, and carries the run's id and label columns when the table has
them (no flags needed for a table shaped like the training one; `--id-column` and
`--label-column` override). A missing feature is refused in one line naming it. A
column that is none of the features nor the id/label is refused naming it when the run
took every column as a feature (a new column means the table changed; `--ignore-extra`
embeds with the model's features anyway; columns the run excluded or left out are
ignored), and ignored with a note when the run listed
its features in `input.columns` (other columns were never features). NPY and zarr input
are taken by position, with the same number of columns as at fit. The estimator does the
same for a pandas DataFrame: `transform` selects `feature_names_in_` by name, refusing
missing or unknown columns (docs/sklearn.md).

### Validation: every row, before anything starts

`kpca validate`, and the start of `kpca run`, `kpca update` (its batch) and
`kpca transform` (its rows), read the input's header and a sample for the quick checks
(columns, types), then **every row once**, streaming (pipeline/scan.py: pyarrow's
streaming CSV and Parquet readers; NPY in row blocks), before any Dask cluster or
Prefect server starts. They report, each with the exact row (0-based, as `kpca info`
counts; CSV: the file's line too) and column of its first occurrence: NaN or infinity in
a feature (unless `nonfinite: drop`, which reports how many rows it will drop), text in
a numeric column, a missing label, a missing id and a repeated id (ids are join keys: a
run refuses repeats; `kpca transform` logs them). A refused run leaves nothing behind. A
zarr input's metadata is checked here, its values at ingest.

Measured (`python benchmarks/bench_validate.py --rows 1000000 --cols 64 --repeat 2`,
benchmarks/results/validate-1000000x64-2026-11-26.json): 1 000 000 rows x 64 float64
features plus an int64 id above 2**53 and a text label -- a 797 MB CSV file in **47 s**
(best of 2; 21 000 rows/s), a 650 MB Parquet file in **4.0 s** (250 000 rows/s). The
machine was shared (2 cores, load average 27-40 during the run), so these are upper
bounds; the CSV pass is pyarrow's parser, multi-threaded on a quiet machine.

### Ids

The id column is kept exactly as the source has it: a CSV column whose every value is
written as an integer (`9007199254740993`, `-12`; no `+`, no leading zero, no `1.0`) is
int64 -- read as such, never through float64, which holds integers exactly only up to
2**53 -- any other CSV column is text (`"007"` stays `"007"`); a Parquet column keeps its
type. Choosing int64 or text reads the CSV's id column once more at ingest (a streaming
pass over that column).
""",
}


def reference_markdown() -> str:
    """docs/config.md: every section and field with its type, default and description."""
    lines = [
        "# Pipeline configuration reference",
        "",
        "Generated from `pipeline/config.py` (`python -m pipeline.config > docs/config.md`);",
        "a test keeps it in sync. Unknown keys are refused. Example: "
        "`deploy/examples/run.yaml`.",
        "",
    ]
    for name, field in PipelineConfig.model_fields.items():
        model = field.annotation
        lines += [
            f"## `{name}`",
            "",
            (model.__doc__ or "").strip().splitlines()[0],
            "",
            "| field | type | default | description |",
            "|---|---|---|---|",
        ]
        for fname, f in model.model_fields.items():
            default = (
                "required"
                if f.is_required()
                else ("{}" if f.default_factory is dict else repr(f.default))
            )
            typ = _type_name(f.annotation).replace("|", "\\|")
            desc = (f.description or "").replace("|", "\\|")
            lines.append(f"| `{fname}` | `{typ}` | `{default}` | {desc} |")
        lines.append("")
        if name in REFERENCE_NOTES:
            lines += [REFERENCE_NOTES[name].strip(), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown())


def absolute_path(path: str) -> str:
    """A local path made absolute against the current folder (``file://`` kept); URLs
    and the names refused elsewhere as "no folder of its own" (``""``, ``.``, ``..``)
    unchanged. What a manifest or lineage records must not depend on the folder a command
    ran in: a series started with ``--output runs/v1`` is updated from anywhere."""
    import os

    raw = str(path)
    if "://" in raw and not raw.startswith("file://"):
        return raw
    prefix = "file://" if raw.startswith("file://") else ""
    bare = raw.removeprefix("file://")
    if bare.strip().rstrip("/") in ("", ".", ".."):
        return raw
    return prefix + os.path.abspath(os.path.expanduser(bare))


def with_absolute_paths(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with its local input, output and update-base paths absolute
    (:func:`absolute_path`); the same object when they already are."""
    paths = {
        ("input", "path"): cfg.input.path,
        ("output", "path"): cfg.output.path,
        ("update", "base"): cfg.update.base,
    }
    fixed = {k: absolute_path(v) for k, v in paths.items() if v is not None}
    if all(fixed[k] == paths[k] for k in fixed):
        return cfg
    cfg = cfg.model_copy(deep=True)
    for (section, name), value in fixed.items():
        setattr(getattr(cfg, section), name, value)
    return cfg
