"""What ``NEW_DATA`` names, oldest first, and each batch's identity.

``NEW_DATA`` is one of

* a file or object (``/data/batch.parquet``, ``s3://b/batches/2026-11-25.parquet``);
* a folder or prefix (``s3://b/batches/``): every file in it (not recursive; names
  starting with ``.`` or ``_`` are skipped, as Spark and Hive writers' markers are);
* a glob (``s3://b/batches/*.parquet``, ``/data/2026-11-*/part-*.csv``);
* a template on the run's logical date (``s3://b/batches/{date:%Y-%m-%d}/*.parquet``):
  ``{date}`` is formatted with Python's ``format`` (``{date:%Y%m%d}``, ``{date:%Y/%m/%d}``)
  and the result is read as one of the above.

**Catch-up of a template.** A night reads its own date's batches and every earlier date's
not merged yet, back to the oldest date the series has merged a batch of (``since``):
a killed or failed night's batches are merged by the next night that runs, oldest date
first. Dates are read back from the matched names with the template's own format; a name
that does not parse is not a dated batch and is left alone. Before a series has merged
a dated batch, a night reads its own date only.

Batches are ordered by date, then name (their full path). A batch's identity is what the
series records and compares: the SHA-256 of its bytes (every file of a multi-file batch
is one batch per file here), its size and, where the store reports them, its ETag and
object version; a local file's modification time. A file whose path, size and ETag (or
object version; locally, modification time) equal a merged batch's is that batch, without
reading its bytes again: a night over a year of landed batches lists them and hashes only
the new ones.
"""

from __future__ import annotations

import datetime
import glob as _glob
import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

from pipeline.output import Location

from ..errors import UserError

__all__ = [
    "Batch",
    "batch_identity",
    "dated_batches",
    "pending_batches",
    "quick_key",
    "resolve_batches",
]

logger = logging.getLogger("pipeline")

_GLOB = "*?["
_DATE = re.compile(r"\{date(?::([^{}]*))?\}")


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


class _Template:
    """A ``{date}`` template's dated matches: the glob that finds every date's files and
    the pattern that reads a matched file's date back (in the fs form of the paths)."""

    def __init__(self, spec: str, storage_options: dict[str, Any] | None, sample):
        from ..config import absolute_path

        self.fmts = [m.group(1) or "" for m in _DATE.finditer(spec)]
        marked = spec
        for i in range(len(self.fmts)):
            marked = _DATE.sub(f"KPCADATEFIELD{i}X", marked, count=1)
        self.loc = Location.at(absolute_path(marked), storage_options)
        fpath = self.loc.fs_path
        glob, regex = fpath, ""
        parts = re.split(r"KPCADATEFIELD(\d+)X", fpath)
        for k, part in enumerate(parts):
            if k % 2:  # a date field: as many path segments as its value has
                slashes = format(sample, self.fmts[int(part)]).count("/")
                glob = glob.replace(f"KPCADATEFIELD{part}X", "/".join(["*"] * (slashes + 1)))
                regex += "(.+?)"
            else:
                regex += _glob_regex(part)
        self.glob = glob
        self.pattern = re.compile(regex)

    def date_of(self, fs_path: str) -> datetime.datetime | None:
        """The date a matched path names (naive, the template's clock), None if it does
        not parse with the template's format."""
        m = self.pattern.fullmatch(fs_path.rstrip("/"))
        if not m:
            return None
        try:
            return self._parse(list(m.groups()))
        except ValueError:
            return None

    def floor(self, when: datetime.datetime) -> datetime.datetime:
        """``when`` at the template's resolution (the date its name would carry); a
        ValueError when the template's format does not read back."""
        return self._parse([format(when, f) if f else str(when) for f in self.fmts])

    def _parse(self, values: list[str]) -> datetime.datetime:
        if "" in self.fmts:  # bare {date}: str(datetime), read back as ISO
            got = datetime.datetime.fromisoformat(values[self.fmts.index("")])
            return got.replace(tzinfo=None)
        return datetime.datetime.strptime("\x1f".join(values), "\x1f".join(self.fmts))


