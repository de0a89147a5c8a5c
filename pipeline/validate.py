"""The checks before anything starts: ``kpca validate CONFIG``, and the first thing ``kpca run``
does, before a Prefect API or a Dask cluster is started.

:func:`validate` reads the input's header and a small sample of rows (a few CSV lines,
the first Parquet batch, an NPY header and first rows, a zarr array's metadata) for the
cheap checks, then every row of a CSV, Parquet or NPY input once, streaming
(pipeline/scan.py: row count, NaN/inf, text in numeric columns, missing labels, missing
or repeated ids, each with the exact row and column of its first occurrence); and it
probes the output for writing, removing only what the probe created. It returns a list of
:class:`Finding` (one line each, naming the problem and the fix); errors stop a run
before anything is written.

This module imports neither dask, distributed, zarr nor Prefect (a test checks it): a
wrong path or column is reported in about a second, bad data after one streaming pass
(cost in docs/config.md, "input"), never after a cluster has started. A zarr array's
values are checked at ingest.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from .config import PipelineConfig
from .errors import UserError
from .formats import column_hint, infer_format

__all__ = [
    "SAMPLE_ROWS",
    "Finding",
    "ValidationError",
    "Validation",
    "validate",
    "validate_input",
]

#: rows of a table (or NPY file) read to check types and the NaN policy
SAMPLE_ROWS = 200

_MANIFEST = "manifest.json"  # pipeline/layout.py's MANIFEST (that module imports dask)


@dataclass(frozen=True)
class Finding:
    """One result of a pre-start check: ``check`` names it, ``message`` is one line."""

    check: str  # input, format, columns, label, id, types, nonfinite, evaluate, output, run
    message: str
    level: Literal["error", "note"] = "error"

    def __str__(self) -> str:
        return self.message


class ValidationError(UserError, ValueError):
    """The pre-start checks found problems; ``findings`` holds every error (one line each)."""

    def __init__(self, findings: list[Finding]):
        self.findings = [f for f in findings if f.level == "error"]
        super().__init__("\n".join(f.message for f in self.findings))


@dataclass
class Validation:
    """What the checks found, and what they read (for the summary line)."""

    findings: list[Finding] = field(default_factory=list)
    format: str | None = None
    features: list[str] = field(default_factory=list)
    shape: tuple[int, ...] | None = None  # NPY/zarr: the whole array's; tables: the sample's
    sample_rows: int = 0
    #: the full pass (pipeline/scan.py): whether to make it, and what it found
    full: bool = True
    rows: int | None = None
    scan_seconds: float = 0.0
    id_type: str | None = None
    droppable_rows: int = 0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "note"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self) -> None:
        if self.errors:
            raise ValidationError(self.errors)

    def summary(self, cfg: PipelineConfig) -> str:
        what = f"{len(self.features)} feature columns" if self.features else "features"
        if self.shape is not None and self.format in ("npy", "zarr"):
            what = f"{self.shape[0]} rows x {self.shape[1]} features"
        if self.rows is not None:
            what = (
                f"{self.rows} rows x {len(self.features)} feature columns, every row read in "
                f"{self.scan_seconds:.1f} s"
            )
            if self.id_type:
                what += f", ids {self.id_type} and unique"
            if self.droppable_rows:
                what += f", {self.droppable_rows} rows with NaN/inf to drop"
        elif self.sample_rows:
            what += f" (checked on the first {self.sample_rows} rows)"
        return f"{cfg.input.path} ({self.format}): {what}; output {cfg.output.path} writable"


class _Stop(Exception):
    """A check failed in a way that makes the later checks meaningless."""


# ------------------------------------------------------------------------ helpers
def _fs(path: str, options: dict[str, Any]):
    from fsspec.core import url_to_fs

    return url_to_fs(path, **options)


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _format(cfg: PipelineConfig, fs, fs_path: str) -> str | None:
    """The input format, as pipeline/readers.py's ``detect_format`` infers it."""
    if cfg.input.format != "auto":
        return cfg.input.format
    return infer_format(cfg.input.path, fs, fs_path)


def _is_numeric(dtype) -> bool:
    import pandas as pd

    try:
        return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_complex_dtype(dtype)
    except TypeError:
        return False


