"""The input format a path names (its suffix, or what a folder holds): one rule for the
readers and for the pre-start checks. Light: no dask, numpy or zarr imports."""

from __future__ import annotations

from typing import Any

__all__ = ["SUFFIXES", "column_hint", "infer_format"]

#: name endings and the format each one means
SUFFIXES = (
    (".npy", "npy"),
    (".csv", "csv"),
    (".csv.gz", "csv"),
    (".tsv", "csv"),
    (".parquet", "parquet"),
    (".pq", "parquet"),
    (".zarr", "zarr"),
)


def infer_format(path: str, fs: Any = None, fs_path: str | None = None) -> str | None:
    """The format of ``path`` from its name, else from the folder's entries (a Parquet
    dataset, a zarr store) when ``fs`` can list it; None when neither tells."""
    p = path.rstrip("/").lower()
    for suffix, fmt in SUFFIXES:
        if p.endswith(suffix):
            return fmt
    if fs is None or not fs.exists(fs_path) or not fs.isdir(fs_path):
        return None
    names = [str(f) for f in fs.ls(fs_path, detail=False)]
    if any(n.endswith((".parquet", ".pq")) for n in names):
        return "parquet"
    if any(n.endswith("zarr.json") for n in names):
        return "zarr"
    return None


def column_hint(name: str, available: list[str]) -> str:
    """What to say after "``name`` is not a column": the closest names first (difflib),
    then every column of the table -- all of them, so the right one is never cut off."""
    import difflib

    cols = [str(c) for c in available]
    close = difflib.get_close_matches(str(name), cols, n=3, cutoff=0.5)
    lowered = [c for c in cols if c.lower() == str(name).lower() and c not in close]
    close = lowered + close
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}available ({len(cols)} columns): {cols}"
