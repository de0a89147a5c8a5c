"""One writer per output: the run lock ``<out>/.kpca-run.lock``.

A run holds the lock from before it touches the output until its manifest is
published (or it fails). A second run to the same output is refused with a
message naming the holder's host, pid and start time. The lock file holds
that record as JSON; on a local filesystem the holder also keeps an advisory
``flock`` on it, which the kernel releases when the process dies -- so a
crashed run's lock is recognised as stale without guessing.

A lock is *stale* (and broken automatically, with a warning) when its holder
ran on this host and is gone: the ``flock`` is free, or -- where ``flock`` is
not supported, and on object stores -- the recorded pid is not running (or is
another process: pid reuse is detected by the process start time, a reboot by
the boot id). A lock held from **another host** cannot be checked from here:
it is refused until someone who knows that run is dead breaks it with
``kpca unlock <out>`` (:func:`break_lock`). ``kpca unlock`` refuses to break a
lock whose holder is provably alive on this host.

On object stores the lock is created with a conditional write (S3
``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure ``overwrite=False``:
:func:`create_object`), so of two writers exactly one creates it; the holder
also re-reads it before publishing (pipeline/versions.py). Breaking a stale
lock there is a delete (only of the record judged stale) then a conditional
create; should two writers race through that window, the one whose lock was
replaced finds out before publishing and publishes nothing.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket
import stat
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import UserError
from .layout import LOCK
from .store import Location

__all__ = [
    "LEASE_SECONDS",
    "LOCK_NAME",
    "LockHolder",
    "OutputLockedError",
    "RunLock",
    "read_lock",
    "lock_status",
    "break_lock",
    "check_unlocked",
    "create_object",
]

logger = logging.getLogger("pipeline")

LOCK_NAME = LOCK  # pipeline/layout.py

#: how long a lock stays valid without being renewed by its holder (seconds); a lock
#: not renewed within it is expired, whoever held it (issue 36: locks are leases)
LEASE_SECONDS = 600

#: tokens of the locks this process holds (``check_unlocked`` lets them through)
_HELD: dict[str, str] = {}


class OutputLockedError(UserError, FileExistsError):
    """Another run holds the output's lock (or held it on a host we cannot check)."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_started(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # no such process, access denied, psutil missing
        return None


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or held) a lock."""

    host: str
    pid: int
    started: str  # ISO 8601, UTC: when the run took the lock
    process_started: float | None = None  # the holder process's start time (pid reuse check)
    boot_id: str = ""
    user: str = ""
    token: str = ""

    @classmethod
    def me(cls) -> LockHolder:
        try:
            import getpass

            user = getpass.getuser()
        except Exception:
            user = ""
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            process_started=_process_started(os.getpid()),
            boot_id=_boot_id(),
            user=user,
            token=uuid.uuid4().hex,
        )

    @classmethod
    def from_dict(cls, d: Any) -> LockHolder | None:
        if not isinstance(d, dict) or "host" not in d or "pid" not in d:
            return None
        try:
            return cls(
                host=str(d["host"]),
                pid=int(d["pid"]),
                started=str(d.get("started", "?")),
                process_started=d.get("process_started"),
                boot_id=str(d.get("boot_id", "")),
                user=str(d.get("user", "")),
                token=str(d.get("token", "")),
            )
        except (TypeError, ValueError):
            return None

    def describe(self) -> str:
        who = f" by {self.user}" if self.user else ""
        return f"host {self.host}, pid {self.pid}, started {self.started}{who}"

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname() and (
            not self.boot_id or not _boot_id() or self.boot_id == _boot_id()
        )

    def alive(self) -> bool | None:
        """True/False when checkable from here (this host, this boot); None otherwise."""
        if self.host != socket.gethostname():
            return None
        if self.boot_id and _boot_id() and self.boot_id != _boot_id():
            return False  # the machine rebooted since: every process of then is gone
        started = _process_started(self.pid)
        if started is None:
            return False
        if (
            self.process_started is not None
            and abs(started - float(self.process_started)) > 1.0
        ):
            return False  # the pid now belongs to another process
        return True


def _lock_file_ours(p: Path) -> bool:
    """A regular lock file holding our record (or empty: created, then its run died)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd) as f:
        if not os.path.samestat(os.fstat(f.fileno()), os.lstat(p)) or not stat.S_ISREG(
            os.fstat(f.fileno()).st_mode
        ):
            return False
        text = f.read(1 << 16)
    return _our_record(text)


