"""Outputs written by an earlier release's layout: found, and migrated to versions.

Before versions (pipeline/output/versions.py), a run wrote its result at the top level of its
output: ``<out>/manifest.json`` beside ``<out>/model/``, ``<out>/embedding``,
``<out>/embedding.parquet/``, ``<out>/spectrum/``, the row arrays and ``<out>/report/``,
in a zarr group ``<out>/zarr.json`` of kind ``kpca-dask-run``. Downstream jobs read those
paths (docs/artifacts.md of that release). A writer of today publishes under
``versions/<id>/`` and replaces the manifest with the pointer: left alone, those old
paths would keep serving the last night before the upgrade, every night.

:func:`migrate` (under the output's lock) makes the old result the output's first
published version -- copied into ``versions/<id>/`` (hard links on local disk,
server-side copies on object stores) with its own manifest, published by one atomic
write of the pointer, so ``history`` keeps it -- and then removes the old top-level
paths, only what carries our markers (kpca_dask/removal.py). Every writer calls it as it
takes the lock (pipeline/runner/run.py: ``kpca run``, ``kpca update``, the flows), with one
WARNING line; ``kpca migrate OUT`` does it by hand (``--dry-run``: :func:`inspect` only).

The states an output can be in (:class:`Plan`):

* ``current``: nothing of the earlier layout at the top level; nothing to do.
* ``legacy``: the earlier layout's complete, verified result (its manifest has no
  ``version``): migrated as above. Its id is the manifest's creation time with a token
  of its content, so it sorts before every later version and a migration that died
  half-way is redone to the same id.
* ``leftover``: a pointer to a published version, with the earlier layout's top-level
  result still beside it (what a writer of the release before this one left: it
  published under ``versions/`` and kept the old paths; or a migration stopped after its
  publish). The old manifest is gone (the pointer replaced it), so that result can no
  longer be verified: the top-level paths are removed.
* ``unfinished``: top-level result paths without a complete, verified manifest (an
  earlier release's run that did not finish, or was damaged): not a result (every
  reader refuses it); the paths are removed and the run starts afresh (``work/`` is
  kept, so it resumes).

Whatever the state, a reader of an old path afterwards finds nothing there -- never
data older than the published version.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import RunCorruptError, RunIncompleteError

from .earlier_layout import RUN_KIND, _group_kind, legacy_names, migrate_command
from .export import _verify
from .layout import GROUP_FILE, MANIFEST, VERSIONS
from .store import Location, atomic_write_json

__all__ = ["Plan", "inspect", "migrate", "migrate_command"]

logger = logging.getLogger("pipeline")


@dataclass
class Plan:
    """What :func:`migrate` does to one output (:func:`inspect` finds it)."""

    root: Location
    state: str  # current | legacy | leftover | unfinished
    names: list[str] = field(default_factory=list)  # the earlier layout's top-level paths
    manifest: dict | None = None  # the earlier layout's manifest (legacy)
    version: str | None = None  # the id the legacy result is published as
    reason: str = ""  # why an unfinished result is not one

    def describe(self) -> str:
        """One line saying what :func:`migrate` does (or did)."""
        paths = ", ".join(self.names)
        if self.state == "current":
            return f"{self.root} is in the current layout (versions/): nothing to migrate"
        if self.state == "legacy":
            return (
                f"{self.root} was written by an earlier kpca-dask (its result at the top "
                f"level, before versions/): it becomes published version {self.version} "
                f"(versions/{self.version}/, kept in the history), and its old top-level "
                f"paths ({paths}) are removed"
            )
        if self.state == "leftover":
            return (
                f"{self.root} still holds an earlier kpca-dask's top-level result ({paths}) "
                "beside its published version; it is older than every published version "
                "and its manifest is gone: removed"
            )
        return (
            f"{self.root} holds an earlier kpca-dask's top-level paths ({paths}) that are "
            f"not a result ({self.reason}): removed (work/ is kept)"
        )


def _legacy_version_id(manifest: dict) -> str:
    """The id an earlier release's result is published as: its creation time (so it sorts
    before every later version) and a token of its manifest (the same id if a migration
    that died is redone)."""
    created = manifest.get("created")
    when = None
    if isinstance(created, str):
        try:
            when = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            when = None
    if when is None:
        when = datetime.datetime(1970, 1, 1)
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC)
    text = json.dumps(manifest, sort_keys=True, default=str)
    token = hashlib.blake2b(text.encode(), digest_size=3).hexdigest()
    return f"{when.strftime('%Y%m%dT%H%M%S%fZ')}-{token}"


def inspect(root: Location | str, storage_options: dict | None = None) -> Plan:
    """What :func:`migrate` would do to the output at ``root`` (reads only)."""
    from .versions import read_pointer

    root = Location.at(root, storage_options)
    try:
        pointer = read_pointer(root)
    except RunIncompleteError as exc:
        pointer, damaged = None, str(exc)
    else:
        damaged = ""
    if isinstance(pointer, dict) and "version" in pointer:
        names = legacy_names(root, pointer)
        return Plan(root, "leftover" if names else "current", names)
    names = legacy_names(root, pointer)
    if not names:
        return Plan(root, "current")
    if pointer is None:
        return Plan(root, "unfinished", names, reason=damaged or "no manifest.json")
    try:
        _verify(root, pointer, check_arrays=False)
    except (RunCorruptError, RunIncompleteError) as exc:
        return Plan(root, "unfinished", names, pointer, reason=str(exc))
    return Plan(root, "legacy", names, pointer, _legacy_version_id(pointer))


def _owned(root: Location, names: list[str]):
    """The ownership check for the earlier layout's top-level paths: one of its result
    names directly in ``root``, whose group says it is a kpca-dask run (checked when the
    path is removed), or anything our markers say is ours."""
    from .ownership import _remote_is_ours, is_ours

    if root.is_local:
        top = root.local_path

        def ours(p: Path) -> bool:
            if os.path.islink(p):
                return False
            if p.parent == top and p.name in names and _group_kind(root) == RUN_KIND:
                return True
            return is_ours(p)

        return ours
    fs = root.fs
    base = root.fs_path.rstrip("/")

    def ours_remote(p: str) -> bool:
        p = p.rstrip("/")
        parent, _, name = p.rpartition("/")
        if parent == base and name in names and _group_kind(root) == RUN_KIND:
            return True
        return _remote_is_ours(fs, p, base)

    return ours_remote


def _remove_names(root: Location, names: list[str]) -> None:
    """Remove the earlier layout's top-level paths (the group file last: the others are
    recognised as ours through it)."""
    owned = _owned(root, names)
    ordered = [n for n in names if n != GROUP_FILE] + [n for n in names if n == GROUP_FILE]
    for n in ordered:
        root.child(n).remove(root=root, owned=owned)


def _copy_into(root: Location, names: list[str], dst: Location) -> None:
    """The earlier layout's result (``names``) copied into the version folder ``dst``:
    hard links on local disk, server-side copies on object stores. Every writer replaces
    files, so nothing written later changes the copy."""
    if root.is_local:
        from .versions import link_tree

        for n in names:
            src = root.local_path / n
            if os.path.lexists(src):
                link_tree(src, dst.local_path / n, root.local_path, str(root))
        return
    fs = root.fs
    base = root.fs_path.rstrip("/")
    d = dst.fs_path.rstrip("/")
    files: list[str] = []
    for n in names:
        p = f"{base}/{n}"
        if fs.isdir(p):
            files += [str(f) for f in fs.find(p)]
        elif fs.exists(p):
            files.append(p)
    if files:
        fs.copy(files, [d + f[len(base) :] for f in files])


def migrate(
    root: Location | str, storage_options: dict | None = None, *, lock: Any = None
) -> Plan:
    """Migrate the output at ``root`` from an earlier release's layout (see the module's
    notes); hold the output's lock around it (``lock``: the holder, re-checked before the
    publish). Returns the plan carried out (state ``current``: nothing was done)."""
    from .store import mark_folder
    from .versions import VERSION_MARK, remove_version, version_location

    plan = inspect(root, storage_options)
    root = plan.root
    if plan.state == "current":
        return plan
    _mark_root(root)
    if plan.state == "legacy":
        assert plan.manifest is not None and plan.version is not None
        loc = version_location(root, plan.version)
        if loc.exists():  # a migration that died half-way: redone from the start
            remove_version(root, plan.version)
        mark_folder(loc, VERSION_MARK)
        try:
            _copy_into(root, [n for n in plan.names], loc)
            atomic_write_json(loc.child(MANIFEST), plan.manifest)
            _verify(loc, plan.manifest, check_arrays=True, label=root)
        except (RunCorruptError, RunIncompleteError) as exc:
            remove_version(root, plan.version)
            plan = Plan(root, "unfinished", plan.names, plan.manifest, reason=str(exc))
        except BaseException:
            remove_version(root, plan.version)  # nothing changed for readers
            raise
        else:
            pointer = {
                **plan.manifest,
                "version": plan.version,
                "version_path": f"{VERSIONS}/{plan.version}",
                "history": [],
            }
            _check_lock(root, lock)
            atomic_write_json(root.child(MANIFEST), pointer)  # the publish
    if plan.state == "unfinished" and plan.manifest is not None:
        # its manifest goes first: nothing names the paths as a result any more
        root.child(MANIFEST).remove(root=root, owned=_owned(root, [MANIFEST]))
    _remove_names(root, plan.names)
    logger.warning("migrate: %s; %s", plan.describe(), _readers_note(root, plan))
    return plan


def _readers_note(root: Location, plan: Plan) -> str:
    if plan.state == "unfinished":
        return "see docs/artifacts.md, Upgrades"
    return (
        f"readers of {root}/model, {root}/embedding... read pipeline.open_run({str(root)!r}) "
        "or the manifest's version_path now (docs/artifacts.md, Upgrades)"
    )


def _check_lock(root: Location, lock: Any) -> None:
    """Refuse to publish when ``lock`` is no longer the holder of the output's lock."""
    if lock is None or getattr(lock, "holder", None) is None:
        return
    from .lock import read_lock
    from .versions import ConcurrentPublishError

    held = read_lock(root)
    if held is None or held.token != lock.holder.token:
        raise ConcurrentPublishError(
            f"output {root}: the lock was broken or taken by another writer during the "
            "migration from the earlier layout; nothing was published."
        )


def _mark_root(root: Location) -> None:
    from kpca_dask.removal import MARKER_FILE

    from .publish import OUTPUT_MARK
    from .store import mark_folder

    if not root.child(MARKER_FILE).exists():
        mark_folder(root, OUTPUT_MARK)
