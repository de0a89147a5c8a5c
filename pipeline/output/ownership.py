"""Which files and folders are ours to replace or remove: the marker a writer leaves
in a folder it created, the names a run writes, and the rules that decide, for a local
path or an object-store key, whether it belongs to kpca-dask (pipeline/output/store.py's
``Location.remove`` applies them through kpca_dask's deletion primitive)."""

from __future__ import annotations

import json
import os
import posixpath
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kpca_dask.removal import MARKER_FILE, has_marker, placed_path, write_marker

if TYPE_CHECKING:
    from .store import Location

__all__ = ["OUR_FILES", "OUR_PREFIXES", "RUN_FOLDERS", "is_ours", "mark_folder", "zarr_attrs"]

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
