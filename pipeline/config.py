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
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .denoise import DenoiseConfig
from .evaluate import EvaluateConfig

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
    "PipelineConfig",
    "ConfigError",
    "load_config",
]

#: storage_options keys that carry credentials: refused in config files.
SECRET_KEYS = {"key", "secret", "token", "password", "aws_access_key_id",
               "aws_secret_access_key", "aws_session_token", "client_secret",
               "account_key", "sas_token", "credentials", "session_token",
               # short names compared whole (as parts of other names they mean other things)
               "sig", "sas", "auth", "pwd", "pass", "passphrase", "cookie", "apikey",
               "x-api-key"}
#: ... and words that mark a credential anywhere in a key's name (api_key, connection_string,
#: an Authorization header, X-Amz-Security-Token, refresh_token...), case-insensitive.
SECRET_WORDS = ("secret", "password", "passwd", "token", "signature", "credential",
                "private_key", "privatekey", "api_key", "api-key", "apikey", "access_key",
                "accesskey", "account_key", "accountkey", "connection_string",
                "connectionstring", "authorization", "sas_", "_sas", "bearer", "cookie")
#: values that are credentials whatever their key is called (never echoed in messages)
_SECRET_VALUES = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("an HTTP authorization value", re.compile(r"^\s*(Bearer|Basic|Token)\s+\S{8,}", re.I)),
    ("an Azure connection string or SAS", re.compile(
        r"(AccountKey|SharedAccessSignature|SharedAccessKey)=|[?&]sig=", re.I)),
    ("a JSON web token", re.compile(r"\beyJ[\w-]{8,}\.[\w-]{8,}\.")),
    ("an API token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|xox[abp]-[\w-]{10,}|"
                                r"sk-[A-Za-z0-9]{20,}|AIza[\w-]{30,})")),
    ("a long hex string", re.compile(r"^[0-9a-fA-F]{32,}$")),
    ("a long base64 string", re.compile(
        r"^(?=[^0-9]*[0-9])(?=[^a-z]*[a-z])(?=[^A-Z]*[A-Z])[A-Za-z0-9+/]{32,}={0,2}$")),
)


def _secret_value(v: Any) -> str | None:
    """What kind of credential a string value looks like (None: it does not)."""
    if not isinstance(v, str):
        return None
    for what, pattern in _SECRET_VALUES:
        if pattern.search(v):
            return what
    return None


def _is_secret_key(k: Any) -> bool:
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
            if _is_secret_key(k):
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
            raise ValueError("URLs with embedded credentials (user:password@host) are refused; "
                             "use the environment for credentials.")
        query = v.split("?", 1)[1] if "?" in v else ""
        from urllib.parse import unquote

        pairs = [q.split("=", 1) for q in query.replace(";", "&").split("&") if q]
        params = {unquote(p[0]): unquote(p[1]) if len(p) > 1 else "" for p in pairs}
        bad = _secret_keys(params)
        if bad:
            names = [b.split(" ", 1)[0] for b in bad]
            raise ValueError(f"URLs with credentials in the query string ({names}) are "
                             "refused; use the environment for credentials.")
    return v


#: the smallest ``cluster.memory_limit`` a worker can run in
MIN_WORKER_MEMORY = 256 << 20


class ConfigError(ValueError):
    """A configuration file or object is invalid (message lists every problem)."""


class _Model(BaseModel):
    # hide_input_in_errors: a refused credential is never echoed, also by pydantic's own
    # error text (the Python API, Prefect parameters), not only by load_config's summary
    model_config = ConfigDict(extra="forbid", validate_assignment=True,
                              hide_input_in_errors=True)


class InputConfig(_Model):
    """Where the data are and which columns to use."""

    path: str = Field(description="Input file, folder or URL (local path or any fsspec URL, "
                                  "e.g. s3://bucket/data.parquet; s3 needs s3fs installed).")
    format: Literal["auto", "npy", "csv", "parquet", "zarr"] = Field(
        "auto", description="Input format; 'auto' infers it from the path's suffix "
                            "(.npy, .csv, .parquet/.pq or a folder of Parquet files, .zarr).")
    columns: list[str] | None = Field(
        None, description="Feature columns by name for CSV/Parquet (default: every numeric "
                          "column except the label and id columns).")
    label_column: str | None = Field(None, description="Optional class label column, kept "
                                                       "alongside (enables evaluation).")
    id_column: str | None = Field(None, description="Optional row id column, kept alongside.")
    zarr_array: str | None = Field(None, description="Array path inside a zarr group input "
                                                     "(default: the root array or 'X').")
    nonfinite: Literal["error", "drop"] = Field(
        "error", description="NaN/inf policy: 'error' stops before anything is written; "
                             "'drop' removes such rows and reports how many.")
    missing_chunks: Literal["error", "fill"] = Field(
        "error", description="zarr input whose store lacks chunk files: 'error' refuses it "
                             "(zarr would read them as zeros); 'fill' reads them as the "
                             "array's fill value, deliberately (zarr writes no chunk equal to "
                             "the fill value unless write_empty_chunks is set).")
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="Extra fsspec options (e.g. {'anon': true} or an "
        "endpoint_url). Credentials are refused here: use the environment.")

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(_secret_keys(v))
        if bad:
            raise ValueError(
                f"storage_options must not hold credentials ({bad}); set them in the "
                "environment (e.g. AWS_ACCESS_KEY_ID) or a Prefect block instead.")
        return v

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
        if not v.strip() or v.startswith(("/", "\\")) or norm == ".." or norm.startswith("../") \
                or "://" in v:
            raise ValueError(f"zarr_array {v!r} must be a relative path inside the input store "
                             "(no '..', no leading '/', no URL)")
        return v


