"""The object-store writes of the run lock (pipeline/output/lock.py): create an object only if
it does not exist, and replace it only if it is still the version this process wrote.

Each store's own conditional write does it atomically: S3 ``If-None-Match: *`` /
``If-Match``, GCS ``ifGenerationMatch``, Azure ``overwrite=False`` / ``If-Match``.
"""

from __future__ import annotations

from .store import Location

__all__ = ["create_object"]


def _protocols(fs) -> set[str]:
    return set(fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))


def create_object(loc: Location, data: bytes) -> bool:
    """Write the object ``loc`` only if it does not exist, atomically where the store can:
    S3 ``If-None-Match: *`` and GCS ``ifGenerationMatch=0`` (fsspec ``mode="create"``),
    Azure ``overwrite=False``. Returns False when the object exists already."""
    fs, path = loc.fs, loc.fs_path
    protocols = _protocols(fs)
    try:
        if {"s3", "s3a", "gs", "gcs"} & protocols:
            fs.pipe_file(path, data, mode="create")
        elif {"abfs", "az", "abfss"} & protocols:
            fs.pipe_file(path, data, overwrite=False)
        else:  # no conditional write known for this store: check, then write
            if fs.exists(path):
                return False
            fs.pipe_file(path, data)
    except FileExistsError:
        return False
    except Exception:
        loc.refresh()
        if fs.exists(path):  # the store's own "precondition failed" / "already exists"
            return False
        raise
    loc.refresh()
    return True


def _object_version(loc: Location) -> str:
    """The store's version of the object ``loc`` (S3/Azure ETag, GCS generation)."""
    loc.refresh()
    info = loc.fs.info(loc.fs_path)
    for key in ("generation", "ETag", "etag"):
        if info.get(key):
            return str(info[key])
    return ""


def _replace_object(loc: Location, data: bytes, version: str) -> bool:
    """Overwrite the object ``loc`` only if it is still the version ``version`` (the
    one this process last wrote); False when another writer replaced or removed it.

    The version is checked first (a server that ignores preconditions -- the GCS
    emulator, some S3-compatible stores -- is still never written over after another
    writer's lock is seen), then written by :func:`_conditional_put`, which the store
    refuses if the object changed in between."""
    try:
        if _object_version(loc) != version:
            return False
    except FileNotFoundError:
        return False
    return _conditional_put(loc, data, version)


def _conditional_put(loc: Location, data: bytes, version: str) -> bool:
    """Write ``data`` to ``loc`` only if the object is the version ``version``: S3
    ``If-Match``, GCS ``ifGenerationMatch``, Azure ``If-Match``; elsewhere (no such write
    known) a check of the version, then a write. False when the store refused it."""
    fs, path = loc.fs, loc.fs_path
    protocols = _protocols(fs)
    try:
        if {"s3", "s3a"} & protocols:
            fs.pipe_file(path, data, IfMatch=version)
        elif {"gs", "gcs"} & protocols:
            from urllib.parse import quote

            bucket, key, _ = fs.split_path(path)
            fs.call(
                "POST",
                f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
                uploadType="media",
                name=key,
                ifGenerationMatch=version,
                headers={"Content-Type": "application/octet-stream"},
                data=data,
                json_out=True,
            )
        elif {"abfs", "az", "abfss"} & protocols:
            from azure.core import MatchConditions

            fs.pipe_file(
                path,
                data,
                overwrite=True,
                etag=version,
                match_condition=MatchConditions.IfNotModified,
            )
        else:
            if _object_version(loc) != version:
                return False
            fs.pipe_file(path, data)
    except Exception:
        try:
            now = _object_version(loc)
        except FileNotFoundError:
            return False  # removed: broken by another writer
        if now != version:  # the store's "precondition failed": replaced by another
            return False
        raise  # the object is as it was: the write failed (retried at the next renewal)
    loc.refresh()
    return True
