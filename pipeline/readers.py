"""Readers: a source (NPY, CSV, Parquet or zarr; local path or fsspec URL) as lazy arrays.

``read_input`` returns a :class:`SourceData`: the float64 feature matrix in row chunks
of about ``target_chunk_mb``, optional class labels (int codes plus the class names) and
optional row ids. Nothing is computed or written here: the ingest stage
(pipeline/ingest.py) validates and stores what a reader returns, and ``kpca transform``
embeds it directly. Problems with the source raise :class:`InputError`, one line naming
the problem and the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd

from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks

from .config import ChunkConfig, InputConfig
from .errors import UserError
from .features import FeatureError, Selection
from .features import select as select_features
from .formats import column_hint, infer_format
from .store import Location

logger = logging.getLogger("pipeline")

__all__ = [
    "InputError",
    "NpyFile",
    "RemoteNpyFile",
    "SourceData",
    "check_exists",
    "detect_format",
    "explain_table_error",
    "read_input",
    "rows_per_chunk",
    "table_columns",
]


class InputError(UserError, ValueError):
    """The input cannot be used as it is; the message names the problem and the fix."""


@dataclass
class SourceData:
    """Lazy arrays read from a source."""

    X: da.Array
    columns: list[str]
    labels: da.Array | None = None
    classes: list[str] | None = None
    ids: da.Array | None = None
    #: how the feature columns were chosen (tables only; pipeline/features.py)
    selection: Selection | None = None


def detect_format(cfg: InputConfig) -> str:
    if cfg.format != "auto":
        return cfg.format
    loc = Location(cfg.path, cfg.storage_options)
    fmt = infer_format(cfg.path, loc.fs, loc.fs_path)
    if fmt is not None:
        return fmt
    raise InputError(
        f"cannot infer the format of {cfg.path!r} from its name; set input.format to one of "
        "npy, csv, parquet, zarr."
    )


def check_exists(cfg: InputConfig) -> Location:
    loc = Location(cfg.path, cfg.storage_options)
    try:
        ok = loc.exists()
    except ImportError as exc:  # e.g. s3fs missing
        raise InputError(
            f"cannot open {cfg.path!r}: {exc} (install the fsspec backend for this "
            "URL scheme, e.g. `pip install s3fs`)."
        ) from exc
    if not ok:
        raise InputError(f"input {cfg.path!r} does not exist; check input.path.")
    return loc


def rows_per_chunk(n_features: int, target_mb: float) -> int:
    return max(1, int(target_mb * 1e6 // (max(1, n_features) * 8)))


def read_input(
    cfg: InputConfig, chunks: ChunkConfig | None = None, *, min_classes: int = 2
) -> SourceData:
    """Lazy feature matrix (+ labels, ids) from the configured source.

    ``min_classes``: the label column must hold at least this many classes (2 where the
    run evaluates; an update or a transform carries whatever labels a batch has)."""
    chunks = chunks or ChunkConfig()
    loc = check_exists(cfg)
    fmt = detect_format(cfg)
    if fmt == "npy":
        return _read_npy(cfg, loc, chunks)
    if fmt == "zarr":
        return _read_zarr(cfg, loc, chunks)
    return _read_table(cfg, fmt, chunks, min_classes=min_classes)


def _read_npy(cfg, loc, chunks) -> SourceData:
    if cfg.columns or cfg.label_column or cfg.id_column or cfg.exclude_columns:
        raise InputError(
            "NPY input has no named columns: remove input.columns/label_column/"
            "id_column/exclude_columns, or convert the data to Parquet/CSV."
        )
    try:
        if loc.is_local:
            arr = np.load(loc.local_path, mmap_mode="r", allow_pickle=False)
        else:  # only the header here: the workers read their rows in byte ranges
            arr = RemoteNpyFile.open(loc)
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Python objects" in str(exc):
            raise InputError(
                f"{cfg.path}: object arrays are refused (loading them would "
                "unpickle data); save numeric data."
            ) from exc
        raise InputError(f"{cfg.path} is not a readable NPY file: {exc}") from exc
    except (OSError, EOFError) as exc:
        raise InputError(f"{cfg.path} is not a readable NPY file: {exc}") from exc
    if not isinstance(arr, np.ndarray | RemoteNpyFile):  # np.load opens NPZ archives too
        names = list(getattr(arr, "files", []))[:10]
        if hasattr(arr, "close"):
            arr.close()
        raise InputError(
            f"{cfg.path} is an NPZ archive (arrays {names}), not an NPY file; "
            "save the feature matrix with numpy.save and point input.path at "
            "it."
        )
    _check_matrix_dtype(arr.dtype, cfg.path)
    if arr.ndim != 2:
        raise InputError(
            f"{cfg.path} holds an array of shape {arr.shape}; need 2-D (n_samples, n_features)."
        )
    rows = rows_per_chunk(arr.shape[1], chunks.target_chunk_mb)
    # A local file is read by the workers, chunk by chunk, through its own memmap: handing
    # the memmap itself to dask would pickle the whole array into the graph (every byte
    # through the scheduler, and a worker killed for memory when the file is large).
    source = NpyFile(str(loc.local_path), arr.shape, arr.dtype) if loc.is_local else arr
    # (a remote file is a RemoteNpyFile already: its url and storage options travel)
    X = da.from_array(
        source,
        chunks=(rows, -1),
        name=f"npy-{loc.url}-{arr.shape}",
        asarray=False,
        inline_array=True,
    )
    return SourceData(X=X.astype(np.float64), columns=[f"x{i}" for i in range(arr.shape[1])])


class NpyFile:
    """A local NPY file as an array-like that dask can slice: each read opens a read-only
    memmap (no pickle), so only the path travels with the tasks."""

    def __init__(self, path: str, shape: tuple[int, ...], dtype: np.dtype):
        self.path, self.shape, self.dtype = path, tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, key) -> np.ndarray:
        arr = np.load(self.path, mmap_mode="r", allow_pickle=False)
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise InputError(
                f"{self.path} changed while it was being read (now {arr.shape} "
                f"{arr.dtype}); re-run when the file is complete."
            )
        return np.array(arr[key])

    def __dask_tokenize__(self):
        return ("NpyFile", self.path, self.shape, self.dtype.str)


class RemoteNpyFile:
    """An NPY file at a URL (any fsspec filesystem) as an array-like that dask can slice.

    Made from the file's header alone (:meth:`open`, on the client); each read fetches
    only the byte range of its rows (C order: one range; Fortran order: one range per
    column), on whichever worker runs it, through the location's own storage options.
    Only the URL, the options and the layout travel with the tasks, never the data.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict,
        shape: tuple[int, ...],
        dtype: np.dtype,
        offset: int,
        fortran_order: bool,
    ):
        self.url, self.storage_options = url, dict(storage_options)
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        self.offset, self.fortran_order = int(offset), bool(fortran_order)
        self.ndim = len(self.shape)

    @classmethod
    def open(cls, loc: Location) -> RemoteNpyFile:
        """Read and check the header of the NPY file at ``loc`` (ValueError/OSError when
        it is not one: the caller turns them into an InputError)."""
        fmt = np.lib.format
        fs, path = loc.fs, loc.fs_path
        with fs.open(path, "rb") as f:
            head = f.read(6)
            if head.startswith(b"PK"):  # a zip: np.load would open it as an NPZ archive
                raise ValueError(
                    "it is an NPZ archive (a zip of arrays), not an NPY file; save the "
                    "feature matrix with numpy.save"
                )
            f.seek(0)
            major, minor = fmt.read_magic(f)
            if (major, minor) == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif (major, minor) == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"NPY format version {major}.{minor} is not supported")
            offset = f.tell()
        if dtype.hasobject:
            raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
        size = fs.size(path)
        expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size != expected:
            raise ValueError(
                f"the file holds {size} bytes where its header promises {expected} "
                "(truncated or still being written)"
            )
        return cls(loc.url, loc.storage_options, shape, dtype, offset, fortran)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_fs"}

    def _fs_path(self):
        fs = self.__dict__.get("_fs")
        if fs is None:
            import fsspec

            fs, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._fs = fs, path
        return self._fs

    def _rows(self, start: int, stop: int, cols: slice) -> np.ndarray:
        """Rows ``start:stop`` (all columns in C order; ``cols`` in Fortran order)."""
        fs, path = self._fs_path()
        item = self.dtype.itemsize
        n = self.shape[0]
        d = int(np.prod(self.shape[1:], dtype=np.int64)) if self.ndim > 1 else 1
        if start >= stop:
            return np.empty((0, *self.shape[1:]), dtype=self.dtype)
        if not self.fortran_order or self.ndim == 1:
            a = self.offset + start * d * item
            b = self.offset + stop * d * item
            data = fs.cat_file(path, start=a, end=b)
            self._check(len(data), b - a)
            rows = np.frombuffer(data, dtype=self.dtype)
            return rows.reshape((stop - start, *self.shape[1:]))
        # Fortran order (2-D only here): each column's rows are one range
        js = range(*cols.indices(self.shape[1]))
        starts = [self.offset + (j * n + start) * item for j in js]
        ends = [self.offset + (j * n + stop) * item for j in js]
        parts = fs.cat_ranges([path] * len(starts), starts, ends)
        out = np.empty((stop - start, len(starts)), dtype=self.dtype)
        for k, part in enumerate(parts):
            if isinstance(part, BaseException):
                raise part
            self._check(len(part), ends[k] - starts[k])
            out[:, k] = np.frombuffer(part, dtype=self.dtype)
        return out

    def _check(self, got: int, want: int) -> None:
        if got != want:
            raise InputError(
                f"{self.url} changed while it was being read ({got} bytes where {want} "
                "were expected); re-run when the file is complete."
            )

    def __getitem__(self, key) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        rows, rest = key[0], key[1:]
        n = self.shape[0]
        if isinstance(rows, slice) and rows.step in (None, 1):
            start, stop, _ = rows.indices(n)
            local: Any = slice(None)
        else:  # any other selection: the bounding range of its rows, then select
            idx = np.arange(n)[rows]
            start, stop = (int(idx.min()), int(idx.max()) + 1) if idx.size else (0, 0)
            local = idx - start
        cols = rest[0] if rest and isinstance(rest[0], slice) else slice(None)
        block = self._rows(start, max(start, stop), cols)[local]
        if self.fortran_order and self.ndim == 2 and rest and isinstance(rest[0], slice):
            rest = rest[1:]  # the read selected the columns already
        return np.array(block[(slice(None), *rest)] if rest else block)

    def __dask_tokenize__(self):
        return ("RemoteNpyFile", self.url, self.shape, self.dtype.str, self.offset)