# ------------------------------------------------------------------------ the input
def _check_input(cfg: PipelineConfig, v: Validation) -> None:
    inp = cfg.input
    try:
        fs, fs_path = _fs(inp.path, dict(inp.storage_options))
    except ImportError as exc:
        raise _Stop(
            f"cannot open {inp.path!r}: {_short(exc)} (install the fsspec backend for this "
            "URL scheme, e.g. `pip install s3fs`)."
        ) from None
    except Exception as exc:  # noqa: BLE001 - an unknown protocol, bad storage options
        raise _Stop(
            f"cannot open {inp.path!r} ({type(exc).__name__}: {_short(exc)}); check "
            "input.path and input.storage_options."
        ) from None
    try:
        exists = fs.exists(fs_path)
    except Exception as exc:  # noqa: BLE001 - network, credentials, permissions
        raise _Stop(
            f"cannot reach input {inp.path!r} ({type(exc).__name__}: {_short(exc)}); check "
            "the URL, the network and the credentials in the environment."
        ) from None
    if not exists:
        raise _Stop(f"input {inp.path!r} does not exist; check input.path.")
    fmt = _format(cfg, fs, fs_path)
    if fmt is None:
        v.findings.append(
            Finding(
                "format",
                f"cannot infer the format of {inp.path!r} from its name; set input.format "
                "to one of npy, csv, parquet, zarr.",
            )
        )
        return
    v.format = fmt
    if fmt in ("npy", "zarr") and (inp.columns or inp.label_column or inp.id_column):
        v.findings.append(
            Finding(
                "columns",
                f"{fmt.upper() if fmt == 'npy' else fmt} input has no named columns: remove "
                "input.columns/label_column/id_column, or convert the data to Parquet/CSV.",
            )
        )
        return
    try:
        if fmt == "npy":
            _check_npy(cfg, v, fs, fs_path)
        elif fmt == "zarr":
            _check_zarr(cfg, v, fs, fs_path)
        else:
            _check_table(cfg, v, fs, fs_path, fmt)
    except PermissionError as exc:
        raise _Stop(
            f"cannot read input {inp.path!r}: permission denied ({_short(exc)}); give this "
            "user read access or point input.path at a readable copy."
        ) from None
    except IsADirectoryError:
        raise _Stop(
            f"input {inp.path!r} is a folder, not a {fmt} file; point input.path at the "
            "file (or set input.format)."
        ) from None


def _check_matrix(cfg, v: Validation, dtype, shape) -> None:
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        v.findings.append(
            Finding(
                "types", f"{cfg.input.path}: complex values; kernel PCA needs real numbers."
            )
        )
    elif dtype.kind not in "fiub":
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path}: dtype {dtype} is not numeric; store numbers (encode "
                "categorical columns first).",
            )
        )
    if len(shape) != 2:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} holds an array of shape {tuple(shape)}; need 2-D "
                "(n_samples, n_features).",
            )
        )
    elif shape[0] == 0 or shape[1] == 0:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} holds an empty array of shape {tuple(shape)}; point "
                "input.path at data.",
            )
        )
    v.shape = tuple(int(s) for s in shape)
    if len(shape) == 2:
        v.features = [f"x{i}" for i in range(int(shape[1]))]


def _check_npy(cfg, v: Validation, fs, fs_path: str) -> None:
    import numpy as np
    from numpy.lib import format as npformat

    with fs.open(fs_path, "rb") as f:
        try:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = npformat.read_array_header_2_0(f)
        except Exception as exc:  # noqa: BLE001 - not an NPY file (an NPZ, text, truncated)
            head = b""
            try:
                f.seek(0)
                head = f.read(4)
            except Exception:  # noqa: BLE001
                pass
            if head.startswith(b"PK"):  # np.load opens NPZ archives whatever the name
                v.findings.append(
                    Finding(
                        "types",
                        f"{cfg.input.path} is an NPZ archive, not an NPY file; save the "
                        "feature matrix with numpy.save and point input.path at it.",
                    )
                )
                return
            v.findings.append(
                Finding(
                    "types",
                    f"{cfg.input.path} is not a readable NPY file: {_short(exc)}",
                )
            )
            return
        if dtype.hasobject:
            v.findings.append(
                Finding(
                    "types",
                    f"{cfg.input.path}: object arrays are refused (loading them would "
                    "unpickle data); save numeric data.",
                )
            )
            return
        _check_matrix(cfg, v, dtype, shape)
        if v.errors or len(shape) != 2 or fortran:
            return
        rows = min(SAMPLE_ROWS, int(shape[0]))
        want = rows * int(shape[1]) * dtype.itemsize
        buf = f.read(want)
    if len(buf) < want:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} is truncated (its header says {tuple(shape)}); restore "
                "the file from a good copy.",
            )
        )
        return
    sample = np.frombuffer(buf, dtype=dtype).reshape(rows, int(shape[1]))
    v.sample_rows = rows
    _check_sample_finite(cfg, v, sample, v.features)
    if not v.errors and v.full:
        _scan(cfg, v, fs, fs_path, "npy", v.features)


