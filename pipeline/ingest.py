"""Ingest: read NPY, CSV, Parquet or zarr into a zarr v3 store of row chunks.

``read_input`` turns a source (local path or fsspec URL) into lazy dask arrays:
the float64 feature matrix, optional class labels (int codes plus the class
names) and optional row ids. ``ingest`` validates them (shape, numeric columns,
NaN/inf policy), writes them to ``<work>/ingest.zarr`` in row chunks of about
``target_chunk_mb`` and records a content fingerprint -- all in one pass over
the input. Re-running with an unchanged source and config is a no-op (the
store's attributes record both).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
import pandas as pd

from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks

from .config import ChunkConfig, InputConfig
from .progress import compute
from .store import Location, _digest_blocks

__all__ = ["InputError", "IngestResult", "SourceData", "read_input", "ingest", "load_ingested",
           "detect_format", "stale_ingest"]

logger = logging.getLogger("pipeline")


class InputError(ValueError):
    """The input cannot be used as it is; the message names the problem and the fix."""


@dataclass
class SourceData:
    """Lazy arrays read from a source."""

    X: da.Array
    columns: list[str]
    labels: da.Array | None = None
    classes: list[str] | None = None
    ids: da.Array | None = None


@dataclass
class IngestResult:
    """What the ingest stage wrote (small, JSON-serialisable: passed between tasks)."""

    path: str
    n_rows: int
    n_features: int
    columns: list[str]
    rows_per_chunk: int
    fingerprint: str
    dropped_rows: int = 0
    label_column: str | None = None
    id_column: str | None = None
    classes: list[str] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IngestResult:
        return cls(**d)

    @property
    def has_labels(self) -> bool:
        return self.label_column is not None


# ----------------------------------------------------------------------- reading
def detect_format(cfg: InputConfig) -> str:
    if cfg.format != "auto":
        return cfg.format
    p = cfg.path.rstrip("/").lower()
    for suffix, fmt in ((".npy", "npy"), (".csv", "csv"), (".csv.gz", "csv"), (".tsv", "csv"),
                        (".parquet", "parquet"), (".pq", "parquet"), (".zarr", "zarr")):
        if p.endswith(suffix):
            return fmt
    loc = Location(cfg.path, cfg.storage_options)
    if loc.exists() and loc.fs.isdir(loc.fs_path):
        files = loc.fs.ls(loc.fs_path, detail=False)
        if any(str(f).endswith((".parquet", ".pq")) for f in files):
            return "parquet"
        if any(str(f).endswith("zarr.json") for f in files):
            return "zarr"
    raise InputError(
        f"cannot infer the format of {cfg.path!r} from its name; set input.format to one of "
        "npy, csv, parquet, zarr."
    )


def _check_exists(cfg: InputConfig) -> Location:
    loc = Location(cfg.path, cfg.storage_options)
    try:
        ok = loc.exists()
    except ImportError as exc:  # e.g. s3fs missing
        raise InputError(f"cannot open {cfg.path!r}: {exc} (install the fsspec backend for this "
                         "URL scheme, e.g. `pip install s3fs`).") from exc
    if not ok:
        raise InputError(f"input {cfg.path!r} does not exist; check input.path.")
    return loc


def _rows_per_chunk(n_features: int, target_mb: float) -> int:
    return max(1, int(target_mb * 1e6 // (max(1, n_features) * 8)))


def read_input(cfg: InputConfig, chunks: ChunkConfig | None = None) -> SourceData:
    """Lazy feature matrix (+ labels, ids) from the configured source."""
    chunks = chunks or ChunkConfig()
    loc = _check_exists(cfg)
    fmt = detect_format(cfg)
    if fmt == "npy":
        return _read_npy(cfg, loc, chunks)
    if fmt == "zarr":
        return _read_zarr(cfg, loc, chunks)
    return _read_table(cfg, fmt, chunks)


def _read_npy(cfg, loc, chunks) -> SourceData:
    if cfg.columns or cfg.label_column or cfg.id_column:
        raise InputError("NPY input has no named columns: remove input.columns/label_column/"
                         "id_column, or convert the data to Parquet/CSV.")
    try:
        if loc.is_local:
            arr = np.load(loc.local_path, mmap_mode="r", allow_pickle=False)
        else:  # remote NPY is read whole (use Parquet or zarr for large remote data)
            with loc.fs.open(loc.fs_path, "rb") as f:
                arr = np.load(f, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Python objects" in str(exc):
            raise InputError(f"{cfg.path}: object arrays are refused (loading them would "
                             "unpickle data); save numeric data.") from exc
        raise InputError(f"{cfg.path} is not a readable NPY file: {exc}") from exc
    except (OSError, EOFError) as exc:
        raise InputError(f"{cfg.path} is not a readable NPY file: {exc}") from exc
    if not isinstance(arr, np.ndarray):  # np.load opens NPZ archives whatever the name
        names = list(getattr(arr, "files", []))[:10]
        if hasattr(arr, "close"):
            arr.close()
        raise InputError(f"{cfg.path} is an NPZ archive (arrays {names}), not an NPY file; "
                         "save the feature matrix with numpy.save and point input.path at "
                         "it.")
    _check_matrix_dtype(arr.dtype, cfg.path)
    if arr.ndim != 2:
        raise InputError(f"{cfg.path} holds an array of shape {arr.shape}; need 2-D "
                         "(n_samples, n_features).")
    rows = _rows_per_chunk(arr.shape[1], chunks.target_chunk_mb)
    # A local file is read by the workers, chunk by chunk, through its own memmap: handing
    # the memmap itself to dask would pickle the whole array into the graph (every byte
    # through the scheduler, and a worker killed for memory when the file is large).
    source = NpyFile(str(loc.local_path), arr.shape, arr.dtype) if loc.is_local else arr
    X = da.from_array(source, chunks=(rows, -1), name=f"npy-{loc.url}-{arr.shape}",
                      asarray=False, inline_array=True)
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
            raise InputError(f"{self.path} changed while it was being read (now {arr.shape} "
                             f"{arr.dtype}); re-run when the file is complete.")
        return np.array(arr[key])

    def __dask_tokenize__(self):
        return ("NpyFile", self.path, self.shape, self.dtype.str)


def _read_zarr(cfg, loc, chunks) -> SourceData:
    import zarr

    if cfg.columns or cfg.label_column or cfg.id_column:
        raise InputError("zarr input has no named columns: remove input.columns/label_column/"
                         "id_column, or pass a Parquet/CSV file.")
    try:
        node = zarr.open(loc.zarr_store(), mode="r",
                         **({} if loc.is_local else {"storage_options": cfg.storage_options}))
    except Exception as exc:
        msg = " ".join(str(exc).split())[:300]
        raise InputError(f"{cfg.path} is not a readable zarr store ({type(exc).__name__}: "
                         f"{msg}); restore it from a good copy or point input.path at an "
                         "intact store.") from exc
    if isinstance(node, zarr.Group):
        name = cfg.zarr_array or "X"
        if name not in node:
            raise InputError(f"{cfg.path} is a zarr group without an array {name!r}; set "
                             f"input.zarr_array to one of {sorted(node.array_keys())}.")
        parent, node = node, node[name]
        if isinstance(node, zarr.Group):
            raise InputError(f"{cfg.path}: {name!r} is a zarr group, not an array; set "
                             f"input.zarr_array to an array's path (arrays at the top: "
                             f"{sorted(parent.array_keys())[:10]}).")
    _check_matrix_dtype(node.dtype, cfg.path)
    if node.ndim != 2:
        raise InputError(f"{cfg.path}: array of shape {node.shape}; need 2-D.")
    if cfg.missing_chunks == "error":
        missing = missing_zarr_chunks(node)
        if missing:
            raise InputError(
                f"{cfg.path}: {describe_missing_chunks(node, missing)}; zarr would read them "
                "as zeros. Restore the store from a good copy, or set input.missing_chunks: "
                "fill if those chunks are meant to hold the fill value.")
    elif missing_zarr_chunks(node):
        logger.warning("ingest: %s lacks chunk files; reading them as the fill value %r "
                       "(input.missing_chunks: fill)", cfg.path, node.fill_value)
    X = da.from_zarr(node)
    rows = _rows_per_chunk(node.shape[1], chunks.target_chunk_mb)
    X = X.rechunk({0: rows, 1: -1})
    return SourceData(X=X.astype(np.float64), columns=[f"x{i}" for i in range(node.shape[1])])


def _check_matrix_dtype(dtype, path) -> None:
    dtype = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    if dtype.kind == "c":
        raise InputError(f"{path}: complex values; kernel PCA needs real numbers.")
    if dtype.kind not in "fiub":
        raise InputError(f"{path}: dtype {dtype} is not numeric; store numbers (encode "
                         "categorical columns first).")


def _read_table(cfg: InputConfig, fmt: str, chunks: ChunkConfig) -> SourceData:
    import dask.dataframe as dd

    opts = dict(cfg.storage_options)
    try:
        if fmt == "csv":
            df = dd.read_csv(cfg.path, storage_options=opts or None, blocksize="64MB",
                             assume_missing=True, sample_rows=1000)
        else:
            df = dd.read_parquet(cfg.path, storage_options=opts or None)
    except Exception as exc:  # pandas/pyarrow raise many types for bad files
        if type(exc).__name__ == "EmptyDataError":
            raise InputError(f"{cfg.path} is empty (no header, no rows); point input.path at a "
                             "file with data.") from exc
        raise InputError(_explain_table_error(cfg.path, exc, fmt)) from exc
    available = list(df.columns)
    if not available:
        raise InputError(f"{cfg.path} has no columns (empty file?); point input.path at a file "
                         "with data.")
    for what, col in (("label_column", cfg.label_column), ("id_column", cfg.id_column)):
        if col is not None and col not in available:
            raise InputError(f"input.{what} {col!r} is not a column of {cfg.path}; available: "
                             f"{available[:20]}")
    reserved = {cfg.label_column, cfg.id_column} - {None}
    if cfg.columns:
        missing = [c for c in cfg.columns if c not in available]
        if missing:
            raise InputError(f"input.columns {missing} are not in {cfg.path}; available: "
                             f"{available[:20]}")
        features = list(cfg.columns)
        bad = [c for c in features if not _is_numeric(df[c].dtype)]
        if bad:
            raise InputError(f"input.columns {bad} are not numeric ({[str(df[c].dtype) for c in bad]}); "
                             "drop them from input.columns or encode them as numbers.")
    else:
        features = [c for c in available if c not in reserved and _is_numeric(df[c].dtype)]
        skipped = [c for c in available if c not in reserved and c not in features]
        if skipped:
            logger.warning("ingest: ignoring non-numeric columns %s (list input.columns to "
                           "choose features explicitly)", skipped[:10])
        if not features and fmt == "csv" and _no_rows(df):
            raise InputError(f"{cfg.path} is empty: it has a header ({available[:5]}) but no "
                             "data rows; point input.path at a file with data.")
        if not features:
            raise InputError(f"{cfg.path} has no numeric feature columns (columns: "
                             f"{available[:20]}); set input.columns.")
    try:
        X = df[features].astype("float64").to_dask_array(lengths=True)
    except Exception as exc:
        raise InputError(_explain_table_error(cfg.path, exc)) from exc
    labels = classes = ids = None
    if cfg.label_column:
        labels, classes = _encode_labels(df[cfg.label_column], cfg)
    if cfg.id_column:
        ids = df[cfg.id_column].to_dask_array(lengths=list(X.chunks[0]))
        if ids.dtype == object:
            ids = ids.astype(str)
    rows = _rows_per_chunk(len(features), chunks.target_chunk_mb)
    X = X.rechunk({0: rows, 1: -1})
    if labels is not None:
        labels = labels.rechunk({0: X.chunks[0]})
    if ids is not None:
        ids = ids.rechunk({0: X.chunks[0]})
    return SourceData(X=X, columns=[str(c) for c in features], labels=labels, classes=classes,
                      ids=ids)


def _is_numeric(dtype) -> bool:
    try:
        return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_complex_dtype(dtype)
    except TypeError:
        return False


def _no_rows(df) -> bool:
    try:
        return len(df.head(1, npartitions=-1, compute=True)) == 0
    except Exception:
        return False


def _explain_table_error(path: str, exc: Exception, fmt: str = "csv") -> str:
    msg = str(exc)
    if "Original Message:" in msg:  # dask's wrapper around the pandas error: keep the cause
        msg = msg.split("Original Message:", 1)[1]
    if "Mismatched dtypes" in msg:  # dask's sample said numeric, a later row holds text
        import re

        cols = re.findall(r"^\|\s*(\S+)\s*\|\s*(?:object|str|string)\s*\|", msg, re.M)
        why = re.search(r"could not convert [^\n]*?'[^']*'", msg)
        return (f"{path}: column(s) {cols or '?'} hold text where numbers are expected"
                f"{f' ({why.group(0)})' if why else ''}; clean the file, or leave those columns "
                "out of input.columns.")
    msg = " ".join(msg.split())
    if "Expected" in msg and "fields" in msg:
        return (f"{path} is ragged: {msg.strip()}. Every row needs the same number of "
                "fields; fix the file (quoting? stray delimiters?).")
    if "could not convert" in msg or "Unable to parse" in msg:
        return (f"{path}: a feature column holds text where numbers are expected ({msg.strip()}); "
                "set input.columns to numeric columns only.")
    return (f"cannot read {path} as {fmt} ({type(exc).__name__}: {msg}); check that the file "
            "is intact and input.format is right.")


def _encode_labels(col, cfg: InputConfig) -> tuple[da.Array, list[str]]:
    try:
        uniques = col.dropna().unique().compute()
    except Exception as exc:
        raise InputError(_explain_table_error(cfg.path, exc)) from exc
    classes = sorted(map(str, uniques.tolist()))
    if len(classes) < 2:
        raise InputError(f"label column {cfg.label_column!r} has {len(classes)} class(es); "
                         "evaluation needs at least 2 (or drop input.label_column).")
    lookup = {c: i for i, c in enumerate(classes)}

    def codes(s: pd.Series) -> np.ndarray:
        return s.map(lambda v: -1 if pd.isna(v) else lookup[str(v)]).to_numpy(dtype=np.int64)

    labels = col.map_partitions(lambda s: pd.Series(codes(s), index=s.index),
                                meta=(cfg.label_column, "int64")).to_dask_array(lengths=True)
    return labels, classes


# ----------------------------------------------------------------------- writing
def _nonfinite_rows(x: np.ndarray) -> np.ndarray:
    return (~np.isfinite(x)).any(axis=1)


def _source_signature(cfg: InputConfig, chunks: ChunkConfig) -> dict[str, Any]:
    loc = Location(cfg.path, cfg.storage_options)
    fs, path = loc.fs, loc.fs_path
    files = fs.find(path, detail=True) if fs.isdir(path) else {path: fs.info(path)}
    stats = sorted((str(k), v.get("size"), str(v.get("mtime") or v.get("LastModified") or
                                                 v.get("ETag") or v.get("created") or ""))
                   for k, v in files.items())
    sig = {"config": cfg.model_dump(mode="json"), "target_chunk_mb": chunks.target_chunk_mb,
           "files": stats, "content": _content_hash(loc, sorted(files)) if loc.is_local else None}
    return json.loads(json.dumps(sig))  # the form it takes once stored in zarr attributes


def _content_hash(loc: Location, files: list[str]) -> str:
    """BLAKE2b of a local source's bytes (names relative to it): a file edited in place with
    its size and modification time kept is not taken for the ingested one."""
    h = hashlib.blake2b(digest_size=20)
    root = loc.fs_path.rstrip("/")
    for f in files:
        h.update(str(f)[len(root):].encode() + b"\0")
        with loc.fs.open(f, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return "blake2b:" + h.hexdigest()


def _store_digests(arrays: dict[str, da.Array]) -> dict[str, da.Array]:
    return {k: _digest_blocks(a) for k, a in arrays.items()}


def _hex(digests: dict[str, np.ndarray]) -> dict[str, str]:
    return {k: np.ascontiguousarray(v).tobytes().hex() for k, v in sorted(digests.items())}


def _store_problem(store: Location, attrs: dict[str, Any]) -> str | None:
    """Why a complete ingest store cannot be reused as it is (None: it is intact): a chunk
    file missing (zarr would read zeros) or a chunk whose content changed."""
    g = store.open_group("r")
    want = attrs.get("digests")
    if not isinstance(want, dict) or set(want) != set(g.array_keys()):
        return "it records no chunk digests (written by an older version)"
    arrays = {}
    for name in sorted(want):
        missing = missing_zarr_chunks(g[name])
        if missing:
            return f"array {name!r}: {describe_missing_chunks(g[name], missing)}"
        arrays[name] = da.from_zarr(g[name])
    got = _hex(dict(zip(arrays, compute(*_store_digests(arrays).values(), label="verify")))
               ) if arrays else {}
    bad = sorted(k for k in want if got.get(k) != want[k])
    return f"the content of {bad} differs from what was written" if bad else None


def stale_ingest(cfg: InputConfig, chunks: ChunkConfig, store: Location) -> str | None:
    """Why the ingest store cannot stand for this input now (None: it can): incomplete,
    built from other input or config, or damaged (a chunk missing or changed). The same
    test the ingest stage applies before reusing it; the flows' cache asks it too."""
    try:
        attrs = dict(store.open_group("r").attrs)
    except Exception as exc:  # noqa: BLE001 - absent or unreadable: not reusable
        return f"the ingest store cannot be opened ({type(exc).__name__})"
    if attrs.get("status") != "complete":
        return "the ingest store is incomplete"
    if attrs.get("source") != _source_signature(cfg, chunks):
        return "the input or its config changed since it was ingested"
    problem = _store_problem(store, attrs)
    return f"the ingest store is damaged: {problem}" if problem else None


