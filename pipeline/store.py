"""Storage helpers: locations (local folders or fsspec URLs), zarr groups,
atomic JSON publishing, content fingerprints and checksums.

Everything here works on a local folder or any fsspec URL; for local folders
writes are atomic (temporary name beside the target, fsync, rename), which is
what lets a reader tell a finished artifact from a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import fsspec
import numpy as np
import zarr

from kpca_dask.removal import (
    MARKER_FILE,
    has_marker,
    placed_path,
    remove_owned,
    remove_owned_url,
    write_marker,
)

from .errors import InternalError, UserError
from .storage_clients import install as _install_client_closing
from .verify import checked_array
from .verify import chunk_digest as _chunk_digest

# asynchronous adlfs clients opened by zarr are closed at exit, before their finalizers
# fail with "Loop is not running" (pipeline/storage_clients.py)
_install_client_closing()

__all__ = [
    "Location",
    "atomic_write_json",
    "read_json",
    "fingerprint_arrays",
    "array_checksum",
    "json_default",
    "PathEscapeError",
    "MissingBucketError",
    "NotLocalError",
    "is_ours",
    "OUR_FILES",
    "zarr_attrs",
    "mark_folder",
]

#: files of ours inside a folder we marked (a run, a store)
OUR_FILES = ("manifest.json", "zarr.json", ".kpca-run.lock", MARKER_FILE)
#: folders a run writes at its top level: inside a run folder they are the run's, also
#: half-written (a folder of the user's under these names is refused before a run starts)
RUN_FOLDERS = (
    "report",
    "work",
    "embedding.parquet",
    "model",
    "embedding",
    "spectrum",
    "labels",
    "ids",
    "split",
    "denoised",
)
#: URL schemes of stores made of buckets (containers), which commands never create
BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl")
#: name prefixes of the temporary/retired entries we create beside what we publish
OUR_PREFIXES = (".kpca-new-", ".kpca-old-", ".kpca-prev", ".kpca-lock.")


def mark_folder(loc: Location, kind: str) -> None:
    """Create ``loc`` as a folder carrying our ownership marker (``_kpca-dask.json``)."""
    if loc.is_local:
        write_marker(loc.local_path, kind)
        return
    loc.makedirs()
    with loc.fs.open(f"{loc.fs_path.rstrip('/')}/{MARKER_FILE}", "w") as f:
        f.write(json.dumps({"written_by": "kpca-dask", "kind": kind}))


def zarr_attrs(folder: Path) -> dict | None:
    """The attributes in ``folder/zarr.json`` (a zarr v3 node), read without following
    links; None when there is no such regular file or it is not a zarr node."""
    try:
        fd = os.open(folder / "zarr.json", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd) as f:
            meta = json.load(f)
    except ValueError:
        return None
    if not isinstance(meta, dict) or "node_type" not in meta:
        return None
    attrs = meta.get("attributes") or {}
    return attrs if isinstance(attrs, dict) else {}


def _marked(p: Path) -> bool:
    """A folder we marked: our marker file, or a zarr node whose attributes say kpca-dask."""
    if has_marker(p):
        return True
    attrs = zarr_attrs(p)
    return attrs is not None and (
        attrs.get("format") == "kpca-dask-model"
        or str(attrs.get("kind", "")).startswith("kpca-dask")
    )


def _inside_marked(p: Path) -> bool:
    """Whether a folder above ``p`` is one we marked (a run, a store)."""
    return any(_marked(a) for a in p.parents if a != a.parent)


def _dask_parquet(p: Path) -> bool:
    """A Parquet folder as dask writes it: regular ``*.parquet`` files and ``_``/``.``
    metadata only (what runs before ownership markers wrote; accepted inside a run)."""
    try:
        entries = list(os.scandir(p))
    except OSError:
        return False
    return bool(entries) and all(
        e.is_file(follow_symlinks=False)
        and (e.name.endswith(".parquet") or e.name.startswith(("_", ".")))
        for e in entries
    )


def is_ours(p: Path) -> bool:
    """Whether kpca-dask wrote ``p`` (never a link): a folder we marked; a zarr node, a
    temporary entry of ours or a dask Parquet folder inside one; one of our own files
    (manifest, lock, zarr.json, marker) inside one."""
    p = placed_path(p)
    try:
        st = os.lstat(p)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):
        return False
    if stat.S_ISDIR(st.st_mode):
        if _marked(p):
            return True
        run_kind = (zarr_attrs(p.parent) or {}).get("kind")
        if p.name in RUN_FOLDERS and run_kind == "kpca-dask-run":
            return True
        return (
            zarr_attrs(p) is not None
            or p.name.startswith(OUR_PREFIXES)
            or (p.name.endswith(".parquet") and _dask_parquet(p))
        ) and _inside_marked(p)
    if stat.S_ISREG(st.st_mode):
        return (p.name in OUR_FILES or p.name.startswith(OUR_PREFIXES)) and (
            _marked(p.parent) or _inside_marked(p.parent)
        )
    return False


def _remote_is_ours(fs: Any, p: str, root: str) -> bool:
    def attrs(folder: str) -> dict | None:
        try:
            with fs.open(f"{folder}/zarr.json", "r") as f:
                meta = json.load(f)
        except Exception:
            return None
        return (meta.get("attributes") or {}) if isinstance(meta, dict) else None

    def marked(folder: str) -> bool:
        a = attrs(folder)
        return fs.exists(f"{folder}/{MARKER_FILE}") or (
            a is not None
            and (
                a.get("format") == "kpca-dask-model"
                or str(a.get("kind", "")).startswith("kpca-dask")
            )
        )

    def inside_marked(folder: str) -> bool:
        while folder and "/" in folder.strip("/"):  # up to the bucket
            if marked(folder):
                return True
            folder = posixpath.dirname(folder.rstrip("/"))
        return False

    name, parent = posixpath.basename(p), posixpath.dirname(p)
    if fs.isdir(p):
        return marked(p) or (
            (attrs(p) is not None or name.startswith(OUR_PREFIXES)) and inside_marked(parent)
        )
    return (name in OUR_FILES or name.startswith(OUR_PREFIXES)) and inside_marked(parent)


def missing_bucket_message(scheme: str, bucket: str) -> str:
    return (
        f"the bucket {scheme}://{bucket} does not exist (or these storage_options cannot "
        "see it); kpca-dask never creates buckets: create it, or fix the URL or the "
        "storage_options"
    )


class MissingBucketError(UserError, FileNotFoundError):
    """An object-store location's bucket does not exist (never created by a command)."""