def _check_zarr(cfg, v: Validation, fs, fs_path: str) -> None:
    def meta(path: str) -> dict | None:
        try:
            with fs.open(posixpath.join(path, "zarr.json"), "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Stop(
                f"{cfg.input.path} is not a readable zarr store ({type(exc).__name__}: "
                f"{_short(exc)}); restore it from a good copy or point input.path at an "
                "intact store."
            ) from None

    m = meta(fs_path)
    if m is None:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} is not a zarr v3 store (no zarr.json); point input.path "
                "at the store, or set input.format.",
            )
        )
        return
    if m.get("node_type") == "group":
        name = cfg.input.zarr_array or "X"
        m = meta(posixpath.join(fs_path, name))
        if m is not None and m.get("node_type") == "group":
            v.findings.append(
                Finding(
                    "columns",
                    f"{cfg.input.path}: {name!r} is a zarr group, not an array; set "
                    "input.zarr_array to an array's path.",
                )
            )
            return
        if m is None or m.get("node_type") != "array":
            v.findings.append(
                Finding(
                    "columns",
                    f"{cfg.input.path} is a zarr group without an array {name!r}; set "
                    "input.zarr_array to the feature array's path.",
                )
            )
            return
    dtype = m.get("data_type")
    try:
        import numpy as np

        dt = np.dtype(dtype) if isinstance(dtype, str) else np.dtype("O")
    except TypeError:
        dt = np.dtype("O")
    _check_matrix(cfg, v, dt, m.get("shape") or ())


def _open_table_sample(cfg, fs, fs_path: str, fmt: str):
    """(all column names, a pandas sample of the first rows, {column: dtype} of the file)."""
    import pandas as pd

    if fmt == "csv":
        compression = "gzip" if fs_path.lower().endswith(".gz") else None
        with fs.open(fs_path, "rb") as f:
            try:
                df = pd.read_csv(f, nrows=SAMPLE_ROWS, compression=compression)
            except pd.errors.EmptyDataError:
                raise _Stop(
                    f"{cfg.input.path} is empty (no header, no rows); point input.path at "
                    "a file with data."
                ) from None
            except Exception as exc:  # noqa: BLE001 - pandas raises many kinds
                msg = _short(exc)
                if "Expected" in msg and "fields" in msg:
                    raise _Stop(
                        f"{cfg.input.path} is ragged: {msg}. Every row needs the same number "
                        "of fields; fix the file (quoting? stray delimiters?)."
                    ) from None
                raise _Stop(
                    f"cannot read {cfg.input.path} as csv ({type(exc).__name__}: "
                    f"{_short(exc)}); check that the file is intact and input.format is right."
                ) from None
        # dask reads every column that may hold a missing value as float (assume_missing)
        return list(map(str, df.columns)), df, dict(df.dtypes)
    import pyarrow.parquet as pq

    path = fs_path
    if fs.isdir(fs_path):
        files = sorted(
            str(p)
            for p in fs.find(fs_path)
            if str(p).endswith((".parquet", ".pq")) and "/." not in str(p)
        )
        if not files:
            raise _Stop(
                f"{cfg.input.path} is a folder without Parquet files; point input.path at "
                "a Parquet file or dataset."
            )
        path = files[0]
    with fs.open(path, "rb") as f:
        try:
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
            batch = next(pf.iter_batches(batch_size=SAMPLE_ROWS), None)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
            raise _Stop(
                f"cannot read {cfg.input.path} as parquet ({type(exc).__name__}: "
                f"{_short(exc)}); check that the file is intact and input.format is right."
            ) from None
    names = [n for n in schema.names if n != "__index_level_0__"]
    df = batch.to_pandas() if batch is not None else schema.empty_table().to_pandas()
    dtypes = {n: schema.field(n).type.to_pandas_dtype() for n in names}
    return names, df, dtypes


