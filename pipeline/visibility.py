"""Can every Dask worker see the run's locations? Checked before any stage.

On one machine the client and the workers share a disk; on a cluster they share only
what is mounted on every node, or an object store. A worker that cannot see a local
output path writes its chunks to its own disk under the client's path, and the next
stage reads zeros (issue 14). So before the first stage a run probes each location:

- the input (read only): the client takes a signature of it (size and a hash of the
  first bytes of a file; names and sizes of a folder's entries) and every worker takes
  the same; a worker that finds nothing, or something else, cannot see it;
- the output and the work folder (written): the client writes a probe file there and
  every worker reads it back; then every worker writes one and the client reads them.
  The probe files (``.kpca-probe-<token>.*``) and any folder the probe created are
  removed afterwards, on the workers' side as well as the client's.

A failure is refused with one line (:class:`VisibilityError`, a UserError: exit 2) that
names each location, the workers that cannot see it and the fix, before anything is
published. The probe costs two round trips to the workers and a few small files: a few
ms on a local cluster. Without a distributed client (dask's threads in this process)
there are no other processes to probe, and the log says so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import UserError
from .store import Location

__all__ = [
    "PROBE_PREFIX",
    "ProbeTarget",
    "VisibilityError",
    "check_locations",
    "check_visibility",
    "missing_folders",
    "remove_created",
    "run_targets",
]

logger = logging.getLogger("pipeline")

#: name prefix of the probe files (``.kpca-``: an output-folder check tolerates them)
PROBE_PREFIX = ".kpca-probe-"
#: bytes of a file the input signature hashes
HEAD_BYTES = 1 << 16
#: entries of a folder the input signature lists
MAX_ENTRIES = 200
#: how many worker addresses a message names before "and N more"
SHOWN_WORKERS = 4


class VisibilityError(UserError, RuntimeError):
    """A worker cannot see (read, or write and read back) a location of the run."""


@dataclass(frozen=True)
class ProbeTarget:
    """One location to probe: ``role`` names it in messages (``input``, ``output``...)."""

    role: str
    url: str
    storage_options: dict[str, Any]
    write: bool

    @property
    def loc(self) -> Location:
        return Location(self.url, dict(self.storage_options))


def run_targets(cfg) -> list[ProbeTarget]:
    """The locations of the run ``cfg`` describes: its input (read), its output and its
    work folder (written)."""
    from .layout import run_layout

    lay = run_layout(cfg)
    return [
        ProbeTarget("input", cfg.input.path, dict(cfg.input.storage_options), False),
        ProbeTarget("output", lay.root.url, dict(lay.root.storage_options), True),
        ProbeTarget("work folder", lay.work.url, dict(lay.work.storage_options), True),
    ]


# ------------------------------------------------------------------ both sides
def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def signature(loc: Location) -> str:
    """What a reader of ``loc`` sees, in short: ``missing``, a file's size and the hash of
    its first bytes, or a folder's (or glob's) entries with their sizes."""
    fs, path = loc.fs, loc.fs_path
    if _has_magic(path):
        found = sorted(fs.glob(path))[:MAX_ENTRIES]
        if not found:
            return "missing"
        return "glob:" + _digest([f"{f}:{fs.size(f)}" for f in found])
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return "missing"
    if info.get("type") == "directory":
        entries = sorted(
            (os.path.basename(str(e["name"]).rstrip("/")), e.get("size") or 0)
            for e in fs.ls(path, detail=True)
        )[:MAX_ENTRIES]
        return "folder:" + _digest([f"{n}:{s}" for n, s in entries])
    with fs.open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    return f"file:{info.get('size')}:{_digest([head.hex()])}"


def _digest(parts: list[str]) -> str:
    h = hashlib.blake2b(digest_size=12)
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _worker_tag(address: str) -> str:
    return hashlib.blake2b(address.encode(), digest_size=6).hexdigest()


def _probe_file(loc: Location, token: str, who: str) -> Location:
    return loc.child(f"{PROBE_PREFIX}{token}.{who}")


def _read_text(loc: Location) -> str | None:
    """The text of a small file, None when it is not there."""
    try:
        if loc.is_local:
            return loc.local_path.read_text()
        with loc.fs.open(loc.fs_path, "r") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_text(loc: Location, text: str) -> None:
    if loc.is_local:
        loc.local_path.write_text(text)
    else:
        with loc.fs.open(loc.fs_path, "w") as f:
            f.write(text)


def _is_probe_file(p: Any) -> bool:
    name = os.path.basename(str(p).rstrip("/"))
    if not name.startswith(PROBE_PREFIX):
        return False
    if isinstance(p, os.PathLike):
        return os.path.isfile(p) and not os.path.islink(p)
    return True  # an object-store key with our prefix


def _remove_probe_file(folder: Location, f: Location) -> bool:
    """Remove one probe file of ours (through the deletion primitive)."""
    return f.remove(root=folder, owned=_is_probe_file)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ------------------------------------------------------------------ on each worker
def worker_look(targets: list[ProbeTarget], token: str, dask_worker=None) -> list[dict]:
    """Run on every worker (``Client.run``): what this worker sees of each target.

    Read targets: their signature. Written targets: whether the client's probe file is
    there with its content; if so, this worker writes its own beside it.
    """
    tag = _worker_tag(dask_worker.address) if dask_worker is not None else "local"
    seen = []
    for t in targets:
        try:
            if not t.write:
                seen.append({"signature": signature(t.loc)})
                continue
            text = _read_text(_probe_file(t.loc, token, "client"))
            if text is None:
                seen.append({"problem": "missing"})
            elif text != token:
                seen.append({"problem": "different"})
            else:
                _write_text(_probe_file(t.loc, token, tag), f"{token}:{tag}")
                seen.append({"wrote": tag})
        except Exception as exc:  # noqa: BLE001 - reported to the client, one line
            seen.append({"problem": "error", "error": _short(exc)})
    return seen


def worker_clean(targets: list[ProbeTarget], token: str, dask_worker=None) -> int:
    """Run on every worker: remove the probe files this worker wrote (as it sees them)."""
    tag = _worker_tag(dask_worker.address) if dask_worker is not None else "local"
    n = 0
    for t in targets:
        if t.write:
            try:
                n += _remove_probe_file(t.loc, _probe_file(t.loc, token, tag))
            except Exception as exc:  # noqa: BLE001 - housekeeping
                logger.debug("probe clean-up on %s: %s", t.url, exc)
    return n


# ------------------------------------------------------------------ on the client
def _default_client():
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def missing_folders(loc: Location) -> list[Location]:
    """The local folders that creating ``loc`` would create, deepest first (none for an
    object store, where a prefix exists only while something is under it)."""
    if not loc.is_local:
        return []
    p = loc.local_path
    missing = []
    while not os.path.lexists(p) and p != p.parent:
        missing.append(Location(str(p)))
        p = p.parent
    return missing


def _created_folders(loc: Location) -> list[Location]:
    """Create ``loc`` (local: with its parents); the folders this created, deepest first."""
    missing = missing_folders(loc)
    loc.makedirs()
    return missing


def _empty_folder(p: Any) -> bool:
    return (
        os.path.isdir(p)
        and not os.path.islink(p)
        and not os.path.ismount(p)
        and not os.listdir(p)
    )


def remove_created(folders: list[Location]) -> None:
    """Remove folders a probe (or a refused run) created, deepest first, each only while
    it is empty (through the deletion primitive)."""
    for f in sorted(folders, key=lambda f: len(f.local_path.parts), reverse=True):
        try:
            if _empty_folder(f.local_path):
                f.remove(root=f, owned=_empty_folder)
        except Exception as exc:  # noqa: BLE001 - housekeeping
            logger.debug("probe clean-up of %s: %s", f, exc)


def _name_workers(addresses: list[str], total: int) -> str:
    shown = ", ".join(sorted(addresses)[:SHOWN_WORKERS])
    more = len(addresses) - SHOWN_WORKERS
    return f"{len(addresses)} of {total} workers: {shown}" + (
        f" and {more} more" if more > 0 else ""
    )


_WHY = {
    "missing": "it does not exist there",
    "missing-written": "a probe file this machine wrote there is not there for them",
    "different": "they see different content at that path",
    "client-missing": "a probe file they wrote there does not reach this machine",
    "client-different": "a probe file they wrote there reads back different here",
}


def check_locations(targets: list[ProbeTarget], client=None) -> dict[str, Any] | None:
    """Probe ``targets`` on every worker of ``client`` (default: the current distributed
    client); raise :class:`VisibilityError` (one line) when a worker cannot see one.

    Returns what was probed (``workers``, ``targets``, ``ms``), or None without a
    distributed client (nothing to probe: dask runs in this process).
    """
    client = client if client is not None else _default_client()
    if client is None:
        logger.info(
            "visibility probe: no Dask cluster (this process computes): nothing to probe"
        )
        return None
    t0 = time.perf_counter()
    token = uuid.uuid4().hex[:16]
    created: list[Location] = []
    client_files: list[tuple[Location, Location]] = []
    failures: dict[str, dict[str, list[str]]] = {}  # role -> why -> workers
    errors: dict[str, str] = {}
    try:
        mine: dict[str, str] = {}
        for t in targets:
            loc = t.loc
            if t.write:
                created += _created_folders(loc)
                f = _probe_file(loc, token, "client")
                _write_text(f, token)
                client_files.append((loc, f))
            else:
                mine[t.role] = signature(loc)
        looks = client.run(worker_look, targets, token, on_error="return")
        total = len(looks)
        for addr, seen in sorted(looks.items()):
            if isinstance(seen, BaseException):
                for t in targets:
                    failures.setdefault(t.role, {}).setdefault("error", []).append(addr)
                errors.setdefault("probe", _short(seen))
                continue
            for t, s in zip(targets, seen):
                why = s.get("problem")
                if why is None and not t.write and s["signature"] != mine[t.role]:
                    why = "missing" if s["signature"] == "missing" else "different"
                if why is None and t.write:
                    text = _read_text(_probe_file(t.loc, token, s["wrote"]))
                    if text != f"{token}:{s['wrote']}":
                        why = "client-missing" if text is None else "client-different"
                if why == "error":
                    errors.setdefault(t.role, s["error"])
                if why is not None:
                    failures.setdefault(t.role, {}).setdefault(why, []).append(addr)
    finally:
        _clean(client, targets, token, client_files, created)
    ms = 1e3 * (time.perf_counter() - t0)
    if failures:
        raise VisibilityError(_message(targets, failures, errors, total))
    logger.info(
        "visibility probe: %s seen by all %d workers (%.0f ms)",
        ", ".join(t.role for t in targets),
        total,
        ms,
    )
    return {"workers": total, "targets": [t.role for t in targets], "ms": ms}


def _clean(client, targets, token, client_files, created) -> None:
    try:
        client.run(worker_clean, targets, token, on_error="return")
    except Exception as exc:  # noqa: BLE001 - housekeeping
        logger.debug("probe clean-up on the workers: %s", exc)
    for loc, f in client_files:
        try:
            _remove_probe_file(loc, f)
            # what a worker wrote that it could not remove itself (seen only from here)
            if not loc.is_local:
                for key in loc.fs.glob(f"{loc.fs_path.rstrip('/')}/{PROBE_PREFIX}{token}.*"):
                    _remove_probe_file(loc, loc.child(os.path.basename(key)))
            else:
                for q in loc.local_path.glob(f"{PROBE_PREFIX}{token}.*"):
                    _remove_probe_file(loc, loc.child(q.name))
        except Exception as exc:  # noqa: BLE001 - housekeeping
            logger.debug("probe clean-up of %s: %s", f, exc)
    remove_created(created)


def _inside(url: str, other: str) -> bool:
    return url.rstrip("/").startswith(other.rstrip("/") + "/")


def _message(targets, failures, errors, total) -> str:
    parts = []
    # a folder inside another that failed the same way says nothing new (work in output)
    targets = [
        t
        for t in targets
        if not any(
            o.role in failures and o.write and _inside(t.url, o.url) and o is not t
            for o in targets
        )
    ]
    for t in targets:
        for why, addrs in failures.get(t.role, {}).items():
            reason = (
                f"the probe failed there ({errors.get(t.role) or errors.get('probe')})"
                if why == "error"
                else _WHY[f"{why}-written" if t.write and why == "missing" else why]
            )
            parts.append(f"{t.role} {t.url} ({_name_workers(addrs, total)}: {reason})")
    roles = [t.role for t in targets if t.role in failures]
    what = roles[0] if len(roles) == 1 else ", ".join(roles[:-1]) + " and " + roles[-1]
    return (
        f"the Dask workers cannot see the run's {what}: {'; '.join(parts)}; the workers do "
        f"not share this machine's files: put the {what} on storage every worker shares "
        "(the same path on a shared filesystem) or use an object store URL (s3://, gs://, "
        "az://) with its storage_options."
    )


def check_visibility(cfg, client=None) -> dict[str, Any] | None:
    """Probe the run's input, output and work folder on every worker (see
    :func:`check_locations`); refuses with one line when a worker cannot see one."""
    return check_locations(run_targets(cfg), client)