class KernelConfig(_Model):
    """The kernel (names and defaults as in scikit-learn)."""

    name: Literal["linear", "poly", "rbf", "laplacian", "sigmoid", "cosine"] = Field(
        "rbf", description="Kernel function.")
    gamma: float | Literal["scale"] | None = Field(
        "scale", description="Kernel coefficient: a positive number, null for 1/n_features, "
                             "or 'scale' for the median heuristic.")
    degree: float = Field(3, gt=0, description="Degree of the polynomial kernel.")
    coef0: float = Field(1.0, description="Independent term of the poly/sigmoid kernels.")

    @field_validator("gamma")
    @classmethod
    def _positive_gamma(cls, v):
        if isinstance(v, float) and not v > 0:
            raise ValueError("gamma must be > 0 (or null, or 'scale')")
        return v


class SolverConfig(_Model):
    """Which eigensolver, how many components, and its accuracy knobs."""

    n_components: int = Field(16, ge=1, description="Number of principal components.")
    eigen_solver: Literal["auto", "dense", "randomized", "nystroem"] = Field(
        "auto", description="'dense' (n <= ~20k), 'randomized' (exact, implicit kernel "
                            "matrix), 'nystroem' (linear in n), or 'auto'.")
    dtype: Literal["float32", "float64"] = Field(
        "float32", description="Precision of kernel evaluation (float32 is 2-3x faster, "
                               "eigenvalues typically within 1e-7 relative).")
    n_oversamples: int = Field(24, ge=0, description="Extra columns of the randomized block.")
    n_power_iter: int | Literal["auto"] = Field("auto", description="Randomized passes after "
                                                "the first, or 'auto' (stop at tol).")
    tol: float | None = Field(None, gt=0, description="Convergence tolerance of the randomized "
                                                      "solver (default by dtype).")
    max_iter: int = Field(20, ge=1, description="Cap on randomized passes.")
    random_state: int | None = Field(0, description="Seed (test matrix, landmarks, split).")
    max_residual: float | None = Field(
        1e-2, gt=0, description="Largest certified residual ||Kc v - lambda v|| / lambda a "
                                "published model may have (typical: 1e-4 float32, 1e-7 float64); "
                                "a fit above it is refused, not published. null disables.")
    n_landmarks: int | None = Field(None, ge=1, description="Nyström landmarks m "
                                                            "(default chosen by the solver).")
    landmark_method: Literal["uniform", "kmeans++", "rpcholesky"] = Field(
        "rpcholesky", description="How Nyström landmarks are chosen.")