def _check_table(cfg, v: Validation, fs, fs_path: str, fmt: str) -> None:
    inp = cfg.input
    available, df, dtypes = _open_table_sample(cfg, fs, fs_path, fmt)
    if not available:
        v.findings.append(
            Finding(
                "columns",
                f"{inp.path} has no columns (empty file?); point input.path at a file "
                "with data.",
            )
        )
        return
    shown = available
    for check, what, col in (
        ("label", "label_column", inp.label_column),
        ("id", "id_column", inp.id_column),
    ):
        if col is not None and col not in available:
            v.findings.append(
                Finding(
                    check,
                    f"input.{what} {col!r} is not a column of {inp.path}; "
                    + column_hint(col, available),
                )
            )
    # input.exclude_columns are not features (pipeline/features.py: the same rule at ingest)
    excluded = list(inp.exclude_columns or [])
    unknown = [c for c in excluded if c not in available]
    if unknown:
        v.findings.append(
            Finding(
                "columns",
                f"input.exclude_columns {unknown} are not columns of {inp.path}; "
                f"available: {shown}.",
            )
        )
    reserved = {inp.label_column, inp.id_column, *excluded} - {None}
    if inp.columns:
        missing = [c for c in inp.columns if c not in available]
        if missing:
            v.findings.append(
                Finding(
                    "columns",
                    f"input.columns {missing} are not in {inp.path}; available: {shown}",
                )
            )
        features = [c for c in inp.columns if c in available]
        bad = [c for c in features if not _is_numeric(dtypes[c])]
        if bad:
            v.findings.append(
                Finding(
                    "types",
                    f"input.columns {bad} are not numeric ({[str(dtypes[c]) for c in bad]}); "
                    "drop them from input.columns or encode them as numbers.",
                )
            )
            features = [c for c in features if c not in bad]
    else:
        features = [c for c in available if c not in reserved and _is_numeric(dtypes[c])]
        skipped = [c for c in available if c not in reserved and c not in features]
        if skipped:
            v.findings.append(
                Finding(
                    "types",
                    f"non-numeric columns {skipped[:10]} are not used as features (list "
                    "input.columns to choose features explicitly)",
                    level="note",
                )
            )
        if not features:
            v.findings.append(
                Finding(
                    "types",
                    (
                        f"{inp.path} is empty: it has a header ({available[:5]}) but no data "
                        "rows; point input.path at a file with data."
                    )
                    if len(df) == 0
                    else (
                        f"{inp.path} has no numeric feature columns (columns: {shown}); "
                        "set input.columns."
                    ),
                )
            )
            return
    v.features = list(features)
    v.sample_rows = len(df)
    if len(df) == 0:
        v.findings.append(
            Finding(
                "types",
                f"{inp.path} is empty: it has a header ({available[:5]}) but no data rows; "
                "point input.path at a file with data.",
            )
        )
        return
    if v.errors:
        return
    import numpy as np

    try:
        sample = df[features].to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError) as exc:
        v.findings.append(
            Finding(
                "types",
                f"{inp.path}: a feature column holds text where numbers are expected "
                f"({_short(exc)}); set input.columns to numeric columns only.",
            )
        )
        return
    _check_sample_finite(cfg, v, sample, features)
    if not v.errors and v.full:
        _scan(cfg, v, fs, fs_path, fmt, features, dtypes)