def _read_zarr(cfg, loc, chunks) -> SourceData:
    import zarr

    if cfg.columns or cfg.label_column or cfg.id_column or cfg.exclude_columns:
        raise InputError(
            "zarr input has no named columns: remove input.columns/label_column/"
            "id_column/exclude_columns, or pass a Parquet/CSV file."
        )
    try:
        node = zarr.open(
            loc.zarr_store(),
            mode="r",
            **({} if loc.is_local else {"storage_options": cfg.storage_options}),
        )
    except Exception as exc:
        msg = " ".join(str(exc).split())[:300]
        raise InputError(
            f"{cfg.path} is not a readable zarr store ({type(exc).__name__}: "
            f"{msg}); restore it from a good copy or point input.path at an "
            "intact store."
        ) from exc
    if isinstance(node, zarr.Group):
        name = cfg.zarr_array or "X"
        if name not in node:
            raise InputError(
                f"{cfg.path} is a zarr group without an array {name!r}; set "
                f"input.zarr_array to one of {sorted(node.array_keys())}."
            )
        parent, node = node, node[name]
        if isinstance(node, zarr.Group):
            raise InputError(
                f"{cfg.path}: {name!r} is a zarr group, not an array; set "
                f"input.zarr_array to an array's path (arrays at the top: "
                f"{sorted(parent.array_keys())[:10]})."
            )
    _check_matrix_dtype(node.dtype, cfg.path)
    if node.ndim != 2:
        raise InputError(f"{cfg.path}: array of shape {node.shape}; need 2-D.")
    if cfg.missing_chunks == "error":
        missing = missing_zarr_chunks(node)
        if missing:
            raise InputError(
                f"{cfg.path}: {describe_missing_chunks(node, missing)}; zarr would read them "
                "as zeros. Restore the store from a good copy, or set input.missing_chunks: "
                "fill if those chunks are meant to hold the fill value."
            )
    elif missing_zarr_chunks(node):
        logger.warning(
            "ingest: %s lacks chunk files; reading them as the fill value %r "
            "(input.missing_chunks: fill)",
            cfg.path,
            node.fill_value,
        )
    X = da.from_zarr(node)
    rows = rows_per_chunk(node.shape[1], chunks.target_chunk_mb)
    X = X.rechunk({0: rows, 1: -1})
    return SourceData(X=X.astype(np.float64), columns=[f"x{i}" for i in range(node.shape[1])])


