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
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import RunCorruptError, RunError, RunIncompleteError, UserError
from .layout import MANIFEST
from .store import Location, atomic_write_json, mark_folder, read_json

__all__ = [
    "DEFAULT_KEEP",
    "POINTER_KEYS",
    "VERSIONS",
    "ConcurrentPublishError",
    "Published",
    "Transaction",
    "new_version_id",
    "open_output",
    "read_pointer",
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


class ConcurrentPublishError(UserError, RuntimeError):
    """Another writer published (or took the lock) while this one wrote: nothing was
    published by this one."""


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
    """The versions a pointer names: the published one first, then its history."""
    if not pointer or not _valid_id(pointer.get("version")):
        return []
    ids = [pointer["version"]]
    for h in pointer.get("history") or []:
        vid = h.get("version") if isinstance(h, dict) else None
        if _valid_id(vid) and vid not in ids:
            ids.append(vid)
    return ids


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
        """The published versions the output keeps, newest first (id and creation)."""
        if not self.pointer:
            return []
        cur = {"version": self.pointer.get("version"), "created": self.pointer.get("created")}
        return [cur, *[h for h in self.pointer.get("history") or [] if isinstance(h, dict)]]


def strip_pointer(pointer: dict) -> dict:
    return {k: v for k, v in pointer.items() if k not in POINTER_KEYS}


def resolve(
    root: Location | str, version: str | None = None, storage_options=None
) -> Published:
    """The version of the output at ``root`` a reader reads: the published one (or
    ``version``, which must be the published one or in the pointer's history).

    ``root`` may also be a version folder itself or an output written before versions
    (its manifest beside its arrays): both are read in place. Raises RunIncompleteError
    when nothing is published there. The manifest is returned as found (not verified:
    :func:`pipeline.export.verify_run` does that)."""
    root = root if isinstance(root, Location) else Location.at(str(root), storage_options)
    if not root.exists():
        raise RunIncompleteError(f"{root} does not exist; check the path of the run folder.")
    pointer = read_pointer(root)
    if pointer is None:
        raise RunIncompleteError(
            f"{root} has no manifest.json: the run did not finish (or is still running); "
            "it is not a result. Re-run the pipeline to complete it."
        )
    if "version" not in pointer:  # a version folder, or an output from before versions
        if version is not None:
            raise RunIncompleteError(
                f"{root} keeps no versions (it is a single result); read it without --version."
            )
        return Published(root, root, None, pointer, None)
    names = history_ids(pointer)
    vid = pointer["version"] if version is None else str(version)
    if vid not in names:
        kept = ", ".join(names) or "none"
        raise RunIncompleteError(
            f"{root} has no published version {vid!r} (kept: {kept}); pass one of those."
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
    return Published(root, loc, vid, manifest, pointer)


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
    (:class:`pipeline.lock.RunLock`) around it.

    :meth:`begin` records what is published now and removes versions left by dead
    writers; :meth:`start` creates the new version's folder; :meth:`commit` replaces
    the pointer (guarded) and applies retention.
    """

    def __init__(self, root: Location, lock: Any = None, *, keep: int = DEFAULT_KEEP):
        self.root = root
        self.lock = lock
        self.keep = max(1, int(keep))
        self.base: dict | None = None  # the pointer when the lock was taken
        self.vid: str | None = None
        self.seeded = False
        self.started = False

    @property
    def location(self) -> Location:
        assert self.vid is not None
        return version_location(self.root, self.vid)

    def begin(self) -> str:
        """Record what is published now, choose the new version's id and remove every
        unpublished version (left by writers that died: only ours, by their marker).
        Creates nothing: :meth:`start` does, once the writer is past its refusals."""
        self.base = read_pointer(self.root)
        keep = set(history_ids(self.base))
        for other in version_ids(self.root):
            if other not in keep and remove_version(self.root, other):
                logger.warning(
                    "publish: removed version %s of %s, left unpublished by a writer that "
                    "did not finish",
                    other,
                    self.root,
                )
        self.vid = new_version_id()
        return self.vid

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
        now = read_pointer(self.root)
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
        else read from it) becomes the pointer. Returns the pointer written."""
        loc = self.location
        if manifest is None:
            manifest = read_json(loc.child(MANIFEST))
        else:
            atomic_write_json(loc.child(MANIFEST), manifest)
        history: list[dict] = []
        if self.base is not None and _valid_id(self.base.get("version")):
            history = [
                {"version": self.base["version"], "created": self.base.get("created")},
                *[h for h in self.base.get("history") or [] if isinstance(h, dict)],
            ]
        history = [h for h in history if h.get("version") != self.vid][: self.keep - 1]
        pointer = {
            **manifest,
            "version": self.vid,
            "version_path": f"{VERSIONS}/{self.vid}",
            "history": history,
        }
        self._check_still_ours()
        atomic_write_json(self.root.child(MANIFEST), pointer)  # the commit
        logger.info("publish: version %s of %s published", self.vid, self.root)
        named = set(history_ids(pointer))
        for other in version_ids(self.root):
            if other not in named:
                remove_version(self.root, other)
        return pointer

    def discard(self) -> None:
        """Drop the new version (nothing to publish)."""
        if self.vid is not None and self.started:
            remove_version(self.root, self.vid)
            self.started = False
