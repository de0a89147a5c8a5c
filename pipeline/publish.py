"""What a run may touch in its output folder, and publishing as a transaction.

Before a run takes the output's lock, :func:`check_output_folder` refuses an
output folder that holds files of the user's under the names a run writes
(``model/``, ``embedding.parquet/``, ``manifest.json``...) or symbolic links
under those names: a run never replaces what it did not write. Other files in
the folder are left alone.

A run replaces a published run as a transaction. When a complete run is
un-published (its manifest removed before the first write, ``begin_run``),
:func:`snapshot_published` first keeps it in ``<out>/.kpca-prev/`` -- hard
links to its files, so it costs no copy, and every writer of a run replaces
files by rename (zarr's local store, ``atomic_write_json``, ``save_model``),
which leaves the linked old files intact. The new run is written and its
manifest published; then :func:`retire_previous` removes the kept run. If the
run fails or is refused instead, :func:`restore_previous` moves the kept run
back, manifest last, and the previous result verifies again as before. A run
killed outright leaves the kept run in ``.kpca-prev``; the next run of the
same output restores or retires it the same way.

Only local outputs are snapshotted; on object stores a failed run leaves the
output un-published (as before), and the message says so.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from pathlib import Path

from kpca_dask.removal import MARKER_FILE, has_marker, write_marker

from .errors import UserError
from .layout import MANIFEST, PREV, RUN_NAMES
from .store import Location, _marked, read_json

__all__ = [
    "RUN_NAMES",
    "PREV",
    "check_output_folder",
    "check_not_overlapping",
    "snapshot_published",
    "restore_previous",
    "retire_previous",
]

logger = logging.getLogger("pipeline")

# RUN_NAMES: top-level names a run writes (and may replace) in its output folder;
# PREV: where the previous published run is kept while a new one is written


def _run_error(msg: str) -> Exception:
    from .errors import RunError

    return RunError(msg)


def check_output_folder(out: Location, extra_names: tuple[str, ...] = ()) -> None:
    """Refuse (RunError, one line) an output folder where a run would replace what is not
    its own: under a name a run writes, a symbolic link, or -- in a folder that is not a
    kpca-dask run -- anything at all."""
    if not out.is_local:
        return
    p = out.local_path
    if not os.path.lexists(p):
        return
    if stat.S_ISLNK(os.lstat(p).st_mode):
        raise _run_error(
            f"output path {p} is a symbolic link (kpca never writes through "
            f"links); set output.path to the real folder, {os.path.realpath(p)}."
        )
    if not p.is_dir():
        raise _run_error(
            f"output path {p} is a file, not a folder; choose another output.path."
        )
    names = RUN_NAMES | set(extra_names)
    ours = zarr_kind(p) == "kpca-dask-run"
    for e in sorted(os.scandir(p), key=lambda e: e.name):
        if e.name not in names and not e.name.startswith(".kpca-"):
            continue  # the user's own file beside the run: never touched
        if e.is_symlink():
            raise _run_error(
                f"output {p} holds {e.name}, a symbolic link: kpca never writes through or "
                "removes links; remove the link or choose another output.path."
            )
        if not ours and not e.name.startswith(".kpca-"):  # the lock: judged by its content
            raise _run_error(
                f"output {p} is not a kpca-dask run folder but holds {e.name!r}, which a run "
                "would replace; choose an empty or new output.path (your files are left as "
                "they are)."
            )


def _local_input(path: str) -> Path | None:
    if "://" in path and not path.startswith("file://"):
        return None
    path = path.removeprefix("file://")
    for i, ch in enumerate(path):  # a glob: the folder before the first wildcard
        if ch in "*?[":
            path = os.path.dirname(path[:i]) or "."
            break
    return Path(os.path.realpath(path))


def check_not_overlapping(out: Location, inputs: list, what: str = "output.path") -> None:
    """Refuse an output that is, holds or lies inside one of the inputs (paths, or
    ``(path, "the model's run")`` pairs naming what they are)."""
    named = [q if isinstance(q, tuple) else (str(q), "the input") for q in inputs]
    for q, label in named:
        if out.is_local:
            o = Path(os.path.realpath(out.local_path))
            qp = _local_input(q)
            hit = qp is not None and (o == qp or qp in o.parents or o in qp.parents)
        else:
            a, b = out.url.rstrip("/"), q.rstrip("/")
            hit = a == b or a.startswith(b + "/") or b.startswith(a + "/")
        if hit:
            raise _run_error(
                f"{what} {out} is, holds or lies inside {label} {q}; write the "
                f"output somewhere else ({label} is never overwritten)."
            )


def _complete(manifest: Path) -> bool:
    try:
        return read_json(Location(str(manifest))).get("status") == "complete"
    except Exception:
        return False


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` as a copy of ``src`` made of hard links (a copy where linking fails)."""
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        raise _run_error(
            f"{src} is a symbolic link inside the published run; remove it and "
            "re-run (kpca never follows links)."
        )
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(dst)
        for e in os.scandir(src):
            _link_tree(Path(e.path), dst / e.name)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst, follow_symlinks=False)