def _scan(cfg, v: Validation, fs, fs_path: str, fmt: str, features, dtypes=None) -> None:
    """The full pass (pipeline/scan.py): every row read; the first problem of each kind
    with its exact row and column."""
    from .scan import scan

    inp = cfg.input
    labels = {inp.label_column, inp.id_column} - {None}
    res = scan(
        inp.path,
        fmt,
        fs,
        fs_path,
        features=[c for c in features if c not in labels],
        dtypes=dtypes,
        id_column=inp.id_column,
        label_column=inp.label_column,
        nonfinite=inp.nonfinite,
    )
    v.rows, v.scan_seconds, v.id_type = res.rows, res.seconds, res.id_type
    v.droppable_rows = res.droppable_rows
    for p in res.problems:
        v.findings.append(Finding(p.check, p.message))
    if res.rows == 0 and fmt != "npy" and not res.problems:
        v.findings.append(
            Finding(
                "types",
                f"{inp.path} is empty: it has a header but no data rows; point input.path "
                "at a file with data.",
            )
        )


def _check_sample_finite(cfg, v: Validation, sample, features: list[str]) -> None:
    import numpy as np

    if cfg.input.nonfinite != "error" or sample.size == 0:
        return
    bad = ~np.isfinite(sample)
    if not bad.any():
        return
    cols = [features[j] for j in np.flatnonzero(bad.any(axis=0))]
    row = int(np.flatnonzero(bad.any(axis=1))[0])
    v.findings.append(
        Finding(
            "nonfinite",
            f"{cfg.input.path} contains NaN or infinity in column(s) {cols[:10]} (first: "
            f"row {row}); clean the data or set input.nonfinite: drop.",
        )
    )


def _check_evaluate(cfg: PipelineConfig, v: Validation) -> None:
    if cfg.evaluate.enabled is True and not cfg.input.label_column:
        v.findings.append(
            Finding(
                "evaluate",
                "evaluate.enabled is true but the input has no label column; set "
                "input.label_column or evaluate.enabled: auto.",
            )
        )


# ------------------------------------------------------------------------ the output
def _check_output(cfg: PipelineConfig, v: Validation, *, probe: bool) -> None:
    raw = str(cfg.output.path).strip()
    bare = raw.removeprefix("file://").rstrip("/")
    if raw.rstrip("/") in ("", ".", "..") or bare in ("", ".", ".."):
        raise _Stop(
            f"output.path {cfg.output.path!r} names no folder of its own (empty or '.'); "
            "set output.path to a new folder, e.g. kpca-output."
        )
    remote = "://" in raw and not raw.startswith("file://")
    opts = dict(getattr(cfg.output, "storage_options", None) or {}) if remote else {}
    try:
        fs, out = _fs(raw, opts)
    except Exception as exc:  # noqa: BLE001 - unknown protocol, missing backend
        raise _Stop(
            f"cannot open output {raw!r} ({type(exc).__name__}: {_short(exc)}); check "
            "output.path (and install the fsspec backend for its URL scheme)."
        ) from None
    local = not remote
    _check_not_overlapping(cfg, out, local)
    try:
        is_file = fs.isfile(out)
        manifest = posixpath.join(out, _MANIFEST)
        status = None
        if not is_file and fs.exists(manifest):
            try:
                with fs.open(manifest, "rb") as f:
                    status = json.loads(f.read()).get("status")
            except Exception:  # noqa: BLE001 - a broken manifest is not a complete run
                status = "unreadable"
    except PermissionError as exc:
        raise _Stop(
            f"cannot look into output {raw!r}: permission denied ({_short(exc)}); set "
            "output.path (or --output) to a folder this user may write."
        ) from None
    except Exception as exc:  # noqa: BLE001 - network, credentials
        raise _Stop(
            f"cannot reach output {raw!r} ({type(exc).__name__}: {_short(exc)}); check the "
            "URL, the network and the credentials in the environment."
        ) from None
    if is_file:
        raise _Stop(f"output path {raw} is a file, not a folder; choose another output.path.")
    if status == "complete":
        if cfg.output.overwrite:
            v.findings.append(
                Finding(
                    "run",
                    f"{raw} holds a complete run; it is replaced when the new one is "
                    "published (output.overwrite: true; only changed stages run again "
                    "with Prefect)",
                    level="note",
                )
            )
        else:
            v.findings.append(
                Finding(
                    "run",
                    f"{raw} already holds a complete run; choose another output.path or "
                    "pass --overwrite (output.overwrite: true) to replace it.",
                )
            )
    elif status is not None:
        v.findings.append(
            Finding(
                "run",
                f"{raw} holds an unfinished run ({status}); this run resumes it",
                level="note",
            )
        )
    if probe:
        _probe_writable(raw, fs, out, local)