def _our_record(text: str) -> bool:
    """A lock file's text is ours: empty (a lock being written) or a LockHolder record."""
    if not text.strip():
        return True
    try:
        return LockHolder.from_dict(json.loads(text)) is not None
    except ValueError:
        return False


def _lock_owned(loc: Location):
    """The ownership check :meth:`Location.remove` applies to the lock file at ``loc``:
    :func:`_lock_file_ours` on local disk; on an object store, the object read through
    the location's own filesystem (its storage options) holds our record (or nothing)."""
    if loc.is_local:
        return _lock_file_ours
    fs = loc.fs

    def ours(p: str) -> bool:
        try:
            if fs.isdir(p):
                return False
            with fs.open(p, "r") as f:
                text = f.read(1 << 16)
        except (OSError, ValueError):
            return False
        return _our_record(text)

    return ours


def create_object(loc: Location, data: bytes) -> bool:
    """Write the object ``loc`` only if it does not exist, atomically where the store can:
    S3 ``If-None-Match: *`` and GCS ``ifGenerationMatch=0`` (fsspec ``mode="create"``),
    Azure ``overwrite=False``. Returns False when the object exists already."""
    fs, path = loc.fs, loc.fs_path
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    try:
        if {"s3", "s3a", "gs", "gcs"} & set(protocols):
            fs.pipe_file(path, data, mode="create")
        elif {"abfs", "az", "abfss"} & set(protocols):
            fs.pipe_file(path, data, overwrite=False)
        else:  # no conditional write known for this store: check, then write
            if fs.exists(path):
                return False
            fs.pipe_file(path, data)
    except FileExistsError:
        return False
    except Exception:
        loc.refresh()
        if fs.exists(path):  # the store's own "precondition failed" / "already exists"
            return False
        raise
    loc.refresh()
    return True


def _lock_loc(out: Location) -> Location:
    return out.child(LOCK_NAME)


