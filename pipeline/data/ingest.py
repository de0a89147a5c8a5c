"""Ingest: read NPY, CSV, Parquet or zarr into a zarr v3 store of row chunks.

``read_input`` (pipeline/data/readers/) turns a source (local path or fsspec URL)
into lazy dask arrays: the float64 feature matrix, optional class labels (int
codes plus the class names) and optional row ids. ``ingest`` validates them
(shape, numeric columns, NaN/inf policy), writes them to ``<work>/ingest.zarr`` in
row chunks of about ``target_chunk_mb`` and records a content fingerprint -- all in
one pass over the input. Re-running with an unchanged source and config is a no-op (the
store's attributes record both).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import dask
import dask.array as da
import numpy as np

from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks
from pipeline.config import ChunkConfig, InputConfig
from pipeline.output import Location, checked_array, digest_blocks
from pipeline.runtime import compute

from .features import record as record_features
from .ingest_store import (
    fingerprint_from_digests,
    hex_digests,
    keep_held_rows,
    source_signature,
    stale_ingest,
    store_problem,
)
from .readers import (
    InputError,
    SourceData,
    check_exists,
    detect_format,
    explain_table_error,
    read_input,
    rows_per_chunk,
)

# InputError, SourceData, read_input and detect_format live in pipeline/data/readers/, and
# stale_ingest in pipeline/data/ingest_store.py; they are re-exported here for the callers that
# import them from the stage
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
    #: (pipeline/data/features.py: record); None in results written before it existed
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
    signature = source_signature(cfg, chunks)
    if not force and store.exists():
        reused = _reuse(store, signature)
        if reused is not None:
            return reused
    src = read_input(cfg, chunks, min_classes=min_classes)
    n, d = (int(s) for s in src.X.shape)
    if n == 0 or d == 0:
        raise InputError(f"{cfg.path} is empty: {n} rows x {d} feature columns.")
    logger.info(
        "ingest: %s -> %s: %d rows x %d features in chunks of %d rows",
        cfg.path,
        store,
        n,
        d,
        src.X.chunks[0][0],
    )
    dropped = _drop_bad_rows(cfg, chunks, src)
    X = src.X
    arrays = {"X": X}
    if src.labels is not None:
        arrays["labels"] = src.labels.rechunk({0: X.chunks[0]})
    if src.ids is not None:
        arrays["ids"] = src.ids.rechunk({0: X.chunks[0]})
    keep_held_rows(store)  # rows another output's lineage holds outlive the rebuild
    g, digest_values = _write_store(cfg, store, arrays, src.columns)
    fingerprint = fingerprint_from_digests(
        arrays, digest_values, {"columns": src.columns, "classes": src.classes}
    )
    if src.classes is not None:
        g["labels"].attrs["classes"] = src.classes
    res = _result(cfg, store, src, fingerprint, dropped, time.perf_counter() - t0)
    # the result as stored: its location is wherever the store is when it is reused
    g.attrs.update(
        {
            "status": "complete",
            "kind": "kpca-dask-ingest",
            "source": signature,
            "result": {**res.to_dict(), "path": "", "storage_options": {}},
            "columns": src.columns,
            "digests": hex_digests({k: digest_values[k] for k in arrays}),
        }
    )
    logger.info(
        "ingest: wrote %d rows x %d features in %.1f s (fingerprint %s)",
        res.n_rows,
        d,
        res.seconds,
        fingerprint,
    )
    return res


def _reuse(store: Location, signature: dict) -> IngestResult | None:
    """The result of the complete, intact ingest of the same source in ``store``; None
    (logged why) when it must be rebuilt."""
    try:
        g = store.open_group("r")
        attrs = dict(g.attrs)
        if attrs.get("status") == "complete" and attrs.get("source") == signature:
            problem = store_problem(store, attrs)
            if problem is None:
                # the store where it is now (a copied run folder reuses its own copy)
                reused = replace(
                    IngestResult.from_dict(attrs["result"]), store=store, reused=True
                )
                logger.info(
                    "ingest: reusing %s (unchanged source, fingerprint %s)",
                    store,
                    reused.fingerprint,
                )
                return reused
            logger.warning(
                "ingest: not reusing %s: %s; rebuilding it from the input", store, problem
            )
    except Exception as exc:  # unreadable or partial store: rebuild it
        logger.info("ingest: not reusing %s (%s: %s)", store, type(exc).__name__, exc)
    return None


def _drop_bad_rows(cfg: InputConfig, chunks: ChunkConfig, src: SourceData) -> int:
    """Apply input.nonfinite to rows with NaN/inf and rows without a label: refuse them
    (``error``: one pass over the labels; NaN/inf values are counted in the write pass)
    or drop them from ``src`` (``drop``: one pass). Returns the rows dropped."""
    X = src.X
    label_bad = (src.labels < 0) if src.labels is not None else None
    if cfg.nonfinite != "drop" and label_bad is None:
        return 0
    bad_rows = X.map_blocks(_nonfinite_rows, drop_axis=1, dtype=bool)
    masks = dask.compute(*([bad_rows] + ([label_bad] if label_bad is not None else [])))
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
        raise InputError(_nonfinite_rows_message(cfg, src, bad))
    dropped = int(bad.sum())
    if dropped:
        n, d = (int(s) for s in X.shape)
        keep = ~bad
        logger.warning(
            "ingest: dropping %d of %d rows with NaN/inf or missing labels", dropped, n
        )
        X = X[keep]
        src.labels = src.labels[keep] if src.labels is not None else None
        src.ids = src.ids[keep] if src.ids is not None else None
        rows = X.chunks[0][0] if X.chunks[0] else 1
        src.X = X.rechunk({0: max(rows, rows_per_chunk(d, chunks.target_chunk_mb))})
        if int(src.X.shape[0]) == 0:
            raise InputError(f"every row of {cfg.path} has NaN/inf: nothing left to fit.")
    return dropped


def _nonfinite_rows_message(cfg: InputConfig, src: SourceData, bad: np.ndarray) -> str:
    """The refusal of rows with NaN/inf (or no label): how many, the first row and its
    columns."""
    first = int(np.flatnonzero(bad)[0])
    (row,) = dask.compute(src.X[first])
    cols = np.flatnonzero(~np.isfinite(row))
    where = f", column {_columns(cols, src.columns)}" if cols.size else ""
    return (
        f"{cfg.path} contains NaN or infinity in "
        f"{_count(int(bad.sum()), 'row')} "
        f"(first: row {first}{where}); clean the data or set input.nonfinite: drop."
    )


def _write_store(
    cfg: InputConfig, store: Location, arrays: dict[str, da.Array], columns: list[str]
):
    """One pass over the input: write every array to a new ``store``, digest its chunks
    and count NaN/inf per column. Returns the open group and the digests; refuses (and
    removes the store) when the input is damaged or holds NaN/inf."""
    X = arrays["X"]
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
    digests = {k: digest_blocks(a) for k, a in arrays.items()}
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
        raise InputError(_nonfinite_values_message(cfg, X, nonfinite, columns))
    return g, digest_values


def _nonfinite_values_message(
    cfg: InputConfig, X: da.Array, nonfinite: np.ndarray, columns: list[str]
) -> str:
    """The refusal of NaN/inf found while writing: how many, the first row block and
    column."""
    offs = np.concatenate([[0], np.cumsum(X.chunks[0])])
    per_block = nonfinite.sum(axis=1)
    b = int(np.flatnonzero(per_block)[0])
    cols = np.flatnonzero(nonfinite[b])
    return (
        f"{cfg.path} contains NaN or infinity ({_count(int(nonfinite.sum()), 'value')}; "
        "the first in "
        f"rows {offs[b]}-{offs[b + 1] - 1}) in column {_columns(cols, columns)}; "
        "clean the data or set input.nonfinite: drop."
    )


def _result(
    cfg: InputConfig,
    store: Location,
    src: SourceData,
    fingerprint: str,
    dropped: int,
    seconds: float,
) -> IngestResult:
    X = src.X
    return IngestResult(
        store=store,
        n_rows=int(X.shape[0]),
        n_features=int(X.shape[1]),
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
        seconds=seconds,
    )


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
    # the digests recorded when the store was written (pipeline/output/verify.py)
    fix = f"the ingest store {res.path} is damaged; re-run: the ingest stage rebuilds it"
    hexd = (g.attrs.get("digests") or {}).get("X")
    digests = np.frombuffer(bytes.fromhex(hexd), dtype=np.uint8) if hexd else None
    X = checked_array(g["X"], digests=digests, fix=fix)
    labels = checked_array(g["labels"], fix=fix) if "labels" in g else None
    ids = checked_array(g["ids"], fix=fix) if "ids" in g else None
    return SourceData(X=X, columns=res.columns, labels=labels, classes=res.classes, ids=ids)
