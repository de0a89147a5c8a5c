"""What a writer may touch in its output folder, and publishing a transform's output.

Before a run takes the output's lock, :func:`check_output_folder` refuses an
output folder that holds files of the user's under the names a run writes
(``versions/``, ``work/``, ``manifest.json``...) or symbolic links under those
names: a run never replaces what it did not write. Other files in the folder are
left alone.

Publishing itself is a transaction on every store (pipeline/output/versions.py): a
writer writes a new version under ``<out>/versions/<id>/`` and publishes it by
replacing the pointer ``<out>/manifest.json`` in one atomic write; a failed or
killed writer leaves the published result as it was. :func:`publish_output` is
that transaction for ``kpca transform`` and ``kpca transform --inverse``
outputs, under the same lock as a run (pipeline/output/lock.py).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from kpca_dask.removal import has_marker
from pipeline.errors import RunError, UserError

from .layout import RUN_NAMES
from .ownership import _marked
from .store import Location

__all__ = [
    "OUTPUT_MARK",
    "RUN_NAMES",
    "TRANSFORM_KINDS",
    "TransformOutputError",
    "TransformOutputExistsError",
    "check_not_overlapping",
    "check_output_folder",
    "check_transform_output",
    "publish_output",
]

logger = logging.getLogger("pipeline")

#: the marker kind of an output root a writer of ours created (pipeline/output/versions.py)
OUTPUT_MARK = "output"
# RUN_NAMES: top-level names a run writes (and may replace) in its output folder


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
        raise RunError(
            f"output path {p} is a symbolic link (kpca never writes through "
            f"links); set output.path to the real folder, {os.path.realpath(p)}."
        )
    if not p.is_dir():
        raise RunError(f"output path {p} is a file, not a folder; choose another output.path.")
    names = RUN_NAMES | set(extra_names)
    # a transform's output (its pointer says so) is not a run's to replace
    not_a_run = TRANSFORM_KINDS
    ours = zarr_kind(p) == "kpca-dask-run" or (
        has_marker(p, OUTPUT_MARK) and _pointer_kind(out) not in not_a_run
    )
    for e in sorted(os.scandir(p), key=lambda e: e.name):
        if e.name not in names and not e.name.startswith(".kpca-"):
            continue  # the user's own file beside the run: never touched
        if e.is_symlink():
            raise RunError(
                f"output {p} holds {e.name}, a symbolic link: kpca never writes through or "
                "removes links; remove the link or choose another output.path."
            )
        if not ours and not e.name.startswith(".kpca-"):  # the lock: judged by its content
            raise RunError(
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
            raise RunError(
                f"{what} {out} is, holds or lies inside {label} {q}; write the "
                f"output somewhere else ({label} is never overwritten)."
            )


# ----------------------------------------------------------------- transform outputs
TRANSFORM_KINDS = ("kpca-dask-transform", "kpca-dask-denoised")


class TransformOutputError(UserError, ValueError):
    """A transform's output path is unsafe or not ours to replace; the message says why."""


class TransformOutputExistsError(TransformOutputError, FileExistsError):
    """A transform's output is already there and --overwrite was not given."""


def _model_root(model_path: str) -> str:
    """The folder a transform's model lives in: its run folder when it is a run (or a run's
    ``model/``), else the model folder itself."""
    loc = Location(model_path)
    parts = (str(loc.local_path) if loc.is_local else model_path).rstrip("/").split("/")
    if len(parts) >= 4 and parts[-1] == "model" and parts[-3] == "versions":
        return "/".join(parts[:-3])  # a published version's model: its whole output
    if len(parts) >= 3 and parts[-2] == "versions":
        return "/".join(parts[:-2])  # a version folder: its whole output
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


def _is_legacy_transform_output(p: Path) -> bool:
    """A transform/denoise output written before versions: a zarr group of that kind, or
    a Parquet folder with our marker (not a link)."""
    if os.path.islink(p):
        return False
    return zarr_kind(p) in TRANSFORM_KINDS or has_marker(p, "parquet")


def _pointer_kind(out: Location) -> str | None:
    """The kind of output the pointer at ``out`` publishes (None: no pointer). A damaged
    pointer is judged by the pointer its versions rebuild (pipeline/output/versions.py,
    recovery): a transform output whose pointer was cut short is still the transform's to
    replace; "unreadable" when nothing verifies."""
    from .versions import VERSIONS, load_pointer, rebuild_pointer

    try:
        pointer, problem = load_pointer(out)
        if pointer is None and problem is not None:
            pointer = rebuild_pointer(out) if out.child(VERSIONS).exists() else None
            if pointer is None:
                return "unreadable"
    except Exception:  # noqa: BLE001 - a damaged pointer: not a transform output we know
        return "unreadable"
    return None if pointer is None else str(pointer.get("kind") or "kpca-dask-run")


