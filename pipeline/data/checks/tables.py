"""The pre-start checks of a CSV or Parquet input: its header, the columns the config
names, the feature columns' types and a sample of rows (pipeline/data/validate.py)."""

from __future__ import annotations

from ..formats import column_hint
from .findings import SAMPLE_ROWS, Finding, Stop, Validation, is_numeric, short
from .rows import check_sample_finite, scan_rows

__all__ = ["check_table", "first_text_value", "open_table_sample", "text_value_message"]


def first_text_value(col) -> tuple[int, str] | None:
    """``(row, value)`` of the first value of a mostly numeric pandas column that is not a
    number (``"n/a"`` in a column of numbers stored as text), or None: no such value, or
    no value of the column is a number (a text column, not a numeric one with a stray
    value). ``row`` counts data rows from 0, as the other checks' messages do."""
    import numpy as np
    import pandas as pd

    values = pd.Series(np.asarray(col, dtype=object))
    present = values.notna() & (values.astype(str).str.strip() != "")
    numbers = pd.to_numeric(values.where(present), errors="coerce")
    text = present & numbers.isna()
    if not text.any() or not numbers.notna().any():
        return None
    pos = int(np.flatnonzero(text.to_numpy())[0])
    return pos, str(values.iloc[pos])


def _all_numbers(df, c: str) -> bool:
    import pandas as pd

    col = df[c].dropna() if c in df else None
    return col is not None and bool(pd.to_numeric(col, errors="coerce").notna().all())


def _first_text_in_file(fs, fs_path: str, fmt: str, c: str) -> tuple[int, str] | None:
    """``(row, value)`` of the first text value of column ``c`` past a clean sample: that
    one column read in blocks (a single file; a Parquet folder is left to the reader)."""
    import pandas as pd

    try:
        if fmt == "csv":
            compression = "gzip" if fs_path.lower().endswith(".gz") else None
            with fs.open(fs_path, "rb") as f:
                start = 0
                for part in pd.read_csv(
                    f,
                    usecols=[c],
                    dtype=str,
                    chunksize=100_000,
                    compression=compression,
                    keep_default_na=True,
                ):
                    hit = first_text_value(part[c])
                    if hit is not None:
                        return start + hit[0], hit[1]
                    start += len(part)
            return None
        if fs.isdir(fs_path):
            return None
        import pyarrow.parquet as pq

        with fs.open(fs_path, "rb") as f:
            start = 0
            for batch in pq.ParquetFile(f).iter_batches(batch_size=100_000, columns=[c]):
                hit = first_text_value(batch.column(0).to_pandas())
                if hit is not None:
                    return start + hit[0], hit[1]
                start += batch.num_rows
    except Exception:  # noqa: BLE001 - only a better message; the reader reports the rest
        return None
    return None


def text_value_message(path: str, column: str, row: int, value: str) -> str:
    """The one line for a text value in a numeric column."""
    shown = value if len(value) <= 40 else value[:37] + "..."
    return (
        f"{path}: column {column!r} holds text where numbers are expected: {shown!r} in "
        f"row {row} (the first); fix or remove that row of the file."
    )


