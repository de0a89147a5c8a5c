"""The full pass over the input before anything starts: every row read, once, streaming.

:func:`scan` reads a CSV file, a Parquet file or dataset, or an NPY file from start to end
in batches (pyarrow's streaming CSV and Parquet readers; NPY in row blocks) and checks, on
every row:

* the row count;
* that every feature value is a number (CSV: text in a feature column is found here, not
  at ingest), and finite, unless ``input.nonfinite: drop``;
* that the label column has a value in every row (unless ``input.nonfinite: drop``);
* that the id column has a value in every row and no id repeats; and which type the ids
  have: ``int64`` when every id of a CSV file is written as a canonical integer
  (``-12``, ``9007199254740993``; no sign ``+``, no leading zero, no ``1.0``), else
  ``string`` (Parquet: the column's own type).

Each problem is reported with the exact row (0-based, as ``kpca info`` and the ingest
stage count rows; CSV: the file's line too) and column of its first occurrence.

Light on purpose (numpy, pandas and pyarrow; no dask, zarr or Prefect): ``kpca validate``
and the start of ``kpca run``/``update``/``transform`` call it before any cluster or
Prefect server starts. Its cost is measured in docs/config.md ("Validation").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ScanProblem", "ScanResult", "csv_id_type", "scan"]

#: rows per batch of the Parquet and NPY passes
BATCH_ROWS = 65_536
#: bytes per block of the CSV pass
CSV_BLOCK = 16 << 20

#: the values pandas reads as missing (pandas.read_csv's default na_values): the same
#: cells are missing in this pass as at ingest
NA_VALUES = [
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
]


@dataclass(frozen=True)
class ScanProblem:
    """The first occurrence of one kind of problem (``check``: nonfinite, types, label,
    id, duplicate_id) and a one-line message naming the row, the column and the fix."""

    check: str
    message: str
    row: int
    column: str


@dataclass
class ScanResult:
    rows: int = 0
    seconds: float = 0.0
    #: "int64", "string" or another numpy dtype name (Parquet); None: no id column
    id_type: str | None = None
    problems: list[ScanProblem] = field(default_factory=list)
    #: rows with NaN/inf (or no label) that ``input.nonfinite: drop`` will drop
    droppable_rows: int = 0


def _line(fmt: str, row: int, how: str = "") -> str:
    # the header is line 1; a quoted field spanning lines would shift this (rare)
    if fmt != "csv":
        return ""
    return f" {how} line {row + 2} of the file" if how else f" (line {row + 2} of the file)"


class _Scanner:
    def __init__(self, path, fmt, features, id_column, label_column, nonfinite):
        self.path, self.fmt = path, fmt
        self.features = list(features)
        self.id_column, self.label_column = id_column, label_column
        self.drop = nonfinite == "drop"
        self.res = ScanResult()
        self.first_bad: tuple[int, str] | None = None
        self.bad_rows = 0
        self.first_label: int | None = None
        self.id_parts: list[Any] = []
        self.first_id_null: int | None = None

    # one batch: numpy arrays of the features, the label's validity, the id column
    def add(self, X_cols: list[np.ndarray], label_valid, ids) -> None:
        n = len(X_cols[0]) if X_cols else (len(ids) if ids is not None else 0)
        start = self.res.rows
        bad = np.zeros(n, dtype=bool)
        for name, col in zip(self.features, X_cols):
            b = ~np.isfinite(col)
            if b.any():
                bad |= b
                r = start + int(np.flatnonzero(b)[0])
                if self.first_bad is None or r < self.first_bad[0]:
                    self.first_bad = (r, name)
        if label_valid is not None:
            lb = ~label_valid
            if lb.any() and self.first_label is None:
                self.first_label = start + int(np.flatnonzero(lb)[0])
            bad |= lb
        self.bad_rows += int(bad.sum())
        if ids is not None:
            self.id_parts.append(ids)
        self.res.rows += n

    def finish(self, t0: float) -> ScanResult:
        res, path = self.res, self.path
        if self.first_bad is not None and not self.drop:
            r, col = self.first_bad
            res.problems.append(
                ScanProblem(
                    "nonfinite",
                    f"{path} contains NaN or infinity in column {col!r} (first: row {r}, "
                    f"column {col!r}){_line(self.fmt, r, 'on')}; {_rows(self.bad_rows)} "
                    "in all; clean the data or set input.nonfinite: drop.",
                    r,
                    col,
                )
            )
        if self.first_label is not None and not self.drop:
            r = self.first_label
            res.problems.append(
                ScanProblem(
                    "label",
                    f"label column {self.label_column!r} of {path} is missing in row {r}"
                    f"{_line(self.fmt, r)}; fill it or set input.nonfinite: drop.",
                    r,
                    str(self.label_column),
                )
            )
        if self.drop:
            res.droppable_rows = self.bad_rows
        if self.id_column is not None:
            self._check_ids()
        res.seconds = time.perf_counter() - t0
        return res

    def _check_ids(self) -> None:
        import pandas as pd
        import pyarrow as pa

        res, col = self.res, self.id_column
        parts = [p for p in self.id_parts if len(p)]
        if not parts:
            res.id_type = "int64" if self.fmt == "csv" else None
            return
        arr = pa.chunked_array(parts) if isinstance(parts[0], pa.Array) else None
        if arr is not None:
            nulls = arr.is_null()
            if arr.null_count:
                r = int(np.flatnonzero(nulls.to_numpy(zero_copy_only=False))[0])
                res.problems.append(
                    ScanProblem(
                        "id",
                        f"id column {col!r} of {self.path} has no value in row {r}"
                        f"{_line(self.fmt, r)}; every row needs an id (fill it, or drop "
                        "input.id_column).",
                        r,
                        str(col),
                    )
                )
                res.id_type = "string" if pa.types.is_string(arr.type) else str(arr.type)
                return
            if self.fmt == "csv":
                res.id_type = _id_type_of_text(arr)
                values = (
                    _as_int64(arr)
                    if res.id_type == "int64"
                    else arr.to_numpy(zero_copy_only=False)
                )
            else:
                t = arr.type
                text = pa.types.is_string(t) or pa.types.is_large_string(t)
                res.id_type = "string" if text else str(t).replace("double", "float64")
                values = arr.to_numpy(zero_copy_only=False)
        else:
            values = np.concatenate(parts)
        s = pd.Series(values)
        dup = s.duplicated()
        if dup.any():
            r = int(np.flatnonzero(dup.to_numpy())[0])
            first = int(np.flatnonzero((s == s.iloc[r]).to_numpy())[0])
            k = int(dup.sum())
            res.problems.append(
                ScanProblem(
                    "duplicate_id",
                    f"id {_plain(values[r])!r} of column {col!r} repeats in row {r}"
                    f"{_line(self.fmt, r)} (first in row {first}; {k} repeated ids in all) "
                    f"in {self.path}; ids must be unique (they join the embedding back to "
                    "the source): remove the repeats, or drop input.id_column.",
                    r,
                    str(col),
                )
            )


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _rows(k: int) -> str:
    return f"{k} row{'' if k == 1 else 's'}"


def _id_type_of_text(arr) -> str:
    """``int64`` when every id of a CSV column is the canonical text of an int64 (it reads
    back to the same text), else ``string``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        ints = pc.cast(arr, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return "string"
    same = pc.all(pc.equal(pc.cast(ints, pa.string()), arr)).as_py()
    return "int64" if same else "string"


def _as_int64(arr) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.cast(arr, pa.int64()).to_numpy()


def csv_id_type(path: str, fs: Any, fs_path: str, id_column: str) -> tuple[str, int | None]:
    """The type a CSV file's id column is read as (``int64`` or ``string``, the rule of
    :func:`scan`) from a streaming pass over that one column, and the first row without
    an id (None: every row has one)."""
    import pyarrow as pa

    parts = []
    with _open_csv(fs, fs_path, [id_column], {id_column: pa.string()}) as reader:
        for batch in reader:
            parts.append(batch.column(0))
    if not parts or sum(len(p) for p in parts) == 0:
        return "int64", None
    arr = pa.chunked_array(parts)
    if arr.null_count:
        r = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        return "string", r
    return _id_type_of_text(arr), None


class _open_csv:
    """pyarrow's streaming CSV reader over a file of any fsspec filesystem (gzip by name)."""

    def __init__(self, fs, fs_path, include, types):
        self.fs, self.fs_path, self.include, self.types = fs, fs_path, include, types

    def __enter__(self):
        import pyarrow as pa
        import pyarrow.csv as pcsv

        self.f = self.fs.open(self.fs_path, "rb")
        stream = self.f
        if self.fs_path.lower().endswith(".gz"):
            stream = pa.CompressedInputStream(pa.PythonFile(self.f, mode="r"), "gzip")
        return pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(block_size=CSV_BLOCK),
            convert_options=pcsv.ConvertOptions(
                include_columns=list(self.include),
                column_types=dict(self.types),
                null_values=NA_VALUES,
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )

    def __exit__(self, *exc):
        self.f.close()


def _float_column(col) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_boolean(col.type):
        col = pc.cast(col, pa.int8())
    if not pa.types.is_floating(col.type):
        col = pc.cast(col, pa.float64())
    return col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _scan_csv(s: _Scanner, fs, fs_path: str, dtypes: dict[str, Any]) -> None:
    import pyarrow as pa

    from .features import kind_of

    types = {
        c: pa.bool_() if kind_of(dtypes.get(c)) == "bool" else pa.float64() for c in s.features
    }
    include = list(s.features)
    for c in (s.label_column, s.id_column):
        if c is not None and c not in include:
            types[c] = pa.string()
            include.append(c)
    try:
        with _open_csv(fs, fs_path, include, types) as reader:
            for batch in reader:
                s.add(*_parts(s, batch))
    except pa.ArrowInvalid as exc:
        raise _TextInColumn(s, fs, fs_path, str(exc)) from None


def _parts(s: _Scanner, batch):
    names = batch.schema.names
    X = [_float_column(batch.column(names.index(c))) for c in s.features]
    label_valid = None
    if s.label_column is not None:
        lab = batch.column(names.index(s.label_column))
        label_valid = ~lab.is_null().to_numpy(zero_copy_only=False)
    ids = batch.column(names.index(s.id_column)) if s.id_column is not None else None
    return X, label_valid, ids


class _TextInColumn(Exception):
    """A CSV feature column holds text: located exactly by a second pass over it."""

    def __init__(self, s: _Scanner, fs, fs_path: str, arrow_message: str):
        import re

        self.problem = None
        m = re.search(r"invalid value '([^']*)'", arrow_message)
        value = m.group(1) if m else None
        for col in s.features:
            row = _first_text(fs, fs_path, col)
            if row is not None:
                r, v = row
                self.problem = ScanProblem(
                    "types",
                    f"{s.path}: column {col!r} holds text where numbers are expected: "
                    f"{v!r} in row {r}{_line('csv', r)}; fix or remove that row of the "
                    "file.",
                    r,
                    col,
                )
                break
        if self.problem is None:
            self.problem = ScanProblem(
                "types",
                f"{s.path}: a feature column holds text where numbers are expected"
                f"{f' ({value!r})' if value else ''}; clean the file.",
                0,
                "",
            )
        super().__init__(self.problem.message)


def _first_text(fs, fs_path: str, col: str) -> tuple[int, str] | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    start = 0
    with _open_csv(fs, fs_path, [col], {col: pa.string()}) as reader:
        for batch in reader:
            arr = batch.column(0)
            try:
                pc.cast(arr, pa.float64())
            except pa.ArrowInvalid:
                for k, v in enumerate(arr.to_pylist()):
                    if v is None:
                        continue
                    try:
                        float(v)
                    except ValueError:
                        return start + k, v
            start += len(arr)
    return None


def _parquet_files(fs, fs_path: str) -> list[str]:
    if fs.isdir(fs_path):
        return sorted(
            str(p)
            for p in fs.find(fs_path)
            if str(p).endswith((".parquet", ".pq")) and "/." not in str(p)
        )
    return [fs_path]


def _scan_parquet(s: _Scanner, fs, fs_path: str) -> None:
    import pyarrow.parquet as pq

    cols = list(dict.fromkeys([*s.features, *(c for c in (s.label_column, s.id_column) if c)]))
    for path in _parquet_files(fs, fs_path):
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=cols):
                s.add(*_parts(s, batch))


