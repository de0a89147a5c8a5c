# long: the output's whole lifecycle in one place (transaction, retention, recovery, reads)
"""Versioned outputs published by one atomic write: the transaction of every writer.

An output ``<out>/`` (a run, an update run, a transform or denoise output) holds

* ``versions/<id>/``: one complete result per writer, never modified once published
  (``<id>`` sorts by time: ``20261126T141925123456Z-3f9a1c``); each carries its own
  ``manifest.json`` and an ownership marker;
* ``manifest.json``: the **pointer**, the one object readers start from. It is the
  published version's manifest plus ``version`` (the id), ``version_path``
  (``versions/<id>``) and ``history`` (the earlier published versions still kept,
  newest first);
* ``work/`` (runs only: resume state, never published) and the writer's lock
  ``.kpca-run.lock``.

A writer takes the lock, writes a new version where nothing points to it, and
publishes it by replacing the pointer in one step: ``os.replace`` of a temporary
file on local disk, one PUT of one object on S3/GCS/Azure (atomic per object on
each). A reader resolves the pointer (:func:`resolve`) and reads the version it
names, so it sees the previous result or the new one, never a half-written one. A
writer that fails removes the version it wrote and leaves the pointer untouched; one
that is killed leaves a version named by nothing, which the next writer (under the
lock) removes. A run resumes from ``work/`` (ingest and kernel stores), never from an
unpublished version.

Before it replaces the pointer a writer re-reads it: if it no longer names the version
that was published when the writer took the lock, or the lock is no longer the
writer's, it publishes nothing (:class:`ConcurrentPublishError`, one line).

The output's life after the publish step (docs/artifacts.md, "Over an output's whole life"):

* **Readers.** What :func:`resolve` hands out reads through :class:`VersionGuardStore`: a
  chunk or ``zarr.json`` missing from the version is an error naming it -- "removed by
  retention, open the output again" when the version is gone, a damaged chunk otherwise
  -- never the fill value (zeros).
* **Retention, two steps** (Delta's VACUUM, Iceberg's expire_snapshots): a commit keeps
  the newest ``keep`` versions in the pointer's ``history``; the ones that leave it are
  *expired*: they stay in ``history`` tagged ``"expired": <time>`` and on the store, and
  are deleted by a later commit only once expired for longer than the grace period
  (:data:`DEFAULT_GRACE_SECONDS`, far longer than any writer's lease) and named by no
  hold (``<out>/holds/*.json``, :func:`held_versions`).
* **Recovery.** A lost or damaged pointer is rebuilt from the newest complete, verified
  version (:func:`rebuild_pointer`): readers read that version without writing anything,
  the next writer writes the rebuilt pointer. A writer removes only versions proven
  unpublished: no complete manifest of their own and older than the writers' lease
  (:data:`pipeline.output.lock.LEASE_SECONDS`).
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import json
import logging
import os
import posixpath
import shutil
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zarr.storage import WrapperStore

from kpca_dask.exceptions import ModelFormatError
from pipeline.errors import (
    CorruptObjectError,
    RunCorruptError,
    RunError,
    RunIncompleteError,
    UserError,
)

from .layout import MANIFEST
from .store import Location, atomic_write_json, mark_folder, read_json

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_KEEP",
    "HOLDS",
    "POINTER_KEYS",
    "VERSIONS",
    "ConcurrentPublishError",
    "Published",
    "Transaction",
    "VersionGuardStore",
    "VersionLocation",
    "VersionRemovedError",
    "held_versions",
    "new_version_id",
    "open_output",
    "read_pointer",
    "rebuild_pointer",
    "resolve",
    "version_ids",
]

logger = logging.getLogger("pipeline")

#: the folder of an output holding one sub-folder per version
VERSIONS = "versions"
#: how many published versions an output keeps (the published one included)
DEFAULT_KEEP = 7
#: the keys the pointer adds to the published version's manifest
POINTER_KEYS = ("version", "version_path", "history")
#: the marker kind of a version folder
VERSION_MARK = "version"
#: how long a version stays on the store after it left the kept versions (expired),
#: before a writer may delete it: 24 hours. It must outlast any reader of a version it
#: resolved while the version was kept (a nightly job reading last night's version, an
#: update reading its base) and any writer's lease (pipeline.output.lock.LEASE_SECONDS, 10
#: minutes) by far; a day covers a daily reader that starts just before the next publish.
#: Delta's VACUUM defaults to 7 days, Iceberg's expire_snapshots to 5: their readers
#: include long streaming queries, ours re-open the output each run. Configurable
#: (``output.retention_grace_hours``); 0 deletes at expiry (readers then fail in one line,
#: never read zeros).
DEFAULT_GRACE_SECONDS = 24 * 3600
#: the folder of an output holding the holds: ``<out>/holds/*.json``, each naming versions
#: of this output another output's lineage needs (never deleted while named)
HOLDS = "holds"
#: the key of a history entry that left the kept versions (its value: when, ISO time)
EXPIRED = "expired"


class ConcurrentPublishError(UserError, RuntimeError):
    """Another writer published (or took the lock) while this one wrote: nothing was
    published by this one."""


class VersionRemovedError(RunError, ModelFormatError):
    """A reader read a version of an output that retention removed meanwhile: the message
    names the output, the version and the object, and says to open the output again. Also
    a ModelFormatError, so that ``kpca_dask.load`` of the version's model says this line
    as it is."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _iso(t: datetime.datetime) -> str:
    return t.isoformat(timespec="seconds")