def _check_not_overlapping(cfg: PipelineConfig, out: str, local: bool) -> None:
    """The output must not be the input, inside it, or hold it (local paths)."""
    from pathlib import Path

    src = cfg.input.path
    if not local or ("://" in src and not src.startswith("file://")):
        return
    o = Path(out).resolve()
    i = Path(src.removeprefix("file://")).resolve()
    if o == i or o in i.parents or i in o.parents:
        raise _Stop(
            f"output.path {cfg.output.path} is, holds or lies inside the input {src}; write "
            "the output somewhere else (the input is never overwritten)."
        )


def _probe_writable(raw: str, fs, out: str, local: bool) -> None:
    """Write and remove a probe file in the output; create missing folders for it and
    remove exactly those again (deepest first). Nothing the probe did not create is touched."""
    import os

    name = f".kpca-probe-{uuid.uuid4().hex}"
    created: list[str] = []
    try:
        if local:
            missing, p = [], os.path.abspath(out)
            while not os.path.exists(p):
                missing.append(p)
                parent = os.path.dirname(p)
                if parent == p:
                    break
                p = parent
            if not os.path.isdir(p):
                raise _Stop(
                    f"cannot create output {raw}: {p} is a file, not a folder; choose "
                    "another output.path."
                )
            for d in reversed(missing):
                os.mkdir(d)
                created.append(d)
            target = os.path.join(out, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(target)
        else:
            from .store import BUCKET_SCHEMES, missing_bucket_message

            scheme, bucket = raw.split("://", 1)[0].lower(), out.strip("/").split("/")[0]
            if scheme in BUCKET_SCHEMES and bucket and not fs.exists(bucket):
                raise _Stop(
                    f"cannot write to output {raw}: {missing_bucket_message(scheme, bucket)}."
                )
            target = posixpath.join(out, name)
            fs.pipe_file(target, b"kpca write probe")
            fs.rm_file(target)
    except _Stop:
        raise
    except OSError as exc:
        if getattr(exc, "errno", None) == 30:  # EROFS: the words of the run's own check
            raise _Stop(
                f"cannot write {raw}: the file system is read-only; set output.path (or "
                "--output) to a writable folder."
            ) from None
        why = "permission denied" if isinstance(exc, PermissionError) else _short(exc)
        raise _Stop(
            f"cannot write to output {raw} ({why}); set output.path (or --output) to a "
            "folder this user may write."
        ) from None
    except Exception as exc:  # noqa: BLE001 - object stores raise their own kinds
        raise _Stop(
            f"cannot write to output {raw} ({type(exc).__name__}: {_short(exc)}); check "
            "output.path, its permissions and the credentials in the environment."
        ) from None
    finally:
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass


# ------------------------------------------------------------------------ entry point
def validate(
    cfg: PipelineConfig, *, probe_output: bool = True, full: bool = True
) -> Validation:
    """Every pre-start check of ``cfg``; a :class:`Validation` listing what was found.

    Reads the input's header and first rows, then (``full``) every row in one streaming
    pass (pipeline/scan.py: row count, NaN/inf, text in numeric columns, missing labels,
    missing or repeated ids, each with its exact row and column), and probes the output
    for writing (leaving nothing behind); starts no cluster and imports no Prefect.
    """
    v = Validation(full=full)
    for name, check in (
        ("input", lambda: _check_input(cfg, v)),
        ("output", lambda: _check_output(cfg, v, probe=probe_output)),
    ):
        try:
            check()
        except _Stop as stop:
            v.findings.append(Finding(name, str(stop)))
    _check_evaluate(cfg, v)
    return v


def validate_input(inp: Any, *, full: bool = True) -> Validation:
    """The input checks alone (``inp``: an InputConfig), for a batch of ``kpca update``
    or the rows of ``kpca transform``: header, sample and (``full``) every row."""
    from types import SimpleNamespace

    v = Validation(full=full)
    try:
        _check_input(SimpleNamespace(input=inp), v)
    except _Stop as stop:
        v.findings.append(Finding("input", str(stop)))
    return v
