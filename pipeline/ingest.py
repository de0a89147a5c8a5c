"""Ingest: read NPY, CSV, Parquet or zarr into a zarr v3 store of row chunks.

``read_input`` (pipeline/readers.py) turns a source (local path or fsspec URL)
into lazy dask arrays: the float64 feature matrix, optional class labels (int
codes plus the class names) and optional row ids. ``ingest`` validates them
(shape, numeric columns, NaN/inf policy), writes them to ``<work>/ingest.zarr`` in
row chunks of about ``target_chunk_mb`` and records a content fingerprint -- all in
one pass over the input. Re-running with an unchanged source and config is a no-op (the
store's attributes record both).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import dask
import dask.array as da
import numpy as np

from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks

from .config import ChunkConfig, InputConfig
from .errors import CorruptObjectError
from .features import record as record_features
from .progress import compute
from .readers import (
    InputError,
    SourceData,
    check_exists,
    detect_format,
    explain_table_error,
    read_input,
    rows_per_chunk,
)
from .store import Location, _digest_blocks
from .verify import checked_array

# InputError, SourceData, read_input and detect_format live in pipeline/readers.py; they
# are re-exported here for the callers that import them from the stage
__all__ = [
    "IngestResult",
    "InputError",
    "SourceData",
    "detect_format",
    "ingest",
    "load_ingested",
    "read_input",
    "stale_ingest",
]

#: the name pipeline/run.py imports (pipeline/readers.py: check_exists)
_check_exists = check_exists

logger = logging.getLogger("pipeline")


@dataclass(frozen=True)
class IngestResult:
    """What the ingest stage wrote (small, JSON-serialisable: passed between tasks).

    ``store`` is the ingest store with its storage options; the JSON form
    (:meth:`to_dict`) keeps it flat as ``path`` and ``storage_options``.
    """

    store: Location
    n_rows: int
    n_features: int
    columns: list[str]
    rows_per_chunk: int
    fingerprint: str
    dropped_rows: int = 0
    label_column: str | None = None
    id_column: str | None = None
    classes: list[str] | None = None
    #: the features block: names, dtypes, bool/id/label columns, how they were chosen
    #: (pipeline/features.py: record); None in results written before it existed
    features: dict[str, Any] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    reused: bool = False

    @property
    def path(self) -> str:
        return self.store.url

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("store")
        return {
            "path": self.store.url,
            "storage_options": dict(self.store.storage_options),
            **d,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IngestResult:
        d = dict(d)
        store = Location(d.pop("path"), dict(d.pop("storage_options", None) or {}))
        return cls(store=store, **d)

    @property
    def has_labels(self) -> bool:
        return self.label_column is not None


# ----------------------------------------------------------------------- writing
def _nonfinite_rows(x: np.ndarray) -> np.ndarray:
    return (~np.isfinite(x)).any(axis=1)


def _source_signature(cfg: InputConfig, chunks: ChunkConfig) -> dict[str, Any]:
    loc = Location(cfg.path, cfg.storage_options)
    fs, path = loc.fs, loc.fs_path
    files = fs.find(path, detail=True) if fs.isdir(path) else {path: fs.info(path)}
    stats = sorted(
        (
            str(k),
            v.get("size"),
            str(
                v.get("mtime")
                or v.get("LastModified")
                or v.get("ETag")
                or v.get("created")
                or ""
            ),
        )
        for k, v in files.items()
    )
    sig = {
        "config": cfg.model_dump(mode="json"),
        "target_chunk_mb": chunks.target_chunk_mb,
        "files": stats,
        "content": _content_hash(loc, sorted(files)) if loc.is_local else None,
    }
    return json.loads(json.dumps(sig))  # the form it takes once stored in zarr attributes


def _content_hash(loc: Location, files: list[str]) -> str:
    """BLAKE2b of a local source's bytes (names relative to it): a file edited in place with
    its size and modification time kept is not taken for the ingested one."""
    h = hashlib.blake2b(digest_size=20)
    root = loc.fs_path.rstrip("/")
    for f in files:
        h.update(str(f)[len(root) :].encode() + b"\0")
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
        arrays[name] = checked_array(g[name])
    try:
        got = (
            _hex(dict(zip(arrays, compute(*_store_digests(arrays).values(), label="verify"))))
            if arrays
            else {}
        )
    except CorruptObjectError as exc:  # a chunk that cannot be decoded: rebuilt
        return str(exc)
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


def ingest(
    cfg: InputConfig,
    chunks: ChunkConfig,
    store: Location,
    *,
    force: bool = False,
    min_classes: int = 2,
) -> IngestResult:
    """Validate the input and write it to ``store`` (a zarr group) in row chunks.

    ``min_classes``: classes the label column must hold (2 for a run that evaluates; 1
    for an update, which does not).

    Idempotent: if ``store`` holds a complete ingest of the same source (same
    files, sizes, modification times) and config, it is reused as is.
    """
    t0 = time.perf_counter()
    check_exists(cfg)
    signature = _source_signature(cfg, chunks)
    if not force and store.exists():
        try:
            g = store.open_group("r")
            attrs = dict(g.attrs)
            if attrs.get("status") == "complete" and attrs.get("source") == signature:
                problem = _store_problem(store, attrs)
                if problem is None:
                    # the store where it is now (a copied run folder reuses its own copy)
                    res = replace(
                        IngestResult.from_dict(attrs["result"]), store=store, reused=True
                    )
                    logger.info(
                        "ingest: reusing %s (unchanged source, fingerprint %s)",
                        store,
                        res.fingerprint,
                    )
                    return res
                logger.warning(
                    "ingest: not reusing %s: %s; rebuilding it from the input", store, problem
                )
        except Exception as exc:  # unreadable or partial store: rebuild it
            logger.info("ingest: not reusing %s (%s: %s)", store, type(exc).__name__, exc)
    src = read_input(cfg, chunks, min_classes=min_classes)
    X = src.X
    n, d = (int(s) for s in X.shape)
    if n == 0 or d == 0:
        raise InputError(f"{cfg.path} is empty: {n} rows x {d} feature columns.")
    logger.info(
        "ingest: %s -> %s: %d rows x %d features in chunks of %d rows",
        cfg.path,
        store,
        n,
        d,
        X.chunks[0][0],
    )

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
                raise InputError(
                    f"label column {cfg.label_column!r} is missing in {nl} rows "
                    f"(first: row {first}); fill them or set input.nonfinite: drop."
                )
            bad |= masks[1]
        if bad.any() and cfg.nonfinite == "error":
            first = int(np.flatnonzero(bad)[0])
            (row,) = dask.compute(X[first])
            cols = np.flatnonzero(~np.isfinite(row))
            where = f", column {_columns(cols, src.columns)}" if cols.size else ""
            raise InputError(
                f"{cfg.path} contains NaN or infinity in "
                f"{_count(int(bad.sum()), 'row')} "
                f"(first: row {first}{where}); clean the data or set input.nonfinite: drop."
            )
        dropped = int(bad.sum())
        if dropped:
            keep = ~bad
            logger.warning(
                "ingest: dropping %d of %d rows with NaN/inf or missing labels", dropped, n
            )
            X = X[keep]
            src.labels = src.labels[keep] if src.labels is not None else None
            src.ids = src.ids[keep] if src.ids is not None else None
            rows = X.chunks[0][0] if X.chunks[0] else 1
            X = X.rechunk({0: max(rows, rows_per_chunk(d, chunks.target_chunk_mb))})
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
        z = g.create_array(
            name,
            shape=arr.shape,
            dtype=dtype,
            chunks=(arr.chunks[0][0],) + tuple(arr.shape[1:]),
            config={"write_empty_chunks": True},
        )
        targets.append(z)
        sources.append(arr)
    stored = da.store(sources, targets, lock=False, compute=False)
    digests = {k: _digest_blocks(a) for k, a in arrays.items()}
    counts = X.map_blocks(  # NaN/inf per column of each row block
        lambda x: np.count_nonzero(~np.isfinite(x), axis=0).astype(np.int64)[None, :],
        chunks=((1,) * len(X.chunks[0]), X.chunks[1]),
        dtype=np.int64,
    )
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
        per_block = nonfinite.sum(axis=1)
        b = int(np.flatnonzero(per_block)[0])
        cols = np.flatnonzero(nonfinite[b])
        raise InputError(
            f"{cfg.path} contains NaN or infinity ({_count(int(nonfinite.sum()), 'value')}; "
            "the first in "
            f"rows {offs[b]}-{offs[b + 1] - 1}) in column {_columns(cols, src.columns)}; "
            "clean the data or set input.nonfinite: drop."
        )
    fingerprint = _fingerprint_from_digests(
        arrays, digest_values, {"columns": src.columns, "classes": src.classes}
    )
    if src.classes is not None:
        g["labels"].attrs["classes"] = src.classes
    res = IngestResult(
        store=store,
        n_rows=n,
        n_features=d,
        columns=src.columns,
        rows_per_chunk=int(X.chunks[0][0]),
        fingerprint=fingerprint,
        dropped_rows=dropped,
        label_column=cfg.label_column,
        id_column=cfg.id_column,
        classes=src.classes,
        features=record_features(
            src.selection,
            src.columns,
            id_column=cfg.id_column,
            label_column=cfg.label_column,
            source_format=detect_format(cfg),
        ),
        source={"path": cfg.path},
        seconds=time.perf_counter() - t0,
    )
    # the result as stored: its location is wherever the store is when it is reused
    g.attrs.update(
        {
            "status": "complete",
            "kind": "kpca-dask-ingest",
            "source": signature,
            "result": {**res.to_dict(), "path": "", "storage_options": {}},
            "columns": src.columns,
            "digests": _hex({k: digest_values[k] for k in arrays}),
        }
    )
    logger.info(
        "ingest: wrote %d rows x %d features in %.1f s (fingerprint %s)",
        n,
        d,
        res.seconds,
        fingerprint,
    )
    return res


def _columns(cols: np.ndarray, names: list[str]) -> str:
    """ "'b'" or "'b' (and 2 other columns)": the first column by name."""
    first = int(cols[0])
    name = repr(str(names[first])) if first < len(names) else str(first)
    more = f" (and {_count(cols.size - 1, 'other column')})" if cols.size > 1 else ""
    return name + more


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _damaged_message(path: str, exc: BaseException) -> str:
    if (
        "Expected" in str(exc)
        or "could not convert" in str(exc)
        or "Unable to parse" in str(exc)
    ):
        return explain_table_error(path, exc)  # type: ignore[arg-type]
    msg = " ".join(str(exc).split())[:300]
    return (
        f"reading {path} failed part way ({type(exc).__name__}: {msg}): the input is "
        "damaged (a corrupt chunk or a truncated file?); restore it from a good copy."
    )


def _fingerprint_from_digests(arrays, digest_values, extra) -> str:
    h = hashlib.blake2b(digest_size=20)
    for k in sorted(arrays):
        a = arrays[k]
        h.update(f"{k}:{a.shape}:{a.dtype.str}".encode())
        h.update(np.ascontiguousarray(digest_values[k]).tobytes())
    h.update(json.dumps(extra, sort_keys=True).encode())
    return "blake2b:" + h.hexdigest()


def load_ingested(res: IngestResult) -> SourceData:
    """Lazy arrays from a completed ingest store (opened with its storage options)."""
    loc = res.store
    g = loc.open_group("r")
    for name in g.array_keys():
        missing = missing_zarr_chunks(g[name])
        if missing:
            raise InputError(
                f"the ingest store {res.path} is damaged: array {name!r}: "
                f"{describe_missing_chunks(g[name], missing)}; re-run: the ingest stage "
                "rebuilds it from the input."
            )
    # every chunk read verified: undecodable -> one line naming it; X's values against
    # the digests recorded when the store was written (pipeline/verify.py)
    fix = f"the ingest store {res.path} is damaged; re-run: the ingest stage rebuilds it"
    hexd = (g.attrs.get("digests") or {}).get("X")
    digests = np.frombuffer(bytes.fromhex(hexd), dtype=np.uint8) if hexd else None
    X = checked_array(g["X"], digests=digests, fix=fix)
    labels = checked_array(g["labels"], fix=fix) if "labels" in g else None
    ids = checked_array(g["ids"], fix=fix) if "ids" in g else None
    return SourceData(X=X, columns=res.columns, labels=labels, classes=res.classes, ids=ids)