def read_lock(out: Location) -> LockHolder | None:
    """The recorded holder of ``out``'s lock, or None (no lock, or an empty one)."""
    loc = _lock_loc(out)
    try:
        if loc.is_local:
            # never through a link: a linked lock file is not ours (refused when taking it)
            fd = os.open(loc.local_path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                text = f.read()
        else:
            loc.refresh()  # written and removed by other processes
            if not loc.exists():
                return None
            with loc.fs.open(loc.fs_path, "r") as f:
                text = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
    try:
        return LockHolder.from_dict(json.loads(text)) if text.strip() else None
    except json.JSONDecodeError:
        return None


def _flock_free(path: Path) -> bool | None:
    """Whether nobody holds a flock on ``path`` (None: flock unsupported, or no file)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def lock_status(out: Location) -> tuple[str, LockHolder | None]:
    """``("free" | "held" | "stale" | "foreign", holder)`` of ``out``'s lock.

    held: a live process on this host holds it; stale: its holder is gone;
    foreign: held from another host (cannot be checked from here).
    """
    holder = read_lock(out)
    loc = _lock_loc(out)
    if holder is not None and holder.token in _HELD.values():
        return "held", holder
    free = _flock_free(loc.local_path) if loc.is_local and loc.exists() else None
    if free is False:
        return "held", holder
    if holder is None:
        return ("stale" if loc.exists() else "free"), None
    alive = holder.alive()
    if alive is None:
        return "foreign", holder
    if free is True or not alive:
        return "stale", holder
    return "held", holder


def _locked_message(out: Location, holder: LockHolder | None, foreign: bool) -> str:
    who = holder.describe() if holder else "an unknown holder"
    if foreign:
        return (
            f"output {out} is locked by a run on another host ({who}); if that run is no "
            f"longer running, break the lock with `kpca unlock {out}` and re-run."
        )
    return (
        f"output {out} is locked by a running job ({who}); wait for it to finish or "
        "choose another output.path (concurrent runs to one output are refused)."
    )


def check_unlocked(out: Location) -> None:
    """Raise OutputLockedError if another live run holds ``out``'s lock."""
    status, holder = lock_status(out)
    if status == "held" and (holder is None or holder.token not in _HELD.values()):
        raise OutputLockedError(_locked_message(out, holder, foreign=False))
    if status == "foreign":
        raise OutputLockedError(_locked_message(out, holder, foreign=True))


def break_lock(out: Location | str) -> LockHolder | None:
    """Remove ``out``'s lock (what ``kpca unlock`` does); returns the old holder.

    Refused (OutputLockedError) when the holder is a live process on this host.
    """
    out = out if isinstance(out, Location) else Location(str(out))
    status, holder = lock_status(out)
    if status == "held":
        raise OutputLockedError(
            f"output {out} is locked by a live process "
            f"({holder.describe() if holder else '?'}); "
            "stop that run first (the lock is released when it exits)."
        )
    loc = _lock_loc(out)
    if loc.exists() or (loc.is_local and os.path.islink(loc.local_path)):
        loc.remove(root=out, owned=_lock_owned(loc))
        logger.warning(
            "lock: broke the lock of %s (held by %s)",
            out,
            holder.describe() if holder else "nobody recorded",
        )
    return holder


class RunLock:
    """Context manager holding ``<out>/.kpca-run.lock`` for one run.

    >>> with RunLock(Location("out")):   # doctest: +SKIP
    ...     run the stages
    """

    def __init__(self, out: Location):
        self.out = out
        self.loc = _lock_loc(out)
        self.holder: LockHolder | None = None
        self._fd: int | None = None

    # ------------------------------------------------------------------ local
    def _acquire_local(self) -> None:
        import fcntl

        path = self.loc.local_path
        for _ in range(10):
            try:
                # O_NOFOLLOW: a linked lock file must never truncate what it points to
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                from .errors import RunError

                raise RunError(
                    f"{path} is a symbolic link, not a lock file of ours; "
                    "remove the link (kpca never writes through links) and "
                    "re-run."
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                flock_ok = True
            except BlockingIOError:
                os.close(fd)
                raise OutputLockedError(
                    _locked_message(self.out, read_lock(self.out), foreign=False)
                ) from None
            except OSError:  # filesystem without flock: fall back to the recorded pid
                flock_ok = False
            try:
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    os.close(fd)  # unlinked by its releasing holder meanwhile: retry
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            old = read_lock(self.out)
            if old is not None:
                alive = old.alive()
                if alive is None or (alive and not flock_ok):
                    os.close(fd)
                    raise OutputLockedError(
                        _locked_message(self.out, old, foreign=alive is None)
                    )
                logger.warning(
                    "lock: breaking the stale lock of %s: its holder (%s) is no longer running",
                    self.out,
                    old.describe(),
                )
            self.holder = LockHolder.me()
            data = json.dumps(asdict(self.holder), indent=1).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
            self._fd = fd
            return
        raise OutputLockedError(
            f"could not take the lock of {self.out} (it keeps changing); "
            "another run is starting there."
        )

    # ----------------------------------------------------------------- remote
    def _acquire_remote(self) -> None:
        for _ in range(5):
            self.holder = LockHolder.me()
            if create_object(self.loc, json.dumps(asdict(self.holder)).encode()):
                now = read_lock(self.out)
                if now is None or now.token != self.holder.token:
                    raise OutputLockedError(_locked_message(self.out, now, foreign=True))
                return
            status, old = lock_status(self.out)
            if status in ("held", "foreign"):
                raise OutputLockedError(
                    _locked_message(self.out, old, foreign=status == "foreign")
                )
            if status == "stale":
                logger.warning(
                    "lock: breaking the stale lock of %s: its holder (%s) is no longer running",
                    self.out,
                    old.describe() if old else "?",
                )
                again = read_lock(self.out)
                if (again.token if again else None) == (old.token if old else None):
                    self.loc.remove(root=self.out, owned=_lock_owned(self.loc))
        self.holder = None
        raise OutputLockedError(
            f"could not take the lock of {self.out} (it keeps changing); "
            "another run is starting there."
        )

    def acquire(self) -> RunLock:
        if self.out.exists() and self.out.is_local and not self.out.local_path.is_dir():
            from .errors import RunError

            raise RunError(
                f"output path {self.out} is a file, not a folder; choose another output.path."
            )
        self.out.makedirs()
        if self.loc.is_local:
            self._acquire_local()
        else:
            self._acquire_remote()
        _HELD[self.loc.url] = self.holder.token
        logger.info("lock: %s held (%s)", self.out, self.holder.describe())
        return self

    def release(self) -> None:
        if self.holder is None:
            return
        _HELD.pop(self.loc.url, None)
        try:
            current = read_lock(self.out)
            if current is not None and current.token == self.holder.token:
                self.loc.remove(root=self.out, owned=_lock_owned(self.loc))
        finally:
            if self._fd is not None:
                os.close(self._fd)  # releases the flock
                self._fd = None
            self.holder = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