class PathEscapeError(UserError, ValueError):
    """A relative store path would leave its root (``..``, absolute paths)."""


class NotLocalError(InternalError, ValueError):
    """``local_path`` asked of an object-store location: a bug (callers check
    ``is_local`` first)."""


@dataclass(frozen=True)
class Location:
    """A folder on local disk or an object-store prefix, addressed by URL or path."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def at(cls, url: Any, storage_options: dict[str, Any] | None = None) -> Location:
        """The location of ``url`` with ``storage_options`` applied to an object-store URL
        only (a local path takes none: fsspec's local filesystem refuses most of them)."""
        if isinstance(url, Location):
            return url
        url = str(url)
        remote = "://" in url and not url.startswith("file://")
        return cls(url, dict(storage_options or {}) if remote else {})

    @property
    def is_local(self) -> bool:
        return "://" not in self.url or self.url.startswith("file://")

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise NotLocalError(f"{self.url} is not a local path")
        # parents resolved, the last part kept: a link is seen as a link, never replaced
        # by (or removed as) what it points to
        return placed_path(self.url.removeprefix("file://"))

    def child(self, *parts: str) -> Location:
        """A location below this one; refuses ``..`` and absolute parts."""
        for p in parts:
            norm = posixpath.normpath(p)
            if p.startswith(("/", "\\")) or norm.startswith("..") or "://" in p:
                raise PathEscapeError(f"store path {p!r} escapes its root {self.url!r}")
        if self.is_local:
            return Location(str(self.local_path.joinpath(*parts)), self.storage_options)
        return Location(posixpath.join(self.url.rstrip("/"), *parts), self.storage_options)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        fs, _ = fsspec.core.url_to_fs(self.url, **self.storage_options)
        return fs

    @property
    def fs_path(self) -> str:
        _, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
        return path

    def exists(self) -> bool:
        if self.is_local:
            return self.local_path.exists()
        return self.fs.exists(self.fs_path)

    def refresh(self) -> None:
        """Forget what this process cached about this object and its folder's listing
        (other processes write, replace and remove it). adlfs answers ``info``/``open`` of
        an object from a cached listing of its parent, and invalidating the object alone
        leaves that listing: a lock written since it was taken read as missing, a replaced
        pointer read with its old size."""
        if self.is_local:
            return
        fs, path = self.fs, self.fs_path.rstrip("/")
        fs.invalidate_cache(path)
        parent = posixpath.dirname(path)
        if parent:
            fs.invalidate_cache(parent)

    @property
    def bucket(self) -> str | None:
        """The bucket (container) of an object-store location; None for a local one."""
        if self.is_local:
            return None
        return self.fs_path.strip("/").split("/", 1)[0] or None

    def require_bucket(self) -> None:
        """Refuse (one line naming it) an object-store location whose bucket does not
        exist: no command ever creates a bucket (fsspec's ``makedirs`` would)."""
        bucket = self.bucket
        scheme = self.url.split("://", 1)[0].lower()
        if bucket is None or scheme not in BUCKET_SCHEMES:
            return
        if not self.fs.exists(bucket):
            raise MissingBucketError(missing_bucket_message(scheme, bucket))

    def makedirs(self) -> None:
        if self.is_local:
            self.local_path.mkdir(parents=True, exist_ok=True)
        elif self.url.split("://", 1)[0].lower() in BUCKET_SCHEMES:
            # an object store has no folders: a prefix exists once an object is under it.
            # (fsspec's makedirs would create a missing bucket, which no command may do.)
            self.require_bucket()
        else:
            self.fs.makedirs(self.fs_path, exist_ok=True)

    def remove(
        self, *, root: Location | None = None, protect: tuple = (), owned: Any = None
    ) -> bool:
        """Remove this file/folder through the one deletion primitive
        (:func:`kpca_dask.removal.remove_owned`): only if kpca-dask wrote it
        (:func:`is_ours`, or the caller's ``owned`` check), only inside ``root`` (default:
        itself), never following links, never a ``protect``-ed path (the inputs)."""
        root = root or self
        if self.is_local:
            return remove_owned(
                self.local_path,
                root=root.local_path,
                owned=owned or is_ours,
                protect=[
                    Location(str(q)).local_path for q in protect if Location(str(q)).is_local
                ],
            )
        r = root.fs_path.rstrip("/")
        check = owned or (lambda p: _remote_is_ours(self.fs, p, r))
        return remove_owned_url(
            self.fs,
            self.fs_path,
            root=r,
            owned=check,
            protect=[str(q) for q in protect if "://" in str(q)],
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``url`` and ``storage_options``); :meth:`from_dict` inverts it."""
        return {"url": self.url, "storage_options": dict(self.storage_options)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Location:
        return cls(d["url"], dict(d.get("storage_options") or {}))

    def zarr_store(self) -> Any:
        """The string/store zarr accepts for this location."""
        return str(self.local_path) if self.is_local else self.url

    def zarr_source(self, *, writable: bool = False) -> Any:
        """What a reader or writer taking one store argument (``kpca_dask.load``,
        ``KernelPCA.save``) opens: the path or URL, or, for an object store with storage
        options, a zarr store carrying them (read-only unless ``writable``)."""
        if self.is_local or not self.storage_options:
            return self.zarr_store()
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(
            self.url, storage_options=dict(self.storage_options), read_only=not writable
        )

    def open_group(self, mode: str = "r") -> zarr.Group:
        kw = {} if self.is_local else {"storage_options": self.storage_options}
        return zarr.open_group(
            self.zarr_store(), mode=mode, zarr_format=3 if mode != "r" else None, **kw
        )

    def __str__(self) -> str:
        return self.url


def atomic_write_json(loc: Location, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never a part.

    Local: temporary file in the same folder, flush + fsync, ``os.replace``.
    Object stores: a single PUT, which is atomic per object there.
    """
    text = json.dumps(data, indent=2, sort_keys=True, default=json_default)
    if loc.is_local:
        path = loc.local_path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; publish like any file
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    else:
        with loc.fs.open(loc.fs_path, "w") as f:
            f.write(text)


def read_json(loc: Location) -> Any:
    if loc.is_local:
        return json.loads(loc.local_path.read_text())
    with loc.fs.open(loc.fs_path, "r") as f:
        return json.load(f)


def json_default(o: Any) -> Any:
    """``default`` for ``json.dumps``: numpy scalars and arrays, paths."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    # TypeError is json.dumps's protocol for "cannot encode": a bug of ours, never the user's
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _digest_blocks(arr: da.Array) -> da.Array:
    """One 16-byte digest per chunk, in chunk order (computed in parallel)."""
    chunks = tuple((1,) * len(c) for c in arr.chunks) + ((16,),)
    return arr.map_blocks(_chunk_digest, chunks=chunks, new_axis=arr.ndim, dtype=np.uint8)


def fingerprint_arrays(arrays: dict[str, da.Array], extra: Any = None) -> str:
    """Content fingerprint: BLAKE2b over per-chunk digests, names, shapes, dtypes.

    Depends on the values and their chunking, not on where they are stored.
    """
    names = sorted(arrays)
    digests = dask.compute(*[_digest_blocks(arrays[k]) for k in names])
    h = hashlib.blake2b(digest_size=20)
    for k, d in zip(names, digests):
        a = arrays[k]
        h.update(f"{k}:{a.shape}:{a.dtype.str}:{a.chunks}".encode())
        h.update(np.ascontiguousarray(d).tobytes())
    if extra is not None:
        h.update(json.dumps(extra, sort_keys=True, default=json_default).encode())
    return "blake2b:" + h.hexdigest()


def array_checksum(arr: zarr.Array | da.Array, *, fix: str = "") -> str:
    """SHA-256 over per-chunk digests of an array's values (order-stable).

    A zarr array is read chunk by chunk through :func:`pipeline.verify.checked_array`: a
    chunk that cannot be decoded is a CorruptObjectError naming it (``fix``: what the
    message tells the reader to do), a store failure a StoreError."""
    if isinstance(arr, da.Array):
        d = arr
    else:
        d = checked_array(arr, fix=fix)
    (digests,) = dask.compute(_digest_blocks(d))
    h = hashlib.sha256(f"{d.shape}:{d.dtype.str}".encode())
    h.update(np.ascontiguousarray(digests).tobytes())
    return "sha256:" + h.hexdigest()
