"""Storage helpers: locations (local folders or fsspec URLs), zarr groups,
atomic JSON publishing and content fingerprints.

What is ours to replace or remove is decided in pipeline/output/ownership.py, array checksums
in pipeline/output/checksums.py; their names are importable from here as before.

Everything here works on a local folder or any fsspec URL; for local folders
writes are atomic (temporary name beside the target, fsync, rename), which is
what lets a reader tell a finished artifact from a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
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
    placed_path,
    remove_owned,
    remove_owned_url,
)
from pipeline.errors import InternalError, UserError

from .checksums import array_checksum, digest_blocks
from .ownership import (
    OUR_FILES,
    OUR_PREFIXES,
    RUN_FOLDERS,
    _remote_is_ours,
    is_ours,
    mark_folder,
    zarr_attrs,
)
from .storage_clients import install as _install_client_closing

# asynchronous adlfs clients opened by zarr are closed at exit, before their finalizers
# fail with "Loop is not running" (pipeline/output/storage_clients.py)
_install_client_closing()

#: the name pipeline/output/verify.py's docstrings use for
#: :func:`pipeline.output.checksums.digest_blocks`
_digest_blocks = digest_blocks

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
    "OUR_PREFIXES",
    "RUN_FOLDERS",
    "zarr_attrs",
    "mark_folder",
]

#: URL schemes of stores made of buckets (containers), which commands never create
BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl")


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


def fingerprint_arrays(arrays: dict[str, da.Array], extra: Any = None) -> str:
    """Content fingerprint: BLAKE2b over per-chunk digests, names, shapes, dtypes.

    Depends on the values and their chunking, not on where they are stored.
    """
    names = sorted(arrays)
    digests = dask.compute(*[digest_blocks(arrays[k]) for k in names])
    h = hashlib.blake2b(digest_size=20)
    for k, d in zip(names, digests):
        a = arrays[k]
        h.update(f"{k}:{a.shape}:{a.dtype.str}:{a.chunks}".encode())
        h.update(np.ascontiguousarray(d).tobytes())
    if extra is not None:
        h.update(json.dumps(extra, sort_keys=True, default=json_default).encode())
    return "blake2b:" + h.hexdigest()