def ingest(cfg: InputConfig, chunks: ChunkConfig, store: Location, *,
           force: bool = False) -> IngestResult:
    """Validate the input and write it to ``store`` (a zarr group) in row chunks.

    Idempotent: if ``store`` holds a complete ingest of the same source (same
    files, sizes, modification times) and config, it is reused as is.
    """
    t0 = time.perf_counter()
    _check_exists(cfg)
    signature = _source_signature(cfg, chunks)
    if not force and store.exists():
        try:
            g = store.open_group("r")
            attrs = dict(g.attrs)
            if attrs.get("status") == "complete" and attrs.get("source") == signature:
                problem = _store_problem(store, attrs)
                if problem is None:
                    res = IngestResult.from_dict(attrs["result"])
                    # the store where it is now (a copied run folder reuses its own copy)
                    res.path, res.reused = str(store), True
                    logger.info("ingest: reusing %s (unchanged source, fingerprint %s)", store,
                                res.fingerprint)
                    return res
                logger.warning("ingest: not reusing %s: %s; rebuilding it from the input",
                               store, problem)
        except Exception as exc:  # unreadable or partial store: rebuild it
            logger.info("ingest: not reusing %s (%s: %s)", store, type(exc).__name__, exc)
    src = read_input(cfg, chunks)
    X = src.X
    n, d = (int(s) for s in X.shape)
    if n == 0 or d == 0:
        raise InputError(f"{cfg.path} is empty: {n} rows x {d} feature columns.")
    logger.info("ingest: %s -> %s: %d rows x %d features in chunks of %d rows", cfg.path, store,
                n, d, X.chunks[0][0])

    bad_rows = X.map_blocks(_nonfinite_rows, drop_axis=1, dtype=bool)
    label_bad = (src.labels < 0) if src.labels is not None else None
    checks = [bad_rows] + ([label_bad] if label_bad is not None else [])
    dropped = 0
    if cfg.nonfinite == "drop" or label_bad is not None:
        masks = dask.compute(*checks)
        bad = masks[0].copy()
        if label_bad is not None:
            nl = int(masks[1].sum())
            if nl and cfg.nonfinite != "drop":
                first = int(np.flatnonzero(masks[1])[0])
                raise InputError(f"label column {cfg.label_column!r} is missing in {nl} rows "
                                 f"(first: row {first}); fill them or set input.nonfinite: drop.")
            bad |= masks[1]
        if bad.any() and cfg.nonfinite == "error":
            first = int(np.flatnonzero(bad)[0])
            raise InputError(f"{cfg.path} contains NaN or infinity in "
                             f"{_count(int(bad.sum()), 'row')} "
                             f"(first: row {first}); clean the data or set input.nonfinite: drop.")
        dropped = int(bad.sum())
        if dropped:
            keep = ~bad
            logger.warning("ingest: dropping %d of %d rows with NaN/inf or missing labels",
                           dropped, n)
            X = X[keep]
            src.labels = src.labels[keep] if src.labels is not None else None
            src.ids = src.ids[keep] if src.ids is not None else None
            rows = X.chunks[0][0] if X.chunks[0] else 1
            X = X.rechunk({0: max(rows, _rows_per_chunk(d, chunks.target_chunk_mb))})
            n = int(X.shape[0])
            if n == 0:
                raise InputError(f"every row of {cfg.path} has NaN/inf: nothing left to fit.")
    arrays = {"X": X}
    if src.labels is not None:
        arrays["labels"] = src.labels.rechunk({0: X.chunks[0]})
    if src.ids is not None:
        arrays["ids"] = src.ids.rechunk({0: X.chunks[0]})

    # One pass over the input: write every array, count NaN/inf, digest chunks.
    store.remove()
    g = store.open_group("w")
    targets, sources = [], []
    for name, arr in arrays.items():
        dtype = str if arr.dtype.kind in "OUT" else arr.dtype
        # every chunk written, also one equal to the fill value: a missing chunk file is
        # then always damage, never "zeros" (missing_zarr_chunks on reuse and read)
        z = g.create_array(name, shape=arr.shape, dtype=dtype,
                           chunks=(arr.chunks[0][0],) + tuple(arr.shape[1:]),
                           config={"write_empty_chunks": True})
        targets.append(z)
        sources.append(arr)
    stored = da.store(sources, targets, lock=False, compute=False)
    digests = {k: _digest_blocks(a) for k, a in arrays.items()}
    counts = X.map_blocks(lambda x: np.array([np.count_nonzero(~np.isfinite(x))]), drop_axis=1,
                          chunks=((1,) * len(X.chunks[0]),), dtype=np.int64)
    try:
        _, digest_values, nonfinite = compute(stored, digests, counts, label="ingest")
    except (RuntimeError, ValueError, EOFError) as exc:
        if isinstance(exc, InputError):
            raise
        store.remove()
        raise InputError(_damaged_message(cfg.path, exc)) from exc
    if int(nonfinite.sum()):
        store.remove()
        offs = np.concatenate([[0], np.cumsum(X.chunks[0])])
        b = int(np.flatnonzero(nonfinite)[0])
        raise InputError(
            f"{cfg.path} contains NaN or infinity ({_count(int(nonfinite.sum()), 'value')}; "
            "the first in "
            f"rows {offs[b]}-{offs[b + 1] - 1}); clean the data or set input.nonfinite: drop.")
    fingerprint = _fingerprint_from_digests(arrays, digest_values,
                                            {"columns": src.columns, "classes": src.classes})
    if src.classes is not None:
        g["labels"].attrs["classes"] = src.classes
    res = IngestResult(path=str(store), n_rows=n, n_features=d, columns=src.columns,
                       rows_per_chunk=int(X.chunks[0][0]), fingerprint=fingerprint,
                       dropped_rows=dropped, label_column=cfg.label_column,
                       id_column=cfg.id_column, classes=src.classes,
                       source={"path": cfg.path}, seconds=time.perf_counter() - t0)
    # the result as stored: its location is wherever the store is when it is reused
    g.attrs.update({"status": "complete", "kind": "kpca-dask-ingest", "source": signature,
                    "result": {**res.to_dict(), "path": ""}, "columns": src.columns,
                    "digests": _hex({k: digest_values[k] for k in arrays})})
    logger.info("ingest: wrote %d rows x %d features in %.1f s (fingerprint %s)", n, d,
                res.seconds, fingerprint)
    return res


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _damaged_message(path: str, exc: BaseException) -> str:
    if "Expected" in str(exc) or "could not convert" in str(exc) or "Unable to parse" in str(exc):
        return _explain_table_error(path, exc)  # type: ignore[arg-type]
    msg = " ".join(str(exc).split())[:300]
    return (f"reading {path} failed part way ({type(exc).__name__}: {msg}): the input is "
            "damaged (a corrupt chunk or a truncated file?); restore it from a good copy.")


def _fingerprint_from_digests(arrays, digest_values, extra) -> str:
    h = hashlib.blake2b(digest_size=20)
    for k in sorted(arrays):
        a = arrays[k]
        h.update(f"{k}:{a.shape}:{a.dtype.str}".encode())
        h.update(np.ascontiguousarray(digest_values[k]).tobytes())
    h.update(json.dumps(extra, sort_keys=True).encode())
    return "blake2b:" + h.hexdigest()


def load_ingested(res: IngestResult) -> SourceData:
    """Lazy arrays from a completed ingest store."""
    loc = Location(res.path)
    g = loc.open_group("r")
    for name in g.array_keys():
        missing = missing_zarr_chunks(g[name])
        if missing:
            raise InputError(
                f"the ingest store {res.path} is damaged: array {name!r}: "
                f"{describe_missing_chunks(g[name], missing)}; re-run: the ingest stage "
                "rebuilds it from the input.")
    X = da.from_zarr(g["X"])
    labels = da.from_zarr(g["labels"]) if "labels" in g else None
    ids = da.from_zarr(g["ids"]) if "ids" in g else None
    return SourceData(X=X, columns=res.columns, labels=labels, classes=res.classes, ids=ids)