def _parse_time(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)


def id_time(vid: str) -> datetime.datetime | None:
    """When the version ``vid`` was begun, from its id (``20261126T141925123456Z-3f9a1c``);
    None for a name that is not one of our ids."""
    try:
        return datetime.datetime.strptime(vid.split("-", 1)[0], "%Y%m%dT%H%M%S%fZ").replace(
            tzinfo=datetime.UTC
        )
    except (ValueError, AttributeError):
        return None


def new_version_id() -> str:
    """A sortable, unique version id: UTC time to the microsecond and a short token."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{now}-{uuid.uuid4().hex[:6]}"


def _valid_id(vid: Any) -> bool:
    return (
        isinstance(vid, str)
        and bool(vid)
        and "/" not in vid
        and "\\" not in vid
        and vid not in (".", "..")
    )


def version_location(root: Location, vid: str) -> Location:
    if not _valid_id(vid):
        raise RunCorruptError(f"{root}: {vid!r} is not a version id of kpca-dask.")
    return root.child(VERSIONS, vid)


def read_pointer(root: Location) -> dict | None:
    """The pointer (``<root>/manifest.json``) as a dict; None when there is none. Raises
    RunIncompleteError when it is not a JSON object."""
    m = root.child(MANIFEST)
    if not m.is_local:
        m.refresh()  # the pointer is replaced by other processes
    if not m.exists():
        return None
    try:
        data = read_json(m)
    except Exception as exc:
        raise RunIncompleteError(
            f"{m} is not valid JSON ({type(exc).__name__}: {exc}): the manifest is incomplete "
            "or damaged; the run is not a result. Re-run the pipeline."
        ) from exc
    if not isinstance(data, dict):
        raise RunIncompleteError(
            f"{m} does not hold a JSON object; the run is not a result. Re-run the pipeline."
        )
    return data


def history_ids(pointer: dict | None) -> list[str]:
    """The versions a pointer keeps: the published one first, then its history (the
    expired entries left out)."""
    if not pointer or not _valid_id(pointer.get("version")):
        return []
    ids = [pointer["version"]]
    for h in kept_entries(pointer):
        if h["version"] not in ids:
            ids.append(h["version"])
    return ids


def _entries(pointer: dict | None) -> list[dict]:
    return [
        h
        for h in (pointer or {}).get("history") or []
        if isinstance(h, dict) and _valid_id(h.get("version"))
    ]


def kept_entries(pointer: dict | None) -> list[dict]:
    """The history entries still kept (readable by ``version=``), newest first."""
    return [h for h in _entries(pointer) if EXPIRED not in h]


def expired_entries(pointer: dict | None) -> list[dict]:
    """The history entries that left the kept versions (``expired``: when), still on
    the store until the grace period has passed and no hold names them."""
    return [h for h in _entries(pointer) if EXPIRED in h]


def named_ids(pointer: dict | None) -> set[str]:
    """Every version a pointer names, kept or expired."""
    return set(history_ids(pointer)) | {h["version"] for h in expired_entries(pointer)}


def version_ids(root: Location) -> list[str]:
    """Every version folder present under ``<root>/versions`` (published or not), sorted."""
    base = root.child(VERSIONS)
    if not base.is_local:
        base.refresh()  # another process may have written there
    try:
        names = base.fs.ls(base.fs_path, detail=False) if base.exists() else []
    except FileNotFoundError:
        names = []
    return sorted(str(n).rstrip("/").rpartition("/")[2] for n in names)


# ------------------------------------------------------------------------- holds
class HoldsEverything(frozenset):
    """What :func:`held_versions` returns when a hold cannot be read: every version is
    held (retention deletes nothing on doubt)."""

    def __contains__(self, item: object) -> bool:
        return True


def held_versions(root: Location) -> set[str]:
    """The versions of the output at ``root`` that holds name (``<root>/holds/*.json``,
    each ``{"written_by": "kpca-dask", "kind": "hold", "holder": <url>, "versions": [...],
    "updated": <time>}``, written by the outputs whose lineage needs them). A hold that
    cannot be read or is not one of ours holds every version (one WARNING line): retention
    never deletes on doubt. The result is a set (:class:`HoldsEverything` then: every
    ``vid in held`` is true)."""
    base = root.child(HOLDS)
    if not base.is_local:
        base.refresh()
    try:
        if not base.exists():
            return set()
        names = sorted(str(n) for n in base.fs.ls(base.fs_path, detail=False))
    except FileNotFoundError:
        return set()
    except Exception as exc:  # noqa: BLE001 - cannot list the holds: hold everything
        logger.warning(
            "retention: cannot list the holds of %s (%s); no version is deleted",
            root,
            _short(exc),
        )
        return HoldsEverything()
    held: set[str] = set()
    for name in names:
        leaf = name.rstrip("/").rpartition("/")[2]
        if not leaf.endswith(".json"):
            continue
        try:
            with base.fs.open(name, "r") as f:
                data = json.load(f)
            ok = (
                isinstance(data, dict)
                and data.get("written_by") == "kpca-dask"
                and data.get("kind") == "hold"
                and isinstance(data.get("versions"), list)
                and all(isinstance(v, str) for v in data["versions"])
            )
        except Exception as exc:  # noqa: BLE001 - unreadable: hold everything
            ok, data = False, _short(exc)
        if not ok:
            logger.warning(
                "retention: the hold %s/%s cannot be read as a kpca-dask hold; every "
                "version of %s is kept until it is repaired or removed",
                base,
                leaf,
                root,
            )
            return HoldsEverything()
        held.update(data["versions"])
    return held


def _short(exc: BaseException, n: int = 160) -> str:
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg[:n]}" if msg else type(exc).__name__


# ------------------------------------------------------------- pointer and recovery
def load_pointer(root: Location) -> tuple[dict | None, str | None]:
    """The pointer and what is wrong with it: ``(pointer, None)`` when it is readable,
    ``(None, None)`` when there is none, ``(None, why)`` when it is damaged (not JSON,
    truncated, not an object, a version's manifest copied over it in an output that
    keeps versions, or naming a version whose manifest is gone from the store)."""
    try:
        pointer = read_pointer(root)
    except RunIncompleteError as exc:
        cause = exc.__cause__
        why = "not valid JSON" if cause is not None else "not a JSON object"
        return None, f"damaged ({why})"
    if pointer is None:
        return None, None
    if "version" not in pointer:
        # a version's manifest at the root of an output that keeps versions; an output
        # written before versions (or a version folder) has no versions/ folder
        if root.child(VERSIONS).exists() and _complete_ids(root):
            return None, "damaged (it names no version: a version's manifest copied over it?)"
        return pointer, None
    if not _valid_id(pointer.get("version")):
        return None, f"damaged (its version {pointer.get('version')!r} is not a version id)"
    vid = pointer["version"]
    named = version_location(root, vid).child(MANIFEST)
    if not named.is_local:
        named.refresh()
    if not named.exists():  # a store error raises: never taken for a missing version
        return None, (
            f"damaged (it names version {vid}, whose folder has no manifest: removed by "
            "hand or by a lifecycle rule?)"
        )
    return pointer, None


def version_manifest(root: Location, vid: str) -> dict | None:
    """The manifest of version ``vid`` when it is complete (readable, status complete);
    None otherwise."""
    m = version_location(root, vid).child(MANIFEST)
    try:
        if not m.is_local:
            m.refresh()
        if not m.exists():
            return None
        data = read_json(m)
    except Exception:  # noqa: BLE001 - unreadable: not complete
        return None
    return data if isinstance(data, dict) and data.get("status") == "complete" else None


def _complete_ids(root: Location) -> list[str]:
    """The versions on the store with a complete manifest of their own, newest first."""
    return [v for v in reversed(version_ids(root)) if version_manifest(root, v) is not None]


#: the checks of a run's version, checksums included (pipeline.output.export registers
#: ``_verify`` when it is imported: it imports this module, so this one cannot import it)
_RUN_VERIFIER: Any = None


def set_run_verifier(fn: Any) -> None:
    """Register the checks :func:`verify_version` applies to a run's version
    (``fn(location, manifest)`` raising when it does not verify)."""
    global _RUN_VERIFIER
    _RUN_VERIFIER = fn


def verify_version(root: Location, vid: str, manifest: dict) -> str | None:
    """None when version ``vid`` (with its complete ``manifest``) verifies; else why not
    (one line). A run's version: :func:`pipeline.output.export.verify_run`'s checks, checksums
    included; a transform's: every row and chunk there; anything else: its manifest."""
    loc = version_location(root, vid)
    try:
        if "schema_version" in manifest and "model" in manifest:
            if _RUN_VERIFIER is not None:
                _RUN_VERIFIER(loc, manifest)
            else:  # pipeline.output.export not imported: every chunk there, at least
                from .completeness import check_complete

                check_complete(loc)
        elif manifest.get("kind") in ("kpca-dask-transform", "kpca-dask-denoised"):
            from .completeness import check_complete

            data = manifest.get("data") or "."
            target = loc if data == "." else loc.child(*data.split("/"))
            if manifest.get("format") != "parquet":
                check_complete(target)
                g = target.open_group("r")
                rows = manifest.get("rows")
                arr = "denoised" if "denoised" in g else "embedding"
                if rows is not None and (arr not in g or g[arr].shape[0] != rows):
                    return f"version {vid} does not hold its {rows} rows"
    except Exception as exc:  # noqa: BLE001 - any failure: not verified
        return _short(exc)
    return None


def rebuild_pointer(root: Location) -> dict | None:
    """The pointer of the output at ``root`` rebuilt from its versions (written by no one
    here): the newest complete version that verifies is the published one, the other
    complete versions (newer ones that do not verify left out) its history, newest first.
    None when no version verifies."""
    ids = _complete_ids(root)
    for i, vid in enumerate(ids):
        manifest = version_manifest(root, vid)
        if manifest is None:
            continue
        why = verify_version(root, vid, manifest)
        if why is not None:
            logger.warning(
                "recovery: version %s of %s does not verify (%s); not used", vid, root, why
            )
            continue
        history = []
        for other in ids[i + 1 :]:
            m = version_manifest(root, other)
            if m is not None:
                history.append({"version": other, "created": m.get("created")})
        return {
            **manifest,
            "version": vid,
            "version_path": f"{VERSIONS}/{vid}",
            "history": history,
        }
    return None


# ------------------------------------------------------------- guarded reads
_METADATA = ("zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata")


@dataclass(frozen=True)
class _Guard:
    """What a guarded read of version ``vid`` of the output ``root`` needs: where the
    store sits inside the version (``prefix``), the chunk keys recorded as absent when the
    version was written (``absent``, relative to the version) and whether any other
    absent chunk is damage (``strict``: every published array is written dense)."""

    root: Location
    vid: str
    prefix: str = ""
    absent: frozenset = frozenset()
    strict: bool = True

    def below(self, *parts: str) -> _Guard:
        prefix = posixpath.join(self.prefix, *parts) if parts else self.prefix
        return _Guard(self.root, self.vid, prefix.strip("/"), self.absent, self.strict)

    def removed(self) -> bool:
        """Whether the version is gone: its manifest missing, or the pointer (readable)
        naming it no longer, kept or expired (retention deletes only such versions)."""
        if version_manifest(self.root, self.vid) is None:
            return True
        try:
            pointer, problem = load_pointer(self.root)
        except Exception:  # noqa: BLE001 - cannot tell: the manifest is there
            return False
        return pointer is not None and problem is None and self.vid not in named_ids(pointer)

    def removed_error(self, what: str) -> VersionRemovedError:
        return VersionRemovedError(
            f"{self.root}: version {self.vid} was removed by retention while it was read "
            f"({what} is gone); open the output again (pipeline.open_run) to read its "
            "current version."
        )

    def check_version(self) -> None:
        if self.removed():
            where = posixpath.join(VERSIONS, self.vid, self.prefix) if self.prefix else ""
            raise self.removed_error(where or f"{VERSIONS}/{self.vid}")

    def missing(self, key: str) -> None:
        """A key the store does not hold was read: raise unless that is legitimate."""
        rel = posixpath.join(self.prefix, key) if self.prefix else key
        leaf = key.rpartition("/")[2]
        if leaf in _METADATA:
            if leaf == "zarr.json" and self.removed():
                raise self.removed_error(f"{VERSIONS}/{self.vid}/{rel}")
            return  # a node that is not there (``name in group``), or a v2 probe
        if rel in self.absent:
            return  # a chunk equal to the fill value, never written (recorded)
        if self.removed():
            raise self.removed_error(f"{VERSIONS}/{self.vid}/{rel}")
        if self.strict:
            raise CorruptObjectError(
                f"{self.root}: chunk {rel} of version {self.vid} is missing from the store "
                "(zarr would read it as zeros); do not use this version: re-run the pipeline "
                "or restore it from a copy."
            )


class VersionGuardStore(WrapperStore):
    """A read-only zarr store of (a folder of) a published version: a chunk it does not
    hold is read as an error naming it (the version removed by retention, or damaged),
    never as the fill value; a legitimately absent chunk (recorded in the manifest) and a
    node that does not exist read as zarr expects. Picklable (Dask tasks carry it)."""

    def __init__(self, store: Any, guard: _Guard):
        super().__init__(store)
        self.guard = guard

    def _with_store(self, store: Any) -> VersionGuardStore:
        return type(self)(store, self.guard)

    def __str__(self) -> str:
        return str(self.guard.root.child(VERSIONS, self.guard.vid, self.guard.prefix or "."))

    def __repr__(self) -> str:
        return f"VersionGuardStore({self})"

    async def _open(self) -> None:
        try:
            await self._store._open()
        except FileNotFoundError:  # the version's folder is gone (local disk)
            await asyncio.to_thread(self.guard.check_version)
            raise

    async def _ensure_open(self) -> None:
        if not self._store._is_open:
            await self._open()

    async def _missing(self, key: str) -> None:
        # the checks read the store with fsspec's own (sync) calls: off zarr's event loop
        await asyncio.to_thread(self.guard.missing, key)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        buf = await self._store.get(key, prototype, byte_range)
        if buf is None:
            await self._missing(key)
        return buf

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list:
        key_ranges = list(key_ranges)
        out = await self._store.get_partial_values(prototype, key_ranges)
        for (key, _), buf in zip(key_ranges, out):
            if buf is None:
                await self._missing(key)
        return out


@dataclass(frozen=True, eq=False)
class VersionLocation(Location):
    """The location of (a folder of) a published version a reader resolved: a
    :class:`Location` whose zarr reads (``open_group("r")``, ``zarr_source()``) go
    through :class:`VersionGuardStore`. Equal to the plain Location of the same URL."""

    guard: _Guard | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and other.url == self.url

    __hash__ = Location.__hash__

    def child(self, *parts: str) -> Location:
        loc = super().child(*parts)
        if self.guard is None:
            return loc
        return VersionLocation(loc.url, loc.storage_options, self.guard.below(*parts))

    def _guarded_store(self) -> VersionGuardStore:
        from zarr.storage import FsspecStore, LocalStore

        if self.is_local:
            inner = LocalStore(str(self.local_path), read_only=True)
        else:
            inner = FsspecStore.from_url(
                self.url, storage_options=dict(self.storage_options), read_only=True
            )
        assert self.guard is not None
        return VersionGuardStore(inner, self.guard)

    def zarr_source(self, *, writable: bool = False) -> Any:
        if writable or self.guard is None:
            return super().zarr_source(writable=writable)
        self.guard.check_version()  # a version removed since it was resolved: one line
        return self._guarded_store()

    def open_group(self, mode: str = "r") -> Any:
        if mode != "r" or self.guard is None:
            return super().open_group(mode)
        import zarr

        return zarr.open_group(self._guarded_store(), mode="r")


def _guarded(root: Location, vid: str, manifest: dict, loc: Location) -> VersionLocation:
    record = manifest.get("integrity")
    absent = set()
    if isinstance(record, dict):
        for name, keys in (record.get("absent_chunks") or {}).items():
            absent.update(f"{name}/{k}" for k in keys or ())
    strict = isinstance(record, dict) or manifest.get("kind") in (
        "kpca-dask-transform",
        "kpca-dask-denoised",
    )
    guard = _Guard(root, vid, "", frozenset(absent), strict)
    return VersionLocation(loc.url, loc.storage_options, guard)


@dataclass(frozen=True)
class Published:
    """What a reader resolved: the output's root, the location of the version it reads,
    that version's id (None: an output written before versions, read in place) and
    the version's manifest."""

    root: Location
    location: Location
    version: str | None
    manifest: dict
    pointer: dict | None

    @property
    def model(self) -> Location:
        """The version's model folder: ``kpca_dask.load(run.model.zarr_source())``."""
        return self.location.child("model")

    def child(self, *parts: str) -> Location:
        """A path inside the version (``run.child("embedding.parquet")``)."""
        return self.location.child(*parts)

    @property
    def data(self) -> Location:
        """A transform output's data: the version's zarr group, or its Parquet dataset
        (the manifest's ``data``)."""
        rel = self.manifest.get("data") or "."
        return self.location if rel == "." else self.location.child(*rel.split("/"))

    @property
    def history(self) -> list[dict]:
        """The published versions the output keeps, newest first (id and creation); the
        expired ones (still on the store during the grace period) are left out."""
        if not self.pointer:
            return []
        cur = {"version": self.pointer.get("version"), "created": self.pointer.get("created")}
        return [cur, *kept_entries(self.pointer)]


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds:g} s"


def _marker_time(root: Location, vid: str) -> datetime.datetime | None:
    """When the marker of version ``vid`` was written (its modification time); None when
    it cannot be told."""
    from kpca_dask.removal import MARKER_FILE

    m = version_location(root, vid).child(MARKER_FILE)
    try:
        if m.is_local:
            mtime = os.lstat(m.local_path).st_mtime
            return datetime.datetime.fromtimestamp(mtime, datetime.UTC)
        t = m.fs.modified(m.fs_path)
    except Exception:  # noqa: BLE001 - cannot tell: not proven old
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)


def strip_pointer(pointer: dict) -> dict:
    return {k: v for k, v in pointer.items() if k not in POINTER_KEYS}


def _pointer_or_recovered(root: Location) -> dict:
    """The pointer a reader follows: the output's own, or -- lost or damaged -- one
    rebuilt in memory from the newest complete, verified version (one WARNING line,
    nothing written). RunIncompleteError when there is none to follow."""
    pointer, problem = load_pointer(root)
    if pointer is None:
        rebuilt = rebuild_pointer(root) if root.child(VERSIONS).exists() else None
        if rebuilt is None and problem is not None:
            raise RunIncompleteError(
                f"{root.child(MANIFEST)} is {problem} and no version of {root} is complete "
                "and verified to recover it from; the output holds no result. Re-run the "
                "pipeline."
            )
        if rebuilt is None:
            raise RunIncompleteError(
                f"{root} has no manifest.json: the run did not finish (or is still running); "
                "it is not a result. Re-run the pipeline to complete it."
            )
        logger.warning(
            "recovery: the pointer %s is %s; reading the newest complete, verified version "
            "%s instead (read-only: the next run or transform to this output rewrites the "
            "pointer)",
            root.child(MANIFEST),
            problem or "missing",
            rebuilt["version"],
        )
        pointer = rebuilt
    return pointer


def resolve(
    root: Location | str, version: str | None = None, storage_options=None
) -> Published:
    """The version of the output at ``root`` a reader reads: the published one (or
    ``version``, which must be the published one, in the pointer's history, or expired
    but still on the store, e.g. held by a series' lineage).

    ``root`` may also be a version folder itself or an output written before versions
    (its manifest beside its arrays): both are read in place. A lost or damaged pointer
    is rebuilt in memory from the newest complete, verified version (one WARNING line;
    nothing is written: the next writer writes it). Raises RunIncompleteError when
    nothing is published there. The manifest is returned as found (not verified:
    :func:`pipeline.output.export.verify_run` does that). The version's ``location`` reads
    through :class:`VersionGuardStore` (a removed version is one line, never zeros)."""
    root = root if isinstance(root, Location) else Location.at(str(root), storage_options)
    if not root.exists():
        raise RunIncompleteError(f"{root} does not exist; check the path of the run folder.")
    pointer = _pointer_or_recovered(root)
    if "version" not in pointer:  # a version folder, or an output from before versions
        if version is not None:
            raise RunIncompleteError(
                f"{root} keeps no versions (it is a single result); read it without --version."
            )
        return Published(root, root, None, pointer, None)
    names = history_ids(pointer)
    vid = pointer["version"] if version is None else str(version)
    expired = {h["version"]: h for h in expired_entries(pointer)}
    if vid not in names and not (vid in expired and version_manifest(root, vid) is not None):
        kept = ", ".join(names) or "none"
        raise RunIncompleteError(
            f"{root} has no published version {vid!r} (kept: {kept}); pass one of those."
        )
    if vid in expired and vid not in names:
        logger.info(
            "resolve: version %s of %s left the kept versions at %s; it stays readable "
            "while a hold names it or for the grace period",
            vid,
            root,
            expired[vid].get(EXPIRED),
        )
    loc = version_location(root, vid)
    vm = loc.child(MANIFEST)
    if not vm.exists():
        raise RunCorruptError(
            f"{root}: version {vid} named by its manifest is missing ({vm}); do not use "
            "this output, re-run the pipeline."
        )
    try:
        manifest = read_json(vm)
    except Exception as exc:
        raise RunCorruptError(
            f"{vm} is not valid JSON ({type(exc).__name__}); do not use this version."
        ) from exc
    if not isinstance(manifest, dict):
        raise RunCorruptError(f"{vm} does not hold a JSON object; do not use this version.")
    if vid == pointer["version"] and _canon(strip_pointer(pointer)) != _canon(manifest):
        raise RunCorruptError(
            f"{root}: the published manifest and version {vid}'s own manifest differ; one "
            "was changed after publishing. Do not use this output; re-run the pipeline."
        )
    return Published(root, _guarded(root, vid, manifest, loc), vid, manifest, pointer)


def open_output(
    path: Location | str, storage_options: dict | None = None, *, version: str | None = None
) -> Published:
    """The published version of a ``kpca transform`` (or ``--inverse``) output: its
    ``data`` is the zarr group or Parquet dataset to read. Raises RunError (one line)
    when nothing complete is published there."""
    pub = resolve(path, version, storage_options)
    if pub.manifest.get("status") != "complete":
        raise RunIncompleteError(f"{path}: nothing complete is published there.")
    return pub


def _canon(d: Any) -> str:
    from .store import json_default

    return json.dumps(d, sort_keys=True, default=json_default)


def _owned_version(loc: Location):
    """The ownership check for removing a version folder: it carries our marker."""
    if loc.is_local:
        from kpca_dask.removal import has_marker

        return lambda p: has_marker(p, VERSION_MARK)
    fs = loc.fs

    def ours(p: str) -> bool:
        from kpca_dask.removal import MARKER_FILE

        try:
            with fs.open(f"{p.rstrip('/')}/{MARKER_FILE}", "r") as f:
                data = json.load(f)
        except Exception:
            return False
        return (
            isinstance(data, dict)
            and data.get("written_by") == "kpca-dask"
            and data.get("kind") == VERSION_MARK
        )

    return ours


def remove_version(root: Location, vid: str, protect: tuple = ()) -> bool:
    """Remove one version folder of ours (refused when it carries no marker of ours)."""
    loc = version_location(root, vid)
    try:
        return loc.remove(root=root.child(VERSIONS), owned=_owned_version(loc), protect=protect)
    except Exception as exc:  # noqa: BLE001 - never fail a published result over cleanup
        logger.warning("publish: could not remove version %s of %s (%s)", vid, root, exc)
        return False


def link_tree(src: Path, dst: Path, top: Path | None = None, where: str = "") -> None:
    """``dst`` as a copy of ``src`` made of hard links (a copy where linking fails). Every
    writer replaces files (rename), so changing the copy never changes ``src``. A
    symbolic link anywhere in ``src`` is refused (named relative to ``top``, in the output
    ``where``)."""
    top = src if top is None else top
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        rel = os.path.relpath(src, top)
        raise RunError(
            f"{where or top}: {rel} in the published version is a symbolic link; remove it "
            "and re-run (kpca never follows links)."
        )
    if stat.S_ISDIR(st.st_mode):
        os.makedirs(dst, exist_ok=True)
        for e in os.scandir(src):
            link_tree(Path(e.path), dst / e.name, top, where)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst, follow_symlinks=False)


def _copy_version(src: Location, dst: Location) -> None:
    """``dst`` as a copy of the version ``src`` (hard links on local disk, server-side
    copies on object stores); every writer replaces files (rename / new object), so the
    published version is never changed through the copy."""
    from kpca_dask.removal import MARKER_FILE

    if src.is_local:
        where = str(src.local_path.parent.parent)  # the output
        for e in sorted(os.scandir(src.local_path), key=lambda e: e.name):
            if e.name != MARKER_FILE:  # the new version has its own
                link_tree(Path(e.path), dst.local_path / e.name, src.local_path, where)
        return
    fs = src.fs
    s = src.fs_path.rstrip("/")
    d = dst.fs_path.rstrip("/")
    files = [f for f in fs.find(s) if str(f) != f"{s}/{MARKER_FILE}"]
    if files:
        fs.copy(files, [d + str(f)[len(s) :] for f in files])


class Transaction:
    """Publishing one new version of the output at ``root``; hold the output's lock
    (:class:`pipeline.output.lock.RunLock`) around it.

    :meth:`begin` records what is published now (rebuilding a lost or damaged pointer
    from the versions) and removes versions proven left by dead writers; :meth:`start`
    creates the new version's folder; :meth:`commit` replaces the pointer (guarded) and
    applies retention: expire beyond ``keep``, delete what expired more than ``grace``
    seconds ago and no hold names.
    """

    def __init__(
        self,
        root: Location,
        lock: Any = None,
        *,
        keep: int = DEFAULT_KEEP,
        grace: float | None = None,
    ):
        self.root = root
        self.lock = lock
        self.keep = max(1, int(keep))
        self.grace = DEFAULT_GRACE_SECONDS if grace is None else max(0.0, float(grace))
        self.base: dict | None = None  # the pointer when the lock was taken
        self.vid: str | None = None
        self.seeded = False
        self.started = False

    @property
    def location(self) -> Location:
        assert self.vid is not None
        return version_location(self.root, self.vid)

    def begin(self) -> str:
        """Record what is published now, choose the new version's id and remove the
        versions proven unpublished (left by writers that died: only ours, by their
        marker). A lost or damaged pointer is first rebuilt from the newest complete,
        verified version and written (one WARNING line). Creates no version: :meth:`start`
        does, once the writer is past its refusals."""
        pointer, problem = load_pointer(self.root)
        if pointer is None and self.root.child(VERSIONS).exists():
            rebuilt = rebuild_pointer(self.root)
            if rebuilt is not None:
                atomic_write_json(self.root.child(MANIFEST), rebuilt)
                logger.warning(
                    "recovery: the pointer %s was %s; rebuilt from the newest complete, "
                    "verified version %s (history: %d other complete versions)",
                    self.root.child(MANIFEST),
                    problem or "missing",
                    rebuilt["version"],
                    len(rebuilt["history"]),
                )
                pointer = rebuilt
            elif problem is not None:
                logger.warning(
                    "recovery: the pointer %s is %s and no version verifies; this writer "
                    "publishes over it",
                    self.root.child(MANIFEST),
                    problem,
                )
        self.base = pointer
        self._remove_dead_versions()
        self.vid = new_version_id()
        return self.vid

    def _remove_dead_versions(self) -> None:
        """Remove the versions no pointer names that are proven unpublished: no complete
        manifest of their own, and begun longer ago than a writer's lease (a writer that
        held the lock since would have renewed it). A complete one is never removed here
        (a lost pointer's versions; :meth:`commit` expires it), a young one is left to a
        later writer."""
        from .lock import LEASE_SECONDS

        named = named_ids(self.base)
        now = _now()
        for other in version_ids(self.root):
            if other in named or not _valid_id(other):
                continue
            if version_manifest(self.root, other) is not None:
                continue  # complete: expired by the commit, deleted after the grace period
            begun = id_time(other) or _marker_time(self.root, other)
            if begun is None or (now - begun).total_seconds() < LEASE_SECONDS:
                logger.info(
                    "publish: version %s of %s is unfinished but younger than a writer's "
                    "lease (%d s); left for a later writer",
                    other,
                    self.root,
                    LEASE_SECONDS,
                )
                continue
            if remove_version(self.root, other):
                logger.warning(
                    "publish: removed version %s of %s, left unpublished by a writer that "
                    "did not finish (no complete manifest, begun %s)",
                    other,
                    self.root,
                    _iso(begun),
                )

    def start(self, *, seed: bool = False) -> Location:
        """Create the new version's folder (once): marked as ours and -- ``seed`` -- a
        copy of the published version to start from (cached stages keep their
        artifacts)."""
        loc = self.location
        if self.started:
            return loc
        mark_folder(loc, VERSION_MARK)  # first: a version left half-made is ours to remove
        self.started = True
        if seed and self.base is not None and _valid_id(self.base.get("version")):
            src = version_location(self.root, self.base["version"])
            if src.exists():
                try:
                    _copy_version(src, loc)
                except BaseException:
                    self.discard()
                    raise
                self.seeded = True
        return loc

    def _check_still_ours(self) -> None:
        now, _ = load_pointer(self.root)
        if (now or {}).get("version") != (self.base or {}).get("version") or (now is None) != (
            self.base is None
        ):
            raise ConcurrentPublishError(
                f"output {self.root} was published by another writer while this one wrote "
                f"(now version {(now or {}).get('version')}); nothing was published by this "
                "one, the other's result stands."
            )
        if self.lock is not None and self.lock.holder is not None:
            from .lock import read_lock

            held = read_lock(self.root)
            if held is None or held.token != self.lock.holder.token:
                raise ConcurrentPublishError(
                    f"output {self.root}: this writer's lock was broken or taken by another "
                    "writer while it wrote; nothing was published by this one."
                )

    def unchanged(self) -> bool:
        """Whether the new version's manifest is the published one's (a seeded re-run
        whose every stage was cached): nothing to publish."""
        if not self.seeded or self.base is None:
            return False
        m = self.location.child(MANIFEST)
        try:
            return m.exists() and _canon(read_json(m)) == _canon(strip_pointer(self.base))
        except Exception:
            return False

    def commit(self, manifest: dict | None = None) -> dict:
        """Publish the new version: its manifest (written into the version now when given,
        else read from it) becomes the pointer. Then retention: the versions beyond
        ``keep`` (and complete versions no pointer named) are expired -- tagged in the
        pointer's history with the time, left on the store -- and those expired for longer
        than ``grace`` and named by no hold are deleted. Returns the pointer written."""
        loc = self.location
        if manifest is None:
            manifest = read_json(loc.child(MANIFEST))
        else:
            atomic_write_json(loc.child(MANIFEST), manifest)
        now = _now()
        kept: list[dict] = []
        if self.base is not None and _valid_id(self.base.get("version")):
            kept = [
                {"version": self.base["version"], "created": self.base.get("created")},
                *kept_entries(self.base),
            ]
        kept = [h for h in kept if h["version"] != self.vid]
        expired = [
            h
            for h in expired_entries(self.base)
            if h["version"] != self.vid and h["version"] not in {k["version"] for k in kept}
        ]
        for h in kept[self.keep - 1 :]:
            expired.append({**h, EXPIRED: _iso(now)})
        kept = kept[: self.keep - 1]
        on_store = set(version_ids(self.root))
        named = {self.vid} | {h["version"] for h in kept + expired}
        for other in sorted(on_store - named):
            m = version_manifest(self.root, other) if _valid_id(other) else None
            if m is not None:  # complete but named by no pointer: expired from now on
                created = m.get("created")
                expired.append({"version": other, "created": created, EXPIRED: _iso(now)})
        expired = [h for h in expired if h["version"] in on_store]
        due = [h for h in expired if self._due(h, now)]
        held = held_versions(self.root) if due else set()
        delete = [h for h in due if h["version"] not in held]
        gone = {h["version"] for h in delete}
        pointer = {
            **manifest,
            "version": self.vid,
            "version_path": f"{VERSIONS}/{self.vid}",
            "history": kept + [h for h in expired if h["version"] not in gone],
        }
        self._check_still_ours()
        atomic_write_json(self.root.child(MANIFEST), pointer)  # the commit
        logger.info("publish: version %s of %s published", self.vid, self.root)
        for h in delete:
            if remove_version(self.root, h["version"]):
                logger.info(
                    "retention: removed version %s of %s (expired at %s, more than %s ago)",
                    h["version"],
                    self.root,
                    h[EXPIRED],
                    _duration(self.grace),
                )
        for h in due:
            if h["version"] not in gone:
                logger.info(
                    "retention: version %s of %s is held (holds/); kept",
                    h["version"],
                    self.root,
                )
        return pointer

    def _due(self, entry: dict, now: datetime.datetime) -> bool:
        """Whether an expired entry has been expired for longer than the grace period (an
        unreadable time: never)."""
        t = _parse_time(entry.get(EXPIRED))
        return t is not None and (now - t).total_seconds() >= self.grace

    def discard(self) -> None:
        """Drop the new version (nothing to publish)."""
        if self.vid is not None and self.started:
            remove_version(self.root, self.vid)
            self.started = False