def _check_matrix_dtype(dtype, path) -> None:
    dtype = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    if dtype.kind == "c":
        raise InputError(f"{path}: complex values; kernel PCA needs real numbers.")
    if dtype.kind not in "fiub":
        raise InputError(
            f"{path}: dtype {dtype} is not numeric; store numbers (encode "
            "categorical columns first)."
        )


def _csv_id_dtype(cfg: InputConfig) -> str:
    """The dtype a CSV file's id column is read with: ``int64`` when every id is written
    as a canonical integer, else ``str`` (pipeline/scan.py's rule; one streaming pass over
    that column). Never float: a float64 holds integers exactly only up to 2**53."""
    from .scan import csv_id_type

    loc = Location(cfg.path, cfg.storage_options)
    try:
        kind, missing = csv_id_type(cfg.path, loc.fs, loc.fs_path, cfg.id_column)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors: reported as the file's
        raise InputError(explain_table_error(cfg.path, exc)) from exc
    if missing is not None:
        raise InputError(
            f"id column {cfg.id_column!r} of {cfg.path} has no value in row {missing}; "
            "every row needs an id (fill it, or drop input.id_column)."
        )
    return "int64" if kind == "int64" else "str"


def _open_table(cfg: InputConfig, fmt: str, *, read_ids: bool = False):
    """The source as a lazy dask DataFrame (nothing read but the schema and a sample;
    with ``read_ids``, a CSV file's id column once, to choose its exact dtype)."""
    import dask.dataframe as dd

    opts = dict(cfg.storage_options)
    try:
        if fmt == "csv":
            # ids as the file writes them: int64 or text, never float64 (assume_missing
            # reads every integer column as float, which rounds ids above 2**53)
            dtype = {}
            if read_ids and cfg.id_column is not None:
                dtype[cfg.id_column] = _csv_id_dtype(cfg)
            elif cfg.id_column is not None:
                dtype[cfg.id_column] = "str"
            df = dd.read_csv(
                cfg.path,
                storage_options=opts or None,
                blocksize="64MB",
                assume_missing=True,
                sample_rows=1000,
                dtype=dtype or None,
            )
        else:
            df = dd.read_parquet(cfg.path, storage_options=opts or None)
    except Exception as exc:  # pandas/pyarrow raise many types for bad files
        if type(exc).__name__ == "EmptyDataError":
            raise InputError(
                f"{cfg.path} is empty (no header, no rows); point input.path at a "
                "file with data."
            ) from exc
        raise InputError(explain_table_error(cfg.path, exc, fmt)) from exc
    if not list(df.columns):
        raise InputError(
            f"{cfg.path} has no columns (empty file?); point input.path at a file with data."
        )
    return df


