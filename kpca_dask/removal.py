"""The one way kpca-dask removes anything: :func:`remove_owned`.

Every place in kpca_dask, pipeline and flows that deletes or replaces a file
or folder calls this function (a test scans the code for any other
``rmtree``/``unlink``/``rm``). It removes a path only when

- the caller's ``owned`` check says this project created it (the caller knows
  its own markers: a model's ``format``, a run's ``kind``, a
  ``_kpca-dask.json`` file...); a symbolic link is never "ours" unless the
  check says so, and then only the link itself goes, never its target;
- it lies inside ``root`` (the output the caller owns) once its parent folders
  are resolved -- a link in the middle of the path that leads elsewhere is
  refused;
- it is none of: the empty path, ``.``, ``/``, the home folder, the current
  folder or one of its parents, a mount point, or a ``protect``-ed path (the
  caller's inputs), nor a folder that contains one of those;
- a folder to remove holds no symbolic link and no mount point anywhere
  below it (what a link points to is never ours to judge: refuse, let the
  user look).

Anything else raises :class:`~kpca_dask.exceptions.UnsafeRemovalError`, one
line naming the path and why. Only local paths are handled here; object-store
prefixes go through :func:`remove_owned_url` with the same ownership check.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .exceptions import UnsafeRemovalError

__all__ = [
    "MARKER_FILE",
    "remove_owned",
    "remove_owned_url",
    "removal_refusal",
    "placed_path",
    "write_marker",
    "has_marker",
]

#: the file a folder we write (Parquet datasets, transform outputs...) carries to say so;
#: the leading underscore keeps Parquet/Arrow readers from reading it as data
MARKER_FILE = "_kpca-dask.json"


def placed_path(path: Any) -> Path:
    """Absolute ``path`` with its parent folders resolved but the last part kept as is
    (so a symbolic link is seen as a link, not as what it points to)."""
    p = Path(os.path.abspath(os.fspath(path)))
    if p.parent == p:
        return p
    return Path(os.path.realpath(p.parent)) / p.name


def has_marker(folder: Any, kind: str | None = None) -> bool:
    """Whether ``folder`` (not a link) holds a regular ``_kpca-dask.json`` (of ``kind``)."""
    import json

    f = placed_path(folder)
    try:
        if stat.S_ISLNK(os.lstat(f).st_mode):
            return False
        fd = os.open(f / MARKER_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd) as fh:
        try:
            data = json.load(fh)
        except ValueError:
            return False
    return (
        isinstance(data, dict)
        and data.get("written_by") == "kpca-dask"
        and (kind is None or data.get("kind") == kind)
    )


def write_marker(folder: Any, kind: str, **extra: Any) -> None:
    """Mark ``folder`` (created if missing) as written by kpca-dask."""
    import json

    f = Path(os.fspath(folder))
    f.mkdir(parents=True, exist_ok=True)
    fd = os.open(f / MARKER_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump({"written_by": "kpca-dask", "kind": kind, **extra}, fh)


def _contains(parent: Path, child: Path) -> bool:
    return child == parent or parent in child.parents


def _guarded() -> list[tuple[Path, str]]:
    out = [(Path("/"), "the file system root")]
    home = os.path.expanduser("~")
    if home and home != "~":
        out.append((Path(os.path.realpath(home)), "your home folder"))
    try:
        cwd = Path(os.path.realpath(os.getcwd()))
    except OSError:
        cwd = None
    if cwd is not None:
        out.append((cwd, "the current folder"))
        out += [(p, "a parent of the current folder") for p in cwd.parents]
    return out


def removal_refusal(path: Any, *, root: Any, protect: Iterable[Any] = ()) -> str | None:
    """Why ``path`` must not be removed under ``root`` (None: nothing against it yet;
    ownership and the folder's contents are checked by :func:`remove_owned`)."""
    raw = os.fspath(path) if path is not None else ""
    if raw.strip() in ("", ".", "./", "/"):
        return "it is the empty path, '.' or '/'"
    p = placed_path(raw)
    real = Path(os.path.realpath(p))
    for g, what in _guarded():
        if p == g or real == g:
            return f"it is {what}"
    root_p = Path(os.path.realpath(os.fspath(root)))
    if not (_contains(root_p, p) or _contains(placed_path(root), p)):  # root may be a link
        return f"it is outside the output it belongs to ({root_p})"
    for q in protect:
        if q is None or os.fspath(q) in ("",):
            continue
        qp = Path(os.path.realpath(os.fspath(q)))
        if _contains(p, qp) or _contains(qp, p):
            return f"it is or holds an input of this command ({qp})"
        if not stat.S_ISLNK(_lstat_mode(p)) and (_contains(real, qp) or _contains(qp, real)):
            return f"it is or holds an input of this command ({qp})"
    if not stat.S_ISLNK(_lstat_mode(p)) and os.path.ismount(p):
        return "it is a mount point"
    return None


def _lstat_mode(p: Path) -> int:
    try:
        return os.lstat(p).st_mode
    except OSError:
        return 0


def _first_link_or_mount(top: Path) -> Path | None:
    """A symbolic link or mount point at or below the folder ``top`` (not following links)."""
    dev = os.lstat(top).st_dev
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return Path(e.path)
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != dev:
                    return Path(e.path)
                stack.append(Path(e.path))
    return None


def remove_owned(
    path: Any,
    *,
    root: Any,
    owned: Callable[[Path], bool],
    protect: Iterable[Any] = (),
    missing_ok: bool = True,
) -> bool:
    """Remove ``path`` (file, folder or link) if it is ours and safe to remove.

    Returns True when something was removed, False when nothing was there.
    Raises :class:`UnsafeRemovalError` (one line) otherwise; nothing is removed then.
    """
    why = removal_refusal(path, root=root, protect=protect)
    if why is not None:
        raise UnsafeRemovalError(
            f"kpca-dask will not remove {os.fspath(path) or repr('')}: "
            f"{why}; nothing was deleted."
        )
    p = placed_path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        if missing_ok:
            return False
        raise
    if not owned(p):
        kind = (
            "symbolic link"
            if stat.S_ISLNK(st.st_mode)
            else ("folder" if stat.S_ISDIR(st.st_mode) else "file")
        )
        raise UnsafeRemovalError(
            f"kpca-dask will not remove {p}: this {kind} was not written by kpca-dask (no "
            "marker of ours); move or delete it yourself, or choose another output."
        )
    if stat.S_ISDIR(st.st_mode):
        bad = _first_link_or_mount(p)
        if bad is not None:
            raise UnsafeRemovalError(
                f"kpca-dask will not remove {p}: it holds {bad}, a symbolic link or mount "
                "point (never followed or removed by kpca-dask); remove it yourself first."
            )
        # rmtree works on open folder descriptors and never follows links (Linux)
        shutil.rmtree(p)
    else:
        os.unlink(p)  # a link goes as a link: its target is never touched
    return True


def remove_owned_url(
    fs: Any, path: str, *, root: str, owned: Callable[[str], bool], protect: Iterable[str] = ()
) -> bool:
    """:func:`remove_owned` for an fsspec filesystem path (object-store prefix)."""
    p = posixpath.normpath(path.rstrip("/"))
    r = posixpath.normpath(root.rstrip("/"))
    if p in ("", ".", "/") or "/" not in p.strip("/"):
        raise UnsafeRemovalError(
            f"kpca-dask will not remove {path!r}: it is empty, a bucket "
            "or the store's root; nothing was deleted."
        )
    if not (p == r or p.startswith(r + "/")):
        raise UnsafeRemovalError(
            f"kpca-dask will not remove {path}: it is outside the output "
            f"it belongs to ({root}); nothing was deleted."
        )
    for q in protect:
        q = posixpath.normpath(q.rstrip("/"))
        if p == q or p.startswith(q + "/") or q.startswith(p + "/"):
            raise UnsafeRemovalError(
                f"kpca-dask will not remove {path}: it is or holds an "
                f"input of this command ({q}); nothing was deleted."
            )
    if not fs.exists(p):
        return False
    if not owned(p):
        raise UnsafeRemovalError(
            f"kpca-dask will not remove {path}: it was not written by kpca-dask (no marker of "
            "ours); move or delete it yourself, or choose another output."
        )
    fs.rm(p, recursive=True)
    return True
