"""What ``NEW_DATA`` names, oldest first, and each batch's identity.

``NEW_DATA`` is one of

* a file or object (``/data/batch.parquet``, ``s3://b/batches/2026-11-25.parquet``);
* a folder or prefix (``s3://b/batches/``): every file in it (not recursive; names
  starting with ``.`` or ``_`` are skipped, as Spark and Hive writers' markers are);
* a glob (``s3://b/batches/*.parquet``, ``/data/2026-11-*/part-*.csv``);
* a template on the run's logical date (``s3://b/batches/{date:%Y-%m-%d}/*.parquet``):
  ``{date}`` is formatted with Python's ``format`` (``{date:%Y%m%d}``, ``{date:%Y/%m/%d}``)
  and the result is read as one of the above.

Batches are ordered by name (their full path), which is their date when the names carry
one. A batch's identity is what the series records and compares: the SHA-256 of its bytes
(every file of a multi-file batch is one batch per file here), its size and, where the
store reports them, its ETag and object version.
"""

from __future__ import annotations

import datetime
import glob as _glob
import hashlib
from dataclasses import dataclass
from typing import Any

from pipeline.output import Location

from ..errors import UserError

__all__ = ["Batch", "batch_identity", "pending_batches", "resolve_batches"]

_GLOB = "*?["


class BatchSpecError(UserError, ValueError):
    """NEW_DATA names nothing that can be read as batches; the message says why."""


@dataclass(frozen=True)
class Batch:
    """One batch: its path or URL and its identity (:func:`batch_identity`)."""

    path: str
    identity: dict[str, Any]

    @property
    def digest(self) -> str:
        return str(self.identity["sha256"])


def _format(spec: str, logical_date: datetime.datetime | None) -> str:
    if "{" not in spec:
        return spec
    if logical_date is None:
        logical_date = datetime.datetime.now(datetime.UTC)
    try:
        return spec.format(date=logical_date)
    except (KeyError, IndexError, ValueError) as exc:
        raise BatchSpecError(
            f"NEW_DATA {spec!r} is a template that cannot be formatted ({exc}); the one "
            "field is {date}, e.g. s3://b/batches/{date:%Y-%m-%d}/*.parquet."
        ) from None


def _skipped(name: str) -> bool:
    return name.startswith((".", "_"))


def resolve_batches(
    spec: str,
    storage_options: dict[str, Any] | None = None,
    *,
    logical_date: datetime.datetime | None = None,
) -> list[str]:
    """The batches ``spec`` names (formatted on ``logical_date``), sorted by name. A
    template or glob that matches nothing, or an empty folder, is an empty list (a night
    with no batch); a single path that does not exist is refused in one line."""
    from ..config import absolute_path

    path = absolute_path(_format(spec, logical_date))
    loc = Location.at(path, storage_options)
    fs, fpath = loc.fs, loc.fs_path
    if not loc.is_local:
        loc.refresh()
    if any(c in fpath for c in _GLOB):
        found = [p for p in fs.glob(fpath) if fs.isfile(p)] if loc.is_local else fs.glob(fpath)
        found = [p for p in found if not _skipped(str(p).rstrip("/").rpartition("/")[2])]
        files = sorted(str(p) for p in found if not fs.isdir(p))
    elif fs.isdir(fpath):
        files = sorted(
            str(p)
            for p in fs.ls(fpath, detail=False)
            if not _skipped(str(p).rstrip("/").rpartition("/")[2]) and not fs.isdir(p)
        )
    elif fs.exists(fpath):
        return [path]
    elif "{" in spec:
        return []  # a template whose date has not landed: a night with no batch
    else:
        raise BatchSpecError(
            f"NEW_DATA {path} does not exist (a file, a folder or prefix, a glob, or a "
            "template such as s3://b/batches/{date:%Y-%m-%d}/*.parquet)."
        )
    return [_url(loc, p) for p in files]


def _url(loc: Location, fs_path: str) -> str:
    """The path or URL of ``fs_path`` on ``loc``'s file system, in ``loc``'s form."""
    if loc.is_local:
        return _glob.os.path.abspath(fs_path) if fs_path.startswith("/") else fs_path
    proto = loc.url.split("://", 1)[0]
    return f"{proto}://{fs_path.lstrip('/')}"


def batch_identity(path: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"path", "sha256", "size", "etag", "version_id"}`` of the batch at ``path``: the
    SHA-256 of its bytes (a folder batch, e.g. a zarr store: of its files' names and
    bytes, in order), and the store's ETag and object version where it has them."""
    loc = Location.at(path, storage_options)
    fs, fpath = loc.fs, loc.fs_path
    if not loc.is_local:
        loc.refresh()
    h = hashlib.sha256()
    size = 0
    etag = version = None
    if fs.isdir(fpath):
        files = sorted(str(p) for p in fs.find(fpath))
        for f in files:
            h.update(f[len(fpath) :].encode() + b"\0")
            size += _hash_file(fs, f, h)
    else:
        info = fs.info(fpath)
        etag = info.get("ETag") or info.get("etag")
        version = info.get("VersionId") or info.get("version_id") or info.get("generation")
        size = _hash_file(fs, fpath, h)
    return {
        "path": path,
        "sha256": "sha256:" + h.hexdigest(),
        "size": int(size),
        "etag": str(etag).strip('"') if etag else None,
        "version_id": str(version) if version not in (None, "", "null") else None,
    }


def _hash_file(fs, path: str, h) -> int:
    n = 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            n += len(chunk)
    return n


def pending_batches(
    spec: str,
    merged: dict[str, str],
    storage_options: dict[str, Any] | None = None,
    *,
    logical_date: datetime.datetime | None = None,
) -> tuple[list[Batch], list[tuple[Batch, str]]]:
    """``(pending, done)``: the batches ``spec`` names, oldest first, split by whether the
    series merged them already (``merged``: digest -> the version that merged it,
    :func:`pipeline.series.merged.merged_sources`); a batch whose bytes appear twice under
    two names is pending once."""
    pending: list[Batch] = []
    done: list[tuple[Batch, str]] = []
    seen: set[str] = set()
    for p in resolve_batches(spec, storage_options, logical_date=logical_date):
        b = Batch(p, batch_identity(p, storage_options))
        if b.digest in merged:
            done.append((b, merged[b.digest]))
        elif b.digest not in seen:
            seen.add(b.digest)
            pending.append(b)
    return pending, done