def snapshot_published(out: Location) -> bool:
    """Keep the complete run published at ``out`` in ``out/.kpca-prev`` (hard links) before
    it is un-published. Returns whether a snapshot was made."""
    if not out.is_local:
        return False
    p = out.local_path
    if not _complete(p / MANIFEST):
        return False
    snap = p / PREV
    if os.path.lexists(snap):
        Location(str(snap)).remove(root=out)
    write_marker(snap, "previous-run")
    try:
        for e in sorted(os.scandir(p), key=lambda e: e.name):
            if e.name in (MANIFEST, "work") or e.name.startswith(".kpca-"):
                continue
            if e.name not in RUN_NAMES and (
                e.is_symlink()
                or not (_marked(Path(e.path)) or os.path.isfile(Path(e.path, "zarr.json")))
            ):
                continue  # a user's file (or link) beside the run: not part of it
            _link_tree(Path(e.path), snap / e.name)
        _link_tree(p / MANIFEST, snap / MANIFEST)  # last: a snapshot without it is not one
    except BaseException:
        Location(str(snap)).remove(root=out)
        raise
    logger.info(
        "publish: the previous run of %s is kept in %s until the new one is published", p, PREV
    )
    return True


def restore_previous(out: Location) -> bool:
    """Put the kept previous run back (after a failed or refused run). Returns whether it
    was restored."""
    if not out.is_local:
        return False
    p = out.local_path
    snap = p / PREV
    if not has_marker(snap, "previous-run") or not _complete(snap / MANIFEST):
        return False
    if _complete(p / MANIFEST):
        return False  # the output is published (this run, or nothing was un-published)
    for e in sorted(os.scandir(snap), key=lambda e: e.name):
        if e.name in (MARKER_FILE, MANIFEST):
            continue
        target = p / e.name
        try:
            if os.path.lexists(target):
                Location(str(target)).remove(root=out)
            os.rename(e.path, target)
        except OSError as exc:  # refused (not ours) or failed: leave the kept run where it is
            logger.warning(
                "publish: the run failed and the previous run could not be put "
                "back (%s); it is kept in %s",
                exc,
                snap,
            )
            return False
    os.rename(snap / MANIFEST, p / MANIFEST)  # the commit: the previous run is published again
    Location(str(snap)).remove(root=out)
    logger.warning("publish: the run failed; the previous run at %s is published again", p)
    return True


def retire_previous(out: Location) -> bool:
    """Remove the kept previous run once the new one is published."""
    if not out.is_local:
        return False
    p = out.local_path
    snap = p / PREV
    if not os.path.lexists(snap) or not _complete(p / MANIFEST):
        return False
    return Location(str(snap)).remove(root=out)


# ----------------------------------------------------------------- transform outputs
TRANSFORM_KINDS = ("kpca-dask-transform", "kpca-dask-denoised")


class TransformOutputError(UserError, ValueError):
    """A transform's output path is unsafe or not ours to replace; the message says why."""


def _model_root(model_path: str) -> str:
    """The folder a transform's model lives in: its run folder when it is a run (or a run's
    ``model/``), else the model folder itself."""
    loc = Location(model_path)
    if loc.is_local:
        p = loc.local_path
        if (
            p.name == "model"
            and _marked(p.parent)
            and (zarr_kind(p.parent) or "").startswith("kpca-dask-run")
        ):
            return str(p.parent)
        return str(p)
    url = model_path.rstrip("/")
    return url.rsplit("/", 1)[0] if url.endswith("/model") else url


def zarr_kind(p: Path) -> str | None:
    from .store import zarr_attrs

    a = zarr_attrs(p)
    return None if a is None else a.get("kind")


def _is_transform_output(p: Path) -> bool:
    """A transform/denoise output we wrote: a zarr group of that kind, or a Parquet folder
    with our marker (not a link)."""
    if os.path.islink(p):
        return False
    return zarr_kind(p) in TRANSFORM_KINDS or has_marker(p, "parquet")