def _glob_regex(text: str) -> str:
    """A regex matching what the glob ``text`` matches within path segments."""
    out, i = "", 0
    while i < len(text):
        c = text[i]
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[" and "]" in text[i + 2 :]:
            j = text.index("]", i + 2)
            body = text[i + 1 : j]
            out += "[" + ("^" + body[1:] if body.startswith("!") else body) + "]"
            i = j
        else:
            out += re.escape(c)
        i += 1
    return out


def dated_batches(
    spec: str,
    storage_options: dict[str, Any] | None,
    *,
    logical_date: datetime.datetime,
    since: list[str] | None = None,
) -> list[tuple[str, bool]]:
    """A template's batches for a night: ``(path, tonight)`` for every file its dates from
    the oldest date among ``since`` (paths of merged batches; those the template does not
    match are ignored) to ``logical_date`` name, sorted by date, then name. ``tonight``:
    the file is one ``spec`` formatted on ``logical_date`` names. With no ``since`` that
    the template matches: tonight's files only (:func:`resolve_batches`)."""
    tpl = _Template(spec, storage_options, logical_date)
    dates = [d for d in (tpl.date_of(_fs_form(p)) for p in since or []) if d is not None]
    try:
        last = tpl.floor(logical_date)
    except ValueError:  # a format that does not read back: no dates to compare
        logger.warning("series: %s: its dates do not read back from names; no catch-up", spec)
        dates = []
    if not dates:
        tonight = resolve_batches(spec, storage_options, logical_date=logical_date)
        return [(p, True) for p in tonight]
    first = min(dates)
    loc, fs = tpl.loc, tpl.loc.fs
    if not loc.is_local:
        loc.refresh()
    found = []
    for p in fs.glob(tpl.glob):
        name = str(p).rstrip("/").rpartition("/")[2]
        if _skipped(name) or fs.isdir(p):
            continue
        when = tpl.date_of(str(p))
        if when is not None and first <= when <= last:
            found.append((when, str(p)))
    # tonight's files are the ones whose date reads back as the night's own
    return [(_url(loc, p), when == last) for when, p in sorted(found)]


def _fs_form(url: str) -> str:
    """A path or URL as its file system names it (no scheme)."""
    return url.split("://", 1)[1] if "://" in url else url


def quick_key(identity: dict[str, Any]) -> tuple | None:
    """What names a batch's bytes without reading them: its path and size with the
    store's ETag or object version, or a local file's modification time (None: nothing
    to compare but the digest)."""
    mark = identity.get("etag") or identity.get("version_id") or identity.get("mtime")
    if not identity.get("path") or mark is None or identity.get("size") is None:
        return None
    return (str(identity["path"]), int(identity["size"]), str(mark))


def _listed_key(path: str, storage_options: dict[str, Any] | None = None) -> tuple | None:
    """:func:`quick_key` of the file at ``path`` from its listing (no bytes read)."""
    loc = Location.at(path, storage_options)
    try:
        info = loc.fs.info(loc.fs_path)
    except (FileNotFoundError, OSError):
        return None
    if info.get("type") == "directory":
        return None
    return quick_key({"path": path, "size": info.get("size"), **_marks(info, loc.is_local)})


def _marks(info: dict[str, Any], local: bool) -> dict[str, Any]:
    etag = info.get("ETag") or info.get("etag")
    version = info.get("VersionId") or info.get("version_id") or info.get("generation")
    return {
        "etag": str(etag).strip('"') if etag else None,
        "version_id": str(version) if version not in (None, "", "null") else None,
        **({"mtime": repr(float(info["mtime"]))} if local and info.get("mtime") else {}),
    }


#: identities this process hashed, by :func:`quick_key`: a night lists and hashes its
#: pending batches, then each batch's update asks again (pipeline/series/setup.py); the
#: second ask is answered from here while the file's listed key is unchanged
_HASHED: dict[tuple, dict[str, Any]] = {}
_HASHED_KEEP = 256


