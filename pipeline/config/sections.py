"""The sections of a run's config that say what is read and fitted and where it runs:
``input``, ``kernel``, ``solver``, ``chunks``, ``kernel_store``, ``output`` and
``cluster`` (with its ``tls``); and the base every section model shares."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .credentials import _check_url, check_storage_options

#: the smallest ``cluster.memory_limit`` a worker can run in
MIN_WORKER_MEMORY = 256 << 20


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
    parameters they set (pipeline/model/fitspec.py; kpca_dask/plan.py): one validation system
    for estimator parameters, run when the file is loaded; pydantic checks the types."""

    def check(cls: Any, v: Any, info: ValidationInfo) -> Any:
        from pipeline.model.fitspec import check_field

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
        description="Largest residual ||Kc v - lambda v|| / lambda (plus the rounding "
        "level) a published pair whose vector is certified may have: pairs the randomized "
        "solver certifies as vectors or subspaces, and every pair of a solver without a "
        "certificate (dense, arpack, Nyström's covariance method); a fit above it is "
        "refused. 'Eigenvalue only' pairs (a flat tail) are held to the level they were "
        "certified to (1 %; lower solver.tol to tighten it), and a fit whose certificate "
        "does not hold is refused at any value (docs/solvers.md, What you can rely on). "
        "null: no accuracy check at all (uncertified fits are published).",
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
        "one included); older ones are expired when a new one is published, and deleted "
        "by a later publish once expired for retention_grace_hours.",
    )
    retention_grace_hours: float = Field(
        24.0,
        ge=0,
        le=24 * 366,
        description="How long a version stays on the store after it left the kept "
        "versions, so that readers that opened it finish (docs/artifacts.md, Retention); "
        "0 deletes it at once (its readers then fail in one line).",
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
        description="Fail the run when a worker it needs (or every worker) has been paused "
        "at its memory limit for this many seconds with work pending (a paused worker whose "
        "memory never drops would wait forever); null waits forever.",
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
