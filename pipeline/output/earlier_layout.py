"""The layout of an earlier release's output (before versions/): its top-level result
paths, found without changing anything, and the one line a reader of such an output is
given. Migrating it is pipeline/output/migrate.py's."""

from __future__ import annotations

import os

from .layout import GROUP_FILE, LOCK, MANIFEST, RUN_NAMES, VERSIONS, WORK
from .store import Location, read_json

__all__ = ["LEGACY_NAMES", "RUN_KIND", "legacy_names", "migrate_command", "reader_hint"]

#: the top-level names an earlier release wrote as its result (the group file last: the
#: other paths are recognised as ours through it)
LEGACY_NAMES = tuple(sorted(RUN_NAMES - {MANIFEST, WORK, LOCK, VERSIONS, GROUP_FILE})) + (
    GROUP_FILE,
)
#: the group kind of an earlier release's run folder
RUN_KIND = "kpca-dask-run"


def migrate_command(root: Location | str) -> str:
    """The one command that migrates the output ``root``."""
    url = str(root)
    return f"kpca migrate {url}" + (" --storage-options JSON" if "://" in url else "")


def _listing(root: Location) -> set[str]:
    if root.is_local:
        try:
            return {e.name for e in os.scandir(root.local_path)}
        except (FileNotFoundError, NotADirectoryError):
            return set()
    root.refresh()
    try:
        entries = root.fs.ls(root.fs_path, detail=False, refresh=True)
    except FileNotFoundError:
        return set()
    except TypeError:  # a filesystem without refresh=
        entries = root.fs.ls(root.fs_path, detail=False)
    return {str(e).rstrip("/").rpartition("/")[2] for e in entries}


def _group_kind(root: Location) -> str | None:
    g = root.child(GROUP_FILE)
    try:
        if not g.exists():
            return None
        meta = read_json(g)
    except Exception:  # noqa: BLE001 - not a zarr group of ours
        return None
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    return attrs.get("kind") if isinstance(attrs, dict) else None


def _denoise_names(manifest: dict | None) -> set[str]:
    """The denoise arrays' names an earlier run wrote (``denoise.output_name``)."""
    names: set[str] = set()
    cfg = (manifest or {}).get("config") or {}
    den = cfg.get("denoise") if isinstance(cfg, dict) else None
    name = den.get("output_name") if isinstance(den, dict) else None
    rec = (manifest or {}).get("denoise")
    array = rec.get("array") if isinstance(rec, dict) else None
    for n in (name, array):
        if isinstance(n, str) and n and "/" not in n and n not in (".", ".."):
            names |= {n, f"{n}_rows"}
    return names


def _marker_kind(root: Location) -> str | None:
    """The kind in ``root``'s ownership marker (``_kpca-dask.json``), if any."""
    from kpca_dask.removal import MARKER_FILE

    m = root.child(MARKER_FILE)
    try:
        if not m.exists():
            return None
        data = read_json(m)
    except Exception:  # noqa: BLE001 - not a marker of ours
        return None
    return data.get("kind") if isinstance(data, dict) else None


def legacy_names(root: Location, manifest: dict | None = None) -> list[str]:
    """The earlier layout's result paths present at the top level of ``root`` (empty when
    the root is not an earlier release's run group, e.g. a version folder of today)."""
    from .versions import VERSION_MARK

    if _group_kind(root) != RUN_KIND or _marker_kind(root) == VERSION_MARK:
        return []
    present = _listing(root)
    wanted = [n for n in LEGACY_NAMES if n != GROUP_FILE]
    wanted += sorted(_denoise_names(manifest) - set(wanted))
    return [n for n in wanted if n in present] + [GROUP_FILE]


def reader_hint(root: Location, version: str | None) -> str | None:
    """One line for a reader of the output ``root`` (whose published ``version`` it read;
    None: read in place) when it is, or still holds paths of, an earlier release's
    layout; None otherwise. Reads only."""
    try:
        names = legacy_names(root)
    except Exception:  # noqa: BLE001 - a reader's hint must never fail the read
        return None
    if not names:
        return None
    if version is None:
        return (
            f"{root} is in an earlier kpca-dask's layout (its result at the top level, "
            f"before versions/): read in place; migrate it with `{migrate_command(root)}` "
            "(the next run or update of it does so too)"
        )
    return (
        f"{root} holds an earlier kpca-dask's top-level paths ({', '.join(names)}) "
        "that are not its published version: do not read them; "
        f"`{migrate_command(root)}` removes them"
    )