class ChunkConfig(_Model):
    """How data are chunked."""

    target_chunk_mb: float = Field(64.0, gt=0, description="Target size of one ingested row "
                                                           "chunk in MB (50-200 MB suits clusters).")
    block_rows: int | Literal["auto"] = Field(
        "auto", description="Rows per block of the kernel partition ('auto': ~2048).")

    @field_validator("block_rows")
    @classmethod
    def _positive_rows(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("block_rows must be >= 1 (or 'auto')")
        return v


class KernelStoreConfig(_Model):
    """Whether the exact path materialises the kernel matrix in zarr."""

    materialize: Literal["auto", "always", "never"] = Field(
        "auto", description="'auto' materialises when reading a stored block is cheaper than "
                            "recomputing it (large n_features; see docs/kernel-store.md).")
    verify: bool = Field(True, description="On resume, re-read blocks marked done and check "
                                           "their checksum before skipping them.")


class OutputConfig(_Model):
    """Where the artifacts go."""

    path: str = Field("kpca-output", description="Output folder or URL of this run.")
    parquet: bool = Field(True, description="Also write the embedding as Parquet (id, label, "
                                            "components) for downstream tools.")
    overwrite: bool = Field(False, description="Replace a complete run at the same path "
                                               "(otherwise refused).")

    @field_validator("path")
    @classmethod
    def _sane_output(cls, v: str) -> str:
        return _check_url(v, "output")


class TLSConfig(_Model):
    """TLS material for a tls:// scheduler (file paths, never key contents)."""

    ca_file: str = Field(description="CA certificate file (PEM).")
    client_cert: str = Field(description="Client certificate file (PEM).")
    client_key: str = Field(description="Client private key file (PEM).")


class ClusterConfig(_Model):
    """The Dask cluster to run on."""

    address: str = Field("", description="Scheduler address (tcp://host:8786 or "
                                         "tls://host:8786); empty starts a local cluster.")
    n_workers: int | None = Field(None, ge=1, description="Local cluster workers (default: "
                                                          "one per core).")
    threads_per_worker: int = Field(1, ge=1, description="Threads per local worker.")
    memory_limit: str = Field("auto", description="Memory limit per local worker, e.g. "
                                                  "'4GiB' or 'auto'.")
    dashboard_address: str | None = Field(
        "127.0.0.1:0", description="Local dashboard bind address (localhost only by default; "
                                   "null disables it).")
    tls: TLSConfig | None = Field(None, description="TLS files for a tls:// scheduler.")
    connect_timeout: float = Field(30.0, gt=0, description="Seconds to wait for the scheduler.")
    paused_timeout: float | None = Field(
        300.0, gt=0, description="Fail the run when every worker has been paused at its "
        "memory limit for this many seconds with work pending (a paused worker whose memory "
        "never drops would wait forever); null waits forever.")

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
            raise ValueError(f"memory_limit {v!r} is not a size; write e.g. '4GiB' or "
                             "'auto'") from None
        if n < MIN_WORKER_MEMORY:
            raise ValueError(f"memory_limit {v!r} is below the minimum: a worker needs at "
                             "least 256 MiB (e.g. '4GiB', or 'auto')")
        return v

    @model_validator(mode="after")
    def _tls_matches_scheme(self):
        if self.address.startswith("tls://") and self.tls is None:
            raise ValueError("a tls:// address needs the 'tls' section (ca_file, client_cert, "
                             "client_key)")
        if self.address and not self.address.startswith(("tcp://", "tls://", "inproc://")):
            raise ValueError(f"scheduler address {self.address!r} must start with tcp:// or "
                             "tls:// (or be empty for a local cluster)")
        return self


class PipelineConfig(_Model):
    """A whole pipeline run."""

    input: InputConfig
    kernel: KernelConfig = Field(default_factory=KernelConfig)
    solver: SolverConfig = Field(default_factory=SolverConfig)
    chunks: ChunkConfig = Field(default_factory=ChunkConfig)
    kernel_store: KernelStoreConfig = Field(default_factory=KernelStoreConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    denoise: DenoiseConfig = Field(default_factory=DenoiseConfig)

    @classmethod
    def from_yaml(cls, path: str | Path) -> PipelineConfig:
        """Load and validate a YAML file (``yaml.safe_load``: no code runs)."""
        return load_config(path)

    def to_json_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def _format_errors(exc: ValidationError, source: str) -> str:
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
            raise ConfigError(f"config file {p} is larger than a config can be "
                              f"({MAX_CONFIG_BYTES} bytes); point at the run's YAML file.")
        try:
            data = _safe_yaml(p.read_text())
        except _YamlBoundError as exc:
            raise ConfigError(f"config file {p} has {exc}: refused (an alias bomb?); write "
                              "the values out.") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {p} is not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start}); save it as UTF-8 YAML.") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"config file {p} is not valid YAML ({what}{where}); fix its "
                              "syntax (see deploy/examples/run.yaml).") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, name)) from None


def _type_name(t: Any) -> str:
    if isinstance(t, type):
        return t.__name__
    text = str(t).replace("typing.", "").replace("NoneType", "None")
    for cls in (str, int, float, bool, dict, list):
        text = text.replace(f"<class '{cls.__name__}'>", cls.__name__)
    if text.startswith("Union[") and text.endswith("]"):
        text = " | ".join(part.strip() for part in text[6:-1].split(", ") if part)
    return text.replace("pipeline.config.", "").replace("__main__.", "")


def reference_markdown() -> str:
    """docs/config.md: every section and field with its type, default and description."""
    lines = ["# Pipeline configuration reference", "",
             "Generated from `pipeline/config.py` (`python -m pipeline.config > docs/config.md`);",
             "a test keeps it in sync. Unknown keys are refused. Example: "
             "`deploy/examples/run.yaml`.", ""]
    for name, field in PipelineConfig.model_fields.items():
        model = field.annotation
        lines += [f"## `{name}`", "", (model.__doc__ or "").strip().splitlines()[0], "",
                  "| field | type | default | description |", "|---|---|---|---|"]
        for fname, f in model.model_fields.items():
            default = "required" if f.is_required() else (
                "{}" if f.default_factory is dict else repr(f.default))
            typ = _type_name(f.annotation).replace("|", "\\|")
            desc = (f.description or "").replace("|", "\\|")
            lines.append(f"| `{fname}` | `{typ}` | `{default}` | {desc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown())
