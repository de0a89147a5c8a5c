"""The output folder a command creates: noted before a run starts, removed after a failure
that leaves nothing worth resuming (only what carries a run's own names, through
kpca_dask.removal)."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.errors import is_user_error

__all__ = ["discard_fresh_output", "new_local_folder"]


def new_local_folder(path: str) -> Path | None:
    """The output folder when it is local and does not exist yet (else None)."""
    if "://" in path and not path.startswith("file://"):
        return None
    p = Path(path.removeprefix("file://"))
    return None if p.exists() or p.is_symlink() else p


def discard_fresh_output(folder: Path, exc: Exception) -> None:
    """After a failed run, remove the output folder this command created when nothing in it
    is worth keeping: a user error (bad input found by ingest: the input must change, so
    nothing would be resumed) or nothing written at all. Other failures keep the folder:
    re-running resumes from it. Only a folder holding nothing but a run's own names goes,
    through the project's one deletion function."""
    from pipeline.output import MANIFEST, RUN_NAMES

    if not folder.is_dir():
        return
    names = {p.name for p in folder.iterdir()}
    if not names:
        _rmdir(folder)
        return
    from kpca_dask.removal import MARKER_FILE

    if not is_user_error(exc) or MANIFEST in names or not names <= RUN_NAMES | {MARKER_FILE}:
        return
    from kpca_dask.removal import remove_owned

    try:
        remove_owned(folder, root=folder, owned=lambda p: p == folder)
    except Exception:  # noqa: BLE001 - a folder we cannot remove safely stays, as it was
        logging.getLogger("pipeline").warning("kept %s (could not remove it safely)", folder)


def _rmdir(folder: Path) -> None:
    """Remove an empty folder (rmdir never removes one that holds anything)."""
    try:
        folder.rmdir()
    except OSError:
        pass