def batch_identity(path: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"path", "sha256", "size", "etag", "version_id"}`` of the batch at ``path``: the
    SHA-256 of its bytes (a folder batch, e.g. a zarr store: of its files' names and
    bytes, in order), and the store's ETag and object version where it has them; a local
    file's ``mtime`` too (:func:`quick_key`). A file this process hashed is not read
    again while its listing's key (path, size, ETag, version or mtime) is the same."""
    loc = Location.at(path, storage_options)
    if not loc.is_local:
        loc.refresh()  # the listing as the store has it now, not as fsspec cached it
    key = _listed_key(path, storage_options)
    if key is not None and key in _HASHED:
        return dict(_HASHED[key])
    identity = _hashed_identity(path, storage_options)
    if key is not None and quick_key(identity) == key:  # unchanged while it was read
        _HASHED[key] = dict(identity)
        while len(_HASHED) > _HASHED_KEEP:
            _HASHED.pop(next(iter(_HASHED)))
    return identity


def _hashed_identity(path: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    loc = Location.at(path, storage_options)
    fs, fpath = loc.fs, loc.fs_path
    if not loc.is_local:
        loc.refresh()
    h = hashlib.sha256()
    size = 0
    marks: dict[str, Any] = {"etag": None, "version_id": None}
    if fs.isdir(fpath):
        files = sorted(str(p) for p in fs.find(fpath))
        for f in files:
            h.update(f[len(fpath) :].encode() + b"\0")
            size += _hash_file(fs, f, h)
    else:
        marks = _marks(fs.info(fpath), loc.is_local)
        size = _hash_file(fs, fpath, h)
    return {"path": path, "sha256": "sha256:" + h.hexdigest(), "size": int(size), **marks}


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
    sources: list[tuple[dict[str, Any], str]] | None = None,
) -> tuple[list[Batch], list[tuple[Batch, str]]]:
    """``(pending, done)``: the batches ``spec`` names, oldest first, split by whether the
    series merged them already (``merged``: digest -> the version that merged it,
    :func:`pipeline.series.merged.merged_sources`); a batch whose bytes appear twice under
    two names is pending once.

    ``sources``: the merged batches' identities with their versions
    (:func:`pipeline.series.merged.merged_entries`). A template then catches up
    (:func:`dated_batches`), and a file whose :func:`quick_key` is a merged batch's is
    done without reading it. ``done`` lists the batches of tonight's date (and every
    batch, for a spec that is no template); earlier dates' merged batches are not news."""
    sources = sources or []
    known = {k: (src, vid) for src, vid in sources if (k := quick_key(src)) is not None}
    if _DATE.search(spec) and sources:
        when = logical_date or datetime.datetime.now(datetime.UTC)
        since = [str(src.get("path")) for src, _ in sources if src.get("path")]
        found = dated_batches(spec, storage_options, logical_date=when, since=since)
    else:
        found = [
            (p, True) for p in resolve_batches(spec, storage_options, logical_date=logical_date)
        ]
    pending: list[Batch] = []
    done: list[tuple[Batch, str]] = []
    seen: set[str] = set()
    hashed = 0
    for p, tonight in found:
        hit = known.get(_listed_key(p, storage_options)) if known else None
        if hit is not None:
            if tonight:
                done.append((Batch(p, {**hit[0], "path": p}), hit[1]))
            continue
        b = Batch(p, batch_identity(p, storage_options))
        hashed += 1
        if b.digest in merged:
            if tonight:
                done.append((b, merged[b.digest]))
            else:
                logger.info(
                    "series: %s holds the bytes of a merged batch (version %s); skipped",
                    p,
                    merged[b.digest],
                )
        elif b.digest not in seen:
            seen.add(b.digest)
            pending.append(b)
    if len(found) > len(pending):
        logger.debug("series: %d batches listed, %d read to compare", len(found), hashed)
    return pending, done
