"""The visibility probe's files and what each side sees (pipeline/runtime/visibility.py runs
it).

Both sides: a location's :func:`signature` (what a reader sees of it), the probe files
(``.kpca-probe-<time>-<random>.<who>``: unique per probe), their removal through the
deletion primitive, stale ones included. On each worker (``Client.run``):
:func:`worker_look` and :func:`worker_clean`. The folders a probe creates, and their
removal while empty: :func:`missing_folders`, :func:`remove_created`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pipeline.output import Location

__all__ = [
    "PROBE_PREFIX",
    "ProbeTarget",
    "missing_folders",
    "new_token",
    "remove_created",
    "remove_stale_probes",
    "signature",
    "worker_clean",
    "worker_look",
]

logger = logging.getLogger("pipeline")

#: name prefix of the probe files (``.kpca-``: an output-folder check tolerates them)
PROBE_PREFIX = ".kpca-probe-"
#: bytes of a file the input signature hashes
HEAD_BYTES = 1 << 16
#: entries of a folder the input signature lists
MAX_ENTRIES = 200
#: probe files older than this (seconds; from the time in their name) were left by a
#: client killed mid-probe, or written by a worker that answered after its probe had
#: cleaned up: the next probe of that folder and the next writer of the output (under
#: its lock: pipeline/output/lock.py) remove them. Ten minutes: far longer than a probe lasts
#: (the worker timeout, 120 s by default, plus the clean-up's 10 s), so a probe another
#: run has under way is never touched.
STALE_AFTER = 600


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


def probe_file(loc: Location, token: str, who: str) -> Location:
    return loc.child(f"{PROBE_PREFIX}{token}.{who}")


def read_text(loc: Location) -> str | None:
    """The text of a small file, None when it is not there."""
    try:
        if loc.is_local:
            return loc.local_path.read_text()
        with loc.fs.open(loc.fs_path, "r") as f:
            return f.read()
    except FileNotFoundError:
        return None


def write_text(loc: Location, text: str) -> None:
    if loc.is_local:
        loc.local_path.write_text(text)
    else:
        with loc.fs.open(loc.fs_path, "w") as f:
            f.write(text)


def new_token() -> str:
    """A probe's unique name part: ``<unix time>-<random>`` (the time lets a later probe
    recognise the files of a client killed mid-probe as stale)."""
    return f"{int(time.time())}-{uuid.uuid4().hex[:12]}"


def _token_time(name: str) -> float | None:
    rest = name[len(PROBE_PREFIX) :]
    head = rest.split("-", 1)[0]
    return float(head) if head.isdigit() and "-" in rest else None


def remove_stale_probes(loc: Location, older_than: float = STALE_AFTER) -> int:
    """Remove the probe files in ``loc`` that a killed probe left (older than
    ``older_than`` s, or of the old unnamed format); returns how many."""
    n = 0
    try:
        if loc.is_local:
            names = [q.name for q in loc.local_path.glob(f"{PROBE_PREFIX}*")]
        else:
            loc.fs.invalidate_cache(loc.fs_path.rstrip("/"))  # other processes wrote there
            names = [
                key.rstrip("/").rsplit("/", 1)[-1]
                for key in loc.fs.glob(f"{loc.fs_path.rstrip('/')}/{PROBE_PREFIX}*")
            ]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    except Exception as exc:  # noqa: BLE001 - housekeeping: never stops a run
        logger.debug("stale probe files in %s: %s", loc, exc)
        return 0
    now = time.time()
    for name in names:
        t = _token_time(name)
        if t is None or now - t > older_than:
            try:
                n += bool(remove_probe_file(loc, loc.child(name)))
            except Exception as exc:  # noqa: BLE001 - housekeeping
                logger.debug("stale probe file %s/%s: %s", loc, name, exc)
    if n:
        logger.info("visibility probe: removed %d stale probe file(s) in %s", n, loc)
    return n


def _is_probe_file(p: Any) -> bool:
    name = os.path.basename(str(p).rstrip("/"))
    if not name.startswith(PROBE_PREFIX):
        return False
    if isinstance(p, os.PathLike):
        return os.path.isfile(p) and not os.path.islink(p)
    return True  # an object-store key with our prefix


def remove_probe_file(folder: Location, f: Location, attempts: int = 3) -> bool:
    """Remove one probe file of ours (through the deletion primitive), trying again
    after a failed request (a probe left behind would stay until the next writer)."""
    for i in range(attempts):
        try:
            return f.remove(root=folder, owned=_is_probe_file)
        except Exception:
            if i == attempts - 1:
                raise
            time.sleep(0.2 * (i + 1))
    return False


def describe_exception(exc: BaseException) -> str:
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
            text = read_text(probe_file(t.loc, token, "client"))
            if text is None:
                seen.append({"problem": "missing"})
            elif text != token:
                seen.append({"problem": "different"})
            else:
                write_text(probe_file(t.loc, token, tag), f"{token}:{tag}")
                seen.append({"wrote": tag})
        except Exception as exc:  # noqa: BLE001 - reported to the client, one line
            seen.append({"problem": "error", "error": describe_exception(exc)})
    return seen


def worker_clean(targets: list[ProbeTarget], token: str, dask_worker=None) -> int:
    """Run on every worker: remove the probe files this worker wrote (as it sees them)."""
    tag = _worker_tag(dask_worker.address) if dask_worker is not None else "local"
    n = 0
    for t in targets:
        if t.write:
            try:
                n += remove_probe_file(t.loc, probe_file(t.loc, token, tag))
            except Exception as exc:  # noqa: BLE001 - housekeeping
                logger.debug("probe clean-up on %s: %s", t.url, exc)
    return n


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


def create_folders(loc: Location) -> list[Location]:
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
