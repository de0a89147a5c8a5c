"""Before publishing: does every published array hold all its chunks?

zarr reads a chunk that is not in the store as the array's fill value, without a word.
A writer whose chunks went elsewhere (Dask workers that do not share the client's disk
write them to their own) or were lost by the store therefore produces a group that
opens, has the right shape and metadata -- and reads as zeros. Marking such a group
complete published an all-zeros embedding. So before a run, an update or a
transform is published, :func:`check_complete` lists each array's chunk keys in the
store (one listing per array; no chunk is read) and compares them with the chunk grid
its metadata promise.

That comparison is sound only for arrays written with ``write_empty_chunks`` (zarr
otherwise skips a chunk equal to the fill value: a legitimate block of zero labels
would look lost), so every published array is created with :data:`DENSE` as its
``config``.

Where it is called: :func:`pipeline.output.export.write_manifest` (runs and updates, before the
manifest is written) and :func:`pipeline.embed.transform.verify_transform_output` (transform
and denoise outputs, before they are swapped in). A publishing step that replaces these
calls it with the location of what it is about to publish.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pipeline.errors import RunError

from .store import Location

__all__ = ["DENSE", "IncompleteStoreError", "check_complete", "missing_chunks"]

#: ``config`` of every published zarr array: every chunk is written, also one equal to
#: the fill value, so that a chunk missing from the store is always damage
DENSE = {"write_empty_chunks": True}


class IncompleteStoreError(RunError):
    """A store about to be published lacks chunks its arrays' metadata promise."""


def _arrays(node: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``(path, array)`` of ``node`` (an array, or every array in a group, recursively)."""
    import zarr

    if isinstance(node, zarr.Array):
        yield prefix, node
        return
    for name, member in sorted(node.members()):
        yield from _arrays(member, f"{prefix}/{name}" if prefix else name)


def missing_chunks(loc: Location, names: Iterable[str] | None = None) -> dict[str, dict]:
    """Per array path (under ``loc``) that lacks chunks: ``missing`` (how many), ``total``
    and ``first`` (the first missing chunk's key). ``names``: the arrays or groups to look
    at (a name not present is skipped); None: everything in the group at ``loc``."""
    from kpca_dask.validation import missing_zarr_chunks

    g = loc.open_group("r")
    nodes = [("", g)] if names is None else [(n, g[n]) for n in dict.fromkeys(names) if n in g]
    found: dict[str, dict] = {}
    for name, node in nodes:
        for path, z in _arrays(node, name):
            lost = missing_zarr_chunks(z)
            if lost:
                grid = z._shard_grid_shape
                total = 1
                for n in grid:
                    total *= int(n)
                found[path] = {
                    "missing": len(lost),
                    "total": total,
                    "first": z.metadata.encode_chunk_key(lost[0]),
                }
    return found


def check_complete(loc: Location, names: Iterable[str] | None = None) -> None:
    """Raise :class:`IncompleteStoreError` (one line: the location, each array with how
    many chunks it lacks, nothing published) unless every array of ``names`` under
    ``loc`` (default: all of them) holds every chunk of its grid."""
    found = missing_chunks(loc, names)
    if not found:
        return
    parts = [
        f"{path!r} lacks {f['missing']} of {f['total']} chunks (first: {f['first']})"
        for path, f in sorted(found.items())
    ]
    raise IncompleteStoreError(
        f"{loc} is incomplete: {'; '.join(parts)}; it would read as zeros there, so it was "
        "not published and the previously published result is unchanged. The Dask workers "
        "wrote those chunks where this machine cannot see them (their own disks: put the "
        "output on shared storage or an object store) or the store lost them; re-run."
    )