def check_transform_output(
    output: str,
    *,
    model_path: str,
    inputs: list[str],
    overwrite: bool,
    storage_options: dict | None = None,
) -> Location:
    """The output of ``kpca transform`` once it is known safe: refuses ``""``/``.``, the
    current or home folder, the input, a run folder or anything inside the model's run,
    a link, and an existing path that is not a transform output of ours (even with
    ``overwrite``); an existing output of ours needs ``overwrite``."""
    from kpca_dask.removal import removal_refusal

    raw = "" if output is None else str(output)
    if raw.strip() in ("", ".", "./") or raw.rstrip("/") in ("", ".", ".."):
        raise TransformOutputError(
            f"output path {raw!r} names no new folder (empty or '.'); give the output a "
            "name of its own, e.g. embedding.zarr."
        )
    out = Location.at(raw, storage_options)
    try:
        check_not_overlapping(
            out,
            [(_model_root(model_path), "the model's run or folder"), *inputs],
            what="output",
        )
    except ValueError as exc:
        raise TransformOutputError(str(exc)) from None
    if not out.is_local:
        return out
    p = out.local_path
    if os.path.islink(p):
        raise TransformOutputError(
            f"output {raw} is a symbolic link; kpca never writes "
            "through or replaces links; choose another output path."
        )
    why = removal_refusal(p, root=p)
    if why is not None:
        raise TransformOutputError(
            f"output {raw} cannot be written: {why}; choose a new path for the output."
        )
    if os.path.lexists(p):
        if _marked(p) and zarr_kind(p) == "kpca-dask-run" or (p / MANIFEST).exists():
            raise TransformOutputError(
                f"output {raw} is a kpca run folder; write the transform output somewhere else."
            )
        if not _is_transform_output(p):
            raise TransformOutputError(
                f"output {raw} exists and was not written by kpca transform; it is left as "
                "it is: choose another output path."
            )
        if not overwrite:
            raise FileExistsError(f"{raw} exists; pass --overwrite to replace it.")
    return out


class OutputLock:
    """``.kpca-lock.<name>`` beside a transform output: one writer at a time (flock)."""

    def __init__(self, out: Location):
        self.out = out
        self.path = (
            out.local_path.parent / f".kpca-lock.{out.local_path.name}"
            if out.is_local
            else None
        )
        self._fd: int | None = None
        self._token = ""
        self._created: list[Location] = []  # parent folders created for the output

    def __enter__(self) -> OutputLock:
        if self.path is None:
            return self
        import fcntl
        import json
        import uuid

        from .lock import OutputLockedError
        from .visibility import missing_folders

        # missing parents are created, as `kpca run` creates its output's; a transform
        # that fails removes exactly those again (when they are still empty)
        parent = Location(str(self.path.parent))
        self._created = missing_folders(parent)
        if self._created:
            parent.makedirs()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise TransformOutputError(
                    f"{self.path} is a symbolic link; remove it (kpca "
                    "never writes through links)."
                ) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # the holder before us may have removed the file between our open and flock
            if os.fstat(fd).st_ino != os.lstat(self.path).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            raise OutputLockedError(
                f"output {self.out} is being written by another transform (lock "
                f"{self.path.name}); wait for it to finish or choose another output."
            ) from None
        self._token = uuid.uuid4().hex
        data = json.dumps(
            {"written_by": "kpca-dask", "pid": os.getpid(), "token": self._token}
        ).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        self._fd = fd
        return self

    def _ours(self, p: Path) -> bool:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        with os.fdopen(fd) as f:
            return self._token in f.read(4096)

    def __exit__(self, exc_type, *exc) -> None:
        if self._fd is None:
            self._remove_created(exc_type)
            return
        try:
            Location(str(self.path)).remove(root=Location(str(self.path)), owned=self._ours)
        finally:
            os.close(self._fd)  # releases the flock
            self._fd = None
            self._remove_created(exc_type)

    def _remove_created(self, exc_type) -> None:
        if exc_type is not None and self._created:
            from .visibility import remove_created

            remove_created(self._created)
        self._created = []


def publish_beside(out: Location, write, verify, protect: tuple = ()) -> None:
    """Write a transform output beside ``out`` (``.kpca-new-<token>.<name>``), check it,
    swap it in, then retire the old one: a failure leaves ``out`` as it was.

    ``write(tmp: Location)`` writes the new output; ``verify(tmp)`` raises if it is not
    complete. Object stores have no rename: there the old output (ours, checked) is
    removed first and the new one written in place. ``protect``: the command's inputs
    (and model), never removed whatever happens.
    """
    import uuid

    if not out.is_local:
        out.remove(root=out, protect=protect) if out.exists() else None
        write(out)
        verify(out)
        return
    p = out.local_path
    token = uuid.uuid4().hex[:12]
    tmp = p.parent / f".kpca-new-{token}.{p.name}"
    old = p.parent / f".kpca-old-{token}.{p.name}"
    tmp_loc = Location(str(tmp))

    def by_name(name):
        return lambda q: q.name == name

    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(tmp_loc)
        verify(tmp_loc)
        if os.path.lexists(p):
            if not _is_transform_output(p):  # changed since it was checked
                raise TransformOutputError(
                    f"output {p} was replaced meanwhile by something "
                    "kpca did not write; it is left as it is."
                )
            os.rename(p, old)
        os.rename(tmp, p)
    except BaseException:
        if os.path.lexists(tmp):
            Location(str(tmp)).remove(
                root=Location(str(tmp)), owned=by_name(tmp.name), protect=protect
            )
        if os.path.lexists(old) and not os.path.lexists(p):
            os.rename(old, p)
        raise
    if os.path.lexists(old):
        Location(str(old)).remove(
            root=Location(str(old)), owned=by_name(old.name), protect=protect
        )