def _is_empty(out: Location) -> bool:
    try:
        return not out.fs.ls(out.fs_path, detail=False)
    except FileNotFoundError:
        return True


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
    ``overwrite``); an existing output of ours needs ``overwrite``. The same rules on
    every store."""
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
    except RunError as exc:
        raise TransformOutputError(str(exc)) from None
    if out.is_local:
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
        if os.path.lexists(p) and not p.is_dir():
            raise TransformOutputError(
                f"output {raw} is a file that was not written by kpca transform; it is left as "
                "it is: choose another output path."
            )
    if not out.exists() or _is_empty(out):
        return out
    kind = _pointer_kind(out)
    if kind in TRANSFORM_KINDS:
        if not overwrite:
            raise TransformOutputExistsError(f"{raw} exists; pass --overwrite to replace it.")
        return out
    if (
        kind is not None
        and kind.startswith("kpca-dask-run")
        or (
            out.is_local
            and _marked(out.local_path)
            and zarr_kind(out.local_path) == "kpca-dask-run"
        )
    ):
        raise TransformOutputError(
            f"output {raw} is a kpca run folder; write the transform output somewhere else."
        )
    if out.is_local and _is_legacy_transform_output(out.local_path):
        raise TransformOutputError(
            f"output {raw} was written by an earlier kpca-dask (without versions); it is "
            "left as it is: remove it yourself or choose another output path."
        )
    if kind is None and _only_lock_or_versions(out):
        # a first transform that died before publishing: ours, nothing published yet
        return out
    raise TransformOutputError(
        f"output {raw} exists and was not written by kpca transform; it is left as "
        "it is: choose another output path."
    )


def _only_lock_or_versions(out: Location) -> bool:
    """An output folder holding only what a transform writes before it publishes."""
    from kpca_dask.removal import MARKER_FILE
    from pipeline.runtime import PROBE_PREFIX

    from .layout import LOCK, MANIFEST
    from .versions import VERSIONS

    ours = {LOCK, VERSIONS, MARKER_FILE}
    names = {
        str(n).rstrip("/").rpartition("/")[2] for n in out.fs.ls(out.fs_path, detail=False)
    }
    # another transform of this output may be under way at this very moment: its
    # visibility probe's files (".kpca-probe-<time>-<random>.<who>", removed by the probe)
    # and, on local disk, the ".<name>.<random>.tmp" of an atomic write of its pointer or
    # marker lie there for an instant. A second transform started together saw them as "not
    # written by kpca transform" (CI, 3 runs in 6 here); it goes on to the lock, which
    # refuses it as a running job.
    atomic = tuple(f".{n}." for n in (MANIFEST, MARKER_FILE, LOCK))
    names = {
        n
        for n in names
        if not n.startswith(PROBE_PREFIX) and not (n.startswith(atomic) and n.endswith(".tmp"))
    }
    return names <= ours


def publish_output(
    output: str,
    *,
    write: Any,
    verify: Any,
    record: dict,
    recheck: Any,
    storage_options: dict | None = None,
    keep: int | None = None,
    grace: float | None = None,
) -> dict:
    """Write a transform/denoise output as a new version and publish it (one atomic write
    of ``<out>/manifest.json``), holding the output's lock. ``keep`` versions are kept,
    expired ones deleted after ``grace`` seconds (pipeline/output/versions.py, retention).

    ``write(version: Location)`` writes the new version; ``verify(version)`` raises if
    it is not complete; ``record`` is the output's manifest (``kind``, rows...);
    ``recheck()`` repeats the output checks under the lock (another writer may have
    published meanwhile). A failure anywhere leaves the published output as it was;
    the version written is removed (or, if this process is killed, by the next writer).
    Returns the pointer published.
    """
    import datetime

    from .lock import RunLock
    from .versions import DEFAULT_KEEP, Transaction

    out = Location.at(output, storage_options)
    with RunLock(out) as lock:
        recheck()
        _mark_output(out)
        txn = Transaction(out, lock, keep=DEFAULT_KEEP if keep is None else keep, grace=grace)
        txn.begin()
        version = txn.start()
        try:
            write(version)
            verify(version)
            manifest = {
                "status": "complete",
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                **record,
            }
            return txn.commit(manifest)
        except BaseException:
            txn.discard()
            raise


def _mark_output(out: Location) -> None:
    """Mark an output root as written by kpca-dask (once)."""
    from kpca_dask.removal import MARKER_FILE

    from .store import mark_folder

    if not out.child(MARKER_FILE).exists():
        mark_folder(out, OUTPUT_MARK)