def table_columns(cfg: InputConfig) -> tuple[list[str], dict[str, str]] | None:
    """A CSV/Parquet source's column names and dtypes (from its schema and a sample;
    no pass over the data), or None for NPY/zarr input (no names)."""
    check_exists(cfg)
    fmt = detect_format(cfg)
    if fmt not in ("csv", "parquet"):
        return None
    df = _open_table(cfg, fmt)
    return [str(c) for c in df.columns], {str(c): str(t) for c, t in df.dtypes.items()}


def _read_table(
    cfg: InputConfig, fmt: str, chunks: ChunkConfig, *, min_classes: int = 2
) -> SourceData:
    df = _open_table(cfg.model_copy(update={"id_column": None}), fmt)
    available = [str(c) for c in df.columns]
    for what, col in (("label_column", cfg.label_column), ("id_column", cfg.id_column)):
        if col is not None and col not in available:
            raise InputError(
                f"input.{what} {col!r} is not a column of {cfg.path}; "
                + column_hint(col, available)
            )
    if fmt == "csv" and cfg.id_column is not None:
        df = _open_table(cfg, fmt, read_ids=True)
    available = list(df.columns)
    try:  # the policy for bool, text, categorical and datetime columns: pipeline/features.py
        selection = select_features(
            cfg.path,
            available,
            dict(df.dtypes.items()),
            columns=cfg.columns,
            exclude=cfg.exclude_columns,
            id_column=cfg.id_column,
            label_column=cfg.label_column,
        )
    except FeatureError as exc:
        if "has no numeric feature columns" in str(exc) and fmt == "csv" and _no_rows(df):
            raise InputError(
                f"{cfg.path} is empty: it has a header ({available[:5]}) but no "
                "data rows; point input.path at a file with data."
            ) from None
        raise InputError(str(exc)) from None
    features = selection.features
    try:
        X = df[features].astype("float64").to_dask_array(lengths=True)
    except Exception as exc:
        raise InputError(explain_table_error(cfg.path, exc)) from exc
    labels = classes = ids = None
    if cfg.label_column:
        labels, classes = _encode_labels(df[cfg.label_column], cfg, min_classes)
    if cfg.id_column:
        ids = df[cfg.id_column].to_dask_array(lengths=list(X.chunks[0]))
        if ids.dtype.kind not in "iuf":  # text (object or a pandas string dtype)
            ids = ids.astype(str)
    rows = rows_per_chunk(len(features), chunks.target_chunk_mb)
    X = X.rechunk({0: rows, 1: -1})
    if labels is not None:
        labels = labels.rechunk({0: X.chunks[0]})
    if ids is not None:
        ids = ids.rechunk({0: X.chunks[0]})
    return SourceData(
        X=X,
        columns=[str(c) for c in features],
        labels=labels,
        classes=classes,
        ids=ids,
        selection=selection,
    )