def open_table_sample(cfg, fs, fs_path: str, fmt: str):
    """(all column names, a pandas sample of the first rows, {column: dtype} of the file)."""
    import pandas as pd

    if fmt == "csv":
        compression = "gzip" if fs_path.lower().endswith(".gz") else None
        with fs.open(fs_path, "rb") as f:
            try:
                df = pd.read_csv(f, nrows=SAMPLE_ROWS, compression=compression)
            except pd.errors.EmptyDataError:
                raise Stop(
                    f"{cfg.input.path} is empty (no header, no rows); point input.path at "
                    "a file with data."
                ) from None
            except Exception as exc:  # noqa: BLE001 - pandas raises many kinds
                msg = short(exc)
                if "Expected" in msg and "fields" in msg:
                    raise Stop(
                        f"{cfg.input.path} is ragged: {msg}. Every row needs the same number "
                        "of fields; fix the file (quoting? stray delimiters?)."
                    ) from None
                raise Stop(
                    f"cannot read {cfg.input.path} as csv ({type(exc).__name__}: "
                    f"{short(exc)}); check that the file is intact and input.format is right."
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
            raise Stop(
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
            raise Stop(
                f"cannot read {cfg.input.path} as parquet ({type(exc).__name__}: "
                f"{short(exc)}); check that the file is intact and input.format is right."
            ) from None
    names = [n for n in schema.names if n != "__index_level_0__"]
    df = batch.to_pandas() if batch is not None else schema.empty_table().to_pandas()
    dtypes = {n: schema.field(n).type.to_pandas_dtype() for n in names}
    return names, df, dtypes


def check_table(cfg, v: Validation, fs, fs_path: str, fmt: str) -> None:
    """The checks of a CSV or Parquet input, on its header and first rows, then (``v.full``)
    every row; each problem appended to ``v.findings``."""
    inp = cfg.input
    available, df, dtypes = open_table_sample(cfg, fs, fs_path, fmt)
    if not available:
        v.findings.append(
            Finding(
                "columns",
                f"{inp.path} has no columns (empty file?); point input.path at a file "
                "with data.",
            )
        )
        return
    _check_named_columns(inp, v, available)
    features = _feature_columns(
        inp, v, available, dtypes, empty=len(df) == 0, df=df, where=(fs, fs_path, fmt)
    )
    if features is None:
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
    sample = _numeric_sample(inp, v, df, features)
    if sample is None:
        return
    check_sample_finite(cfg, v, sample, features)
    if not v.errors and v.full:
        scan_rows(cfg, v, fs, fs_path, fmt, features, dtypes)


def _check_named_columns(inp, v: Validation, available: list[str]) -> None:
    """input.label_column, input.id_column and input.exclude_columns name columns of the
    file."""
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
    # input.exclude_columns are not features (pipeline/data/features.py: the same rule at
    # ingest)
    unknown = [c for c in inp.exclude_columns or [] if c not in available]
    if unknown:
        v.findings.append(
            Finding(
                "columns",
                f"input.exclude_columns {unknown} are not columns of {inp.path}; "
                f"available: {available}.",
            )
        )


def _feature_columns(
    inp, v: Validation, available: list[str], dtypes: dict, *, empty: bool, df=None, where=()
) -> list[str] | None:
    """The feature columns: input.columns (those present and numeric), else every numeric
    column not reserved for labels, ids or exclusion; None when a table has none (the
    finding says why)."""
    if inp.columns:
        return _listed_features(
            inp, v, available, dtypes, *(() if df is None else (df, *where))
        )
    reserved = {inp.label_column, inp.id_column, *(inp.exclude_columns or [])} - {None}
    features = [c for c in available if c not in reserved and is_numeric(dtypes[c])]
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
                if empty
                else (
                    f"{inp.path} has no numeric feature columns (columns: {available}); "
                    "set input.columns."
                ),
            )
        )
        return None
    return features


def _listed_features(
    inp, v: Validation, available: list[str], dtypes: dict, *_sample
) -> list[str]:
    """input.columns that are columns of the file and numeric; a finding for the others."""
    missing = [c for c in inp.columns if c not in available]
    if missing:
        v.findings.append(
            Finding(
                "columns",
                f"input.columns {missing} are not in {inp.path}; available: {available}",
            )
        )
    features = [c for c in inp.columns if c in available]
    bad = [c for c in features if not is_numeric(dtypes[c])]
    for c in list(bad):
        # a numeric column with a stray text value ("n/a"): name the value, not the list
        # (issue 37: an update's batch was told to drop a feature its model needs)
        hit = first_text_value(_sample[0][c]) if _sample and c in _sample[0] else None
        if hit is None and _sample and len(_sample) > 1 and _all_numbers(_sample[0], c):
            hit = _first_text_in_file(*_sample[1:], c)  # the sample is clean: read on
        if hit is not None:
            bad.remove(c)
            v.findings.append(Finding("types", text_value_message(inp.path, c, *hit)))
    if bad:
        v.findings.append(
            Finding(
                "types",
                f"input.columns {bad} are not numeric ({[str(dtypes[c]) for c in bad]}); "
                "drop them from input.columns or encode them as numbers.",
            )
        )
    return [c for c in features if c not in bad]


def _numeric_sample(inp, v: Validation, df, features: list[str]):
    """The sample's feature columns as float64 (NaN for missing values); None, with a
    finding, when one holds text."""
    import numpy as np

    try:
        return df[features].to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError) as exc:
        v.findings.append(
            Finding(
                "types",
                f"{inp.path}: a feature column holds text where numbers are expected "
                f"({short(exc)}); set input.columns to numeric columns only.",
            )
        )
        return None
