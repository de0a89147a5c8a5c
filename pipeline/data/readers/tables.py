"""CSV and Parquet input as a lazy dask DataFrame: the feature columns (chosen by
pipeline/data/features.py), labels encoded as int codes, ids read exactly; pandas' and
pyarrow's errors explained in one line."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd

from pipeline.config import ChunkConfig, InputConfig
from pipeline.output import Location

from ..features import FeatureError
from ..features import select as select_features
from ..formats import column_hint
from .base import InputError, SourceData, check_exists, detect_format, rows_per_chunk

__all__ = ["explain_table_error", "open_table", "read_table", "table_columns"]


def csv_id_dtype(cfg: InputConfig) -> str:
    """The dtype a CSV file's id column is read with: ``int64`` when every id is written
    as a canonical integer, else ``str`` (pipeline/data/scan.py's rule; one streaming pass over
    that column). Never float: a float64 holds integers exactly only up to 2**53."""
    from ..scan import csv_id_type

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


def open_table(cfg: InputConfig, fmt: str, *, read_ids: bool = False):
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
                dtype[cfg.id_column] = csv_id_dtype(cfg)
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
    df = open_table(cfg, fmt)
    return [str(c) for c in df.columns], {str(c): str(t) for c, t in df.dtypes.items()}


def read_table(
    cfg: InputConfig, fmt: str, chunks: ChunkConfig, *, min_classes: int = 2
) -> SourceData:
    df = open_table(cfg.model_copy(update={"id_column": None}), fmt)
    available = [str(c) for c in df.columns]
    for what, col in (("label_column", cfg.label_column), ("id_column", cfg.id_column)):
        if col is not None and col not in available:
            raise InputError(
                f"input.{what} {col!r} is not a column of {cfg.path}; "
                + column_hint(col, available)
            )
    if fmt == "csv" and cfg.id_column is not None:
        df = open_table(cfg, fmt, read_ids=True)
    available = list(df.columns)
    # the policy for bool, text, categorical and datetime columns: pipeline/data/features.py
    try:
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