def _is_numeric(dtype) -> bool:
    try:
        return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_complex_dtype(dtype)
    except TypeError:
        return False


def _no_rows(df) -> bool:
    try:
        return len(df.head(1, npartitions=-1, compute=True)) == 0
    except Exception:  # noqa: BLE001 - only a hint for the message; the read itself reports
        return False


def explain_table_error(path: str, exc: Exception, fmt: str = "csv") -> str:
    msg = str(exc)
    if "Original Message:" in msg:  # dask's wrapper around the pandas error: keep the cause
        msg = msg.split("Original Message:", 1)[1]
    if "Mismatched dtypes" in msg:  # dask's sample said numeric, a later row holds text
        import re

        cols = re.findall(r"^\|\s*(\S+)\s*\|\s*(?:object|str|string)\s*\|", msg, re.MULTILINE)
        why = re.search(r"could not convert [^\n]*?'[^']*'", msg)
        return (
            f"{path}: column(s) {cols or '?'} hold text where numbers are expected"
            f"{f' ({why.group(0)})' if why else ''}; clean the file, or leave those columns "
            "out of input.columns."
        )
    msg = " ".join(msg.split())
    if "Expected" in msg and "fields" in msg:
        return (
            f"{path} is ragged: {msg.strip()}. Every row needs the same number of "
            "fields; fix the file (quoting? stray delimiters?)."
        )
    if "could not convert" in msg or "Unable to parse" in msg:
        return (
            f"{path}: a feature column holds text where numbers are expected ({msg.strip()}); "
            "set input.columns to numeric columns only."
        )
    return (
        f"cannot read {path} as {fmt} ({type(exc).__name__}: {msg}); check that the file "
        "is intact and input.format is right."
    )


def _encode_labels(col, cfg: InputConfig, min_classes: int = 2) -> tuple[da.Array, list[str]]:
    try:
        uniques = col.dropna().unique().compute()
    except Exception as exc:
        raise InputError(explain_table_error(cfg.path, exc)) from exc
    classes = sorted(map(str, uniques.tolist()))
    if len(classes) < min_classes:
        raise InputError(
            f"label column {cfg.label_column!r} has {len(classes)} class(es); "
            "evaluation needs at least 2 (or drop input.label_column)."
        )
    lookup = {c: i for i, c in enumerate(classes)}

    def codes(s: pd.Series) -> np.ndarray:
        return s.map(lambda v: -1 if pd.isna(v) else lookup[str(v)]).to_numpy(dtype=np.int64)

    labels = col.map_partitions(
        lambda s: pd.Series(codes(s), index=s.index), meta=(cfg.label_column, "int64")
    ).to_dask_array(lengths=True)
    return labels, classes