def _scan_npy(s: _Scanner, fs, fs_path: str) -> None:
    from numpy.lib import format as npformat

    with fs.open(fs_path, "rb") as f:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        if len(shape) != 2 or dtype.hasobject:
            return
        n, d = (int(x) for x in shape)
        if fortran:  # column-major: read column by column
            for j in range(d):
                col = np.frombuffer(f.read(n * dtype.itemsize), dtype=dtype)
                if len(col) < n:
                    return
                b = ~np.isfinite(col.astype(np.float64))
                if b.any():
                    r = int(np.flatnonzero(b)[0])
                    if s.first_bad is None or r < s.first_bad[0]:
                        s.first_bad = (r, s.features[j])
            s.res.rows = n
            return
        step = max(1, BATCH_ROWS * 8 // max(1, d))
        done = 0
        while done < n:
            k = min(step, n - done)
            buf = f.read(k * d * dtype.itemsize)
            if len(buf) < k * d * dtype.itemsize:
                return  # truncated: the header check reports it
            X = np.frombuffer(buf, dtype=dtype).reshape(k, d).astype(np.float64, copy=False)
            s.add([X[:, j] for j in range(d)], None, None)
            done += k


def scan(
    path: str,
    fmt: str,
    fs: Any,
    fs_path: str,
    *,
    features: list[str],
    dtypes: dict[str, Any] | None = None,
    id_column: str | None = None,
    label_column: str | None = None,
    nonfinite: str = "error",
) -> ScanResult:
    """Read every row of the input once; a :class:`ScanResult` with the row count, the id
    type and the first occurrence of each kind of problem."""
    t0 = time.perf_counter()
    s = _Scanner(path, fmt, features, id_column, label_column, nonfinite)
    try:
        if fmt == "csv":
            _scan_csv(s, fs, fs_path, dtypes or {})
        elif fmt == "parquet":
            _scan_parquet(s, fs, fs_path)
        elif fmt == "npy":
            _scan_npy(s, fs, fs_path)
    except _TextInColumn as exc:
        res = s.finish(t0)
        res.problems.insert(0, exc.problem)
        return res
    return s.finish(t0)
