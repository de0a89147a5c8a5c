# long: one lock protocol read together (record, status, break, acquire, renewal)
"""One writer per output: the run lock ``<out>/.kpca-run.lock``, a lease.

A run holds the lock from before it touches the output until its manifest is
published (or it fails). A second run to the same output is refused with a
message naming the holder's host, pid and start time. The lock file holds
that record as JSON; on a local filesystem the holder also keeps an advisory
``flock`` on it, which the kernel releases when the process dies -- so a
crashed run's lock is recognised as stale without guessing.

**Locks are leases.** The holder renews its lock -- a thread rewrites the record
with a new ``renewed`` time every third of the lease (:func:`lease_seconds`: dask
config ``kpca.lock-lease``, env ``DASK_KPCA__LOCK_LEASE``, default
:data:`LEASE_SECONDS`) -- while it holds it, and stops on release or when its process
dies. The record carries its lease. A lock not renewed within its lease is
*expired* and broken by the next writer on any host, with one warning naming the
dead holder (host, pid, start, last renewal); a record of an earlier release (no
``renewed``) counts from its start. A renewal is a conditional write where the
store has one (S3 ``If-Match``, GCS ``ifGenerationMatch``, Azure ``If-Match``: the
object the holder last wrote, so a renewal never overwrites another writer's lock;
on local disk the holder's own open file, checked to still be the lock). A holder
whose renewal finds the lock replaced or removed, or that could not renew it within
its lease, has lost it: its :attr:`RunLock.holder` token no longer matches the
record, so the pre-publish check (pipeline/output/versions.py) publishes nothing.

Besides the lease, a lock is *stale* (and broken automatically, with a warning) when
its holder ran on this host and is gone: the ``flock`` is free, or -- where ``flock``
is not supported, and on object stores -- the recorded pid is not running (or is
another process: pid reuse is detected by the process start time, a reboot by the
boot id). A live holder on this host keeps its lock whatever its lease says. A
fresh lock of **another host** (renewed within its lease) is refused; ``kpca unlock
<out>`` (:func:`break_lock`) breaks it at once for someone who knows that run is dead.
``kpca unlock`` refuses to break a lock whose holder is provably alive on this host.

A lock path that holds something else (not JSON, JSON that is not a lock record, a
folder) is not ours to judge: it is refused in one line giving the command that
removes it, ``kpca unlock --force <out>``.

On object stores the lock is created with a conditional write (S3
``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure ``overwrite=False``:
:func:`create_object`), so of two writers exactly one creates it; the holder
also re-reads it before publishing (pipeline/output/versions.py). Breaking a stale or
expired lock there is a delete (only of the record judged so) then a conditional
create; should two writers race through that window, the one whose lock was
replaced finds out before publishing and publishes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import logging
import os
import socket
import stat
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UserError

from .layout import LOCK
from .lock_objects import _object_version, _replace_object, create_object
from .store import Location

__all__ = [
    "LEASE_CONFIG",
    "LEASE_SECONDS",
    "LOCK_NAME",
    "LockHolder",
    "OutputLockedError",
    "RunLock",
    "read_lock",
    "lock_status",
    "lease_seconds",
    "break_lock",
    "check_unlocked",
    "create_object",
]

logger = logging.getLogger("pipeline")

LOCK_NAME = LOCK  # pipeline/output/layout.py

#: how long a lock stays valid without being renewed by its holder (seconds); a lock
#: not renewed within it is expired, whoever held it (issue 36: locks are leases)
LEASE_SECONDS = 600

#: dask config key of the lease (seconds, or a duration such as "10 minutes"); in the
#: environment ``DASK_KPCA__LOCK_LEASE``. Read by the holder, recorded in its lock.
LEASE_CONFIG = "kpca.lock-lease"

#: tokens of the locks this process holds (``check_unlocked`` lets them through)
_HELD: dict[str, str] = {}


class OutputLockedError(UserError, FileExistsError):
    """Another run holds the output's lock (or held it on a host we cannot check)."""


def lease_seconds() -> float:
    """The lease this process's locks are taken with: dask config :data:`LEASE_CONFIG`
    (env ``DASK_KPCA__LOCK_LEASE``), else :data:`LEASE_SECONDS`."""
    import dask
    from dask.utils import parse_timedelta

    value = dask.config.get(LEASE_CONFIG, None)
    if value is None:
        return float(LEASE_SECONDS)
    try:
        lease = float(parse_timedelta(value, default="seconds"))
    except (TypeError, ValueError):
        lease = -1.0
    if not lease > 0:
        from pipeline.config.messages import ConfigError

        raise ConfigError(
            f"dask config {LEASE_CONFIG} = {value!r} is not a positive duration; set it to "
            f"seconds (e.g. {LEASE_SECONDS}) or unset it (default {LEASE_SECONDS} s)."
        )
    return lease


def _now_iso(offset: float = 0.0) -> str:
    """Now, in the store's clock: this host's time less its ``offset`` (store_offset)."""
    now = datetime.datetime.fromtimestamp(time.time() - offset, datetime.UTC)
    return now.isoformat(timespec="milliseconds")


#: this process's clock less the store's, per output (seconds): measured once
_OFFSETS: dict[str, float] = {}
#: a clock further off than this from the store's is said so in one WARNING line
SKEW_WARN_SECONDS = 60.0


def store_offset(out: Location) -> float:
    """How far this host's clock is ahead of the store's at ``out`` (seconds; negative:
    behind), measured once per process by writing a probe object and reading the time the
    store gave it. Lock records carry times in the store's clock (the holder's own clock
    less its offset) and are judged against the store's clock (the judge's clock less its
    offset), so two hosts whose clocks differ by hours neither break a live lock nor keep a
    dead one (issue 36: clock skew). 0 when the store does not tell (then this host's clock
    is trusted, as before)."""
    if out.url in _OFFSETS:
        return _OFFSETS[out.url]
    from pipeline.runtime import PROBE_PREFIX, new_token, remove_probe_file

    probe = out.child(f"{PROBE_PREFIX}{new_token()}.clock")
    offset = 0.0
    try:
        before = time.time()
        probe.fs.pipe_file(probe.fs_path, b"kpca clock probe")
        after = time.time()
        if not probe.is_local:
            probe.refresh()
        stamp = probe.fs.modified(probe.fs_path)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.UTC)
        # the store stamped it between our two readings (stores that keep whole seconds
        # truncate: half a second is added back)
        coarse = stamp.microsecond == 0 and not probe.is_local
        offset = (before + after) / 2 - (stamp.timestamp() + (0.5 if coarse else 0.0))
        if abs(offset) < 2.0 + (after - before):  # within what the stamp can tell
            offset = 0.0
        elif abs(offset) > SKEW_WARN_SECONDS:
            logger.warning(
                "lock: this host's clock is %.0f s %s the store's at %s; lock times are "
                "kept in the store's clock",
                abs(offset),
                "ahead of" if offset > 0 else "behind",
                out,
            )
    except Exception as exc:  # noqa: BLE001 - no time from the store: trust ours
        logger.debug("lock: the store's clock at %s is not readable (%s)", out, exc)
        offset = 0.0
    finally:
        try:
            remove_probe_file(out, probe)
        except Exception as exc:  # noqa: BLE001 - a stale probe is cleaned by a writer
            logger.debug("lock: clock probe %s left (%s)", probe, exc)
    _OFFSETS[out.url] = offset
    return offset


def store_now(out: Location) -> float:
    """Now in the store's clock (seconds since the epoch)."""
    return time.time() - store_offset(out)


def _epoch(text: str) -> float | None:
    """Seconds since the epoch of an ISO 8601 time (UTC when it names no zone)."""
    try:
        t = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return t.timestamp()


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
    renewed: str = ""  # ISO 8601, UTC: the holder's last renewal ("": never, an old record)
    lease: float | None = None  # seconds the holder promised to renew within

    @classmethod
    def me(cls, lease: float | None = None, offset: float = 0.0) -> LockHolder:
        try:
            import getpass

            user = getpass.getuser()
        except Exception:
            user = ""
        now = _now_iso(offset)
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started=now[:19] + now[23:],  # to the second, as records always showed it
            process_started=_process_started(os.getpid()),
            boot_id=_boot_id(),
            user=user,
            token=uuid.uuid4().hex,
            renewed=now,
            lease=lease_seconds() if lease is None else float(lease),
        )

    @classmethod
    def from_dict(cls, d: Any) -> LockHolder | None:
        if not isinstance(d, dict) or "host" not in d or "pid" not in d:
            return None
        try:
            lease = d.get("lease")
            lease = float(lease) if lease is not None else None
            return cls(
                host=str(d["host"]),
                pid=int(d["pid"]),
                started=str(d.get("started", "?")),
                process_started=d.get("process_started"),
                boot_id=str(d.get("boot_id", "")),
                user=str(d.get("user", "")),
                token=str(d.get("token", "")),
                renewed=str(d.get("renewed") or ""),
                lease=lease if lease is not None and lease > 0 else None,
            )
        except (TypeError, ValueError):
            return None

    def describe(self) -> str:
        who = f" by {self.user}" if self.user else ""
        return f"host {self.host}, pid {self.pid}, started {self.started}{who}"

    def describe_renewal(self) -> str:
        """The holder, its last renewal and its lease, for the line that breaks it."""
        last = (
            f"last renewed {self.renewed}"
            if self.renewed
            else "never renewed (a lock of an earlier release)"
        )
        return f"{self.describe()}, {last}, lease {self.lease_s:g} s"

    @property
    def lease_s(self) -> float:
        """The lease this record was taken with (an earlier release's: the default)."""
        return self.lease if self.lease is not None else float(LEASE_SECONDS)

    def silent_for(self, now: float | None = None) -> float | None:
        """Seconds since the holder last renewed (or took) the lock; None: unreadable."""
        last = _epoch(self.renewed) if self.renewed else None
        last = last if last is not None else _epoch(self.started)
        if last is None:
            return None
        return (time.time() if now is None else now) - last

    def expired(self, now: float | None = None) -> bool:
        """Not renewed within its lease (a record whose times cannot be read: not)."""
        silent = self.silent_for(now)
        return silent is not None and silent > self.lease_s

    def renewal(self, offset: float = 0.0) -> LockHolder:
        """This record renewed now (``offset``: this host's clock less the store's)."""
        return dataclasses.replace(self, renewed=_now_iso(offset))

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


def _record(holder: LockHolder) -> bytes:
    return json.dumps(asdict(holder), indent=1).encode()


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


def _lock_loc(out: Location) -> Location:
    return out.child(LOCK_NAME)


def _read_text(out: Location) -> str | None:
    """The lock's text (None: no lock). Raises IsADirectoryError when it is a folder."""
    loc = _lock_loc(out)
    try:
        if loc.is_local:
            # never through a link: a linked lock file is not ours (refused when taking it)
            fd = os.open(loc.local_path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                if stat.S_ISDIR(os.fstat(f.fileno()).st_mode):
                    raise IsADirectoryError(errno.EISDIR, "a folder", str(loc))
                return f.read(1 << 20).decode("utf-8", errors="replace")
        loc.refresh()  # written and removed by other processes
        if not loc.exists():
            return None
        if loc.fs.isdir(loc.fs_path):
            raise IsADirectoryError(errno.EISDIR, "a folder", str(loc))
        # one ranged GET, not a file object: s3fs's file pins the ETag it first saw, so a
        # renewal between its HEAD and its GET failed the read ("FileExpired")
        data = loc.fs.cat_file(loc.fs_path, start=0, end=1 << 20)
        return data.decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise


def _inspect(out: Location) -> tuple[LockHolder | None, str | None]:
    """``(holder, None)`` for a lock record of ours (holder None: no lock, or an empty
    one); ``(None, what)`` for a lock path holding something else, ``what`` saying what."""
    try:
        text = _read_text(out)
    except IsADirectoryError:
        return None, "a folder"
    if text is None or not text.strip():
        return None, None
    try:
        data = json.loads(text)
    except ValueError:
        return None, "not JSON"
    holder = LockHolder.from_dict(data)
    if holder is None:
        return None, "JSON that is not a kpca-dask lock record (no host and pid)"
    return holder, None


def read_lock(out: Location) -> LockHolder | None:
    """The recorded holder of ``out``'s lock, or None (no lock, an empty one, or one
    that is not ours)."""
    return _inspect(out)[0]


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
    """``("free" | "held" | "stale" | "expired" | "foreign" | "alien", holder)`` of
    ``out``'s lock.

    held: a live process on this host holds it; stale: its holder on this host is gone;
    expired: its holder (on another host) has not renewed it within its lease; foreign:
    held from another host within its lease; alien: the lock path holds something that
    is not a lock record of ours (:func:`alien_lock` says what).
    """
    holder, alien = _inspect(out)
    if alien is not None:
        return "alien", None
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
        return ("expired" if holder.expired(store_now(out)) else "foreign"), holder
    if free is True or not alive:
        return "stale", holder
    return "held", holder


def alien_lock(out: Location) -> str | None:
    """What the lock path of ``out`` holds when it is not a lock record of ours."""
    return _inspect(out)[1]


def _alien_message(out: Location, what: str) -> str:
    return (
        f"{_lock_loc(out)} is not a lock written by kpca-dask ({what}), so no run can take "
        f"the lock of {out}; if no kpca run is writing there, remove it with "
        f"`kpca unlock --force {out}` and re-run."
    )


def _locked_message(out: Location, holder: LockHolder | None, foreign: bool) -> str:
    who = holder.describe() if holder else "an unknown holder"
    if foreign:
        silent = holder.silent_for(store_now(out)) if holder else None
        left = ""
        if holder is not None and silent is not None:
            until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
                seconds=max(0.0, holder.lease_s - silent)
            )
            left = f"; it expires at {until.isoformat(timespec='seconds')} unless renewed"
        return (
            f"output {out} is locked by a run on another host ({who}{left}); a run "
            f"that is no longer running stops renewing it and the next run breaks it once "
            f"its lease lapses -- to break it now, `kpca unlock {out}`."
        )
    return (
        f"output {out} is locked by a running job ({who}); wait for it to finish or "
        "choose another output.path (concurrent runs to one output are refused)."
    )


def check_unlocked(out: Location) -> None:
    """Raise OutputLockedError if another live run holds ``out``'s lock (or the lock
    path holds something that is not ours)."""
    status, holder = lock_status(out)
    if status == "held" and (holder is None or holder.token not in _HELD.values()):
        raise OutputLockedError(_locked_message(out, holder, foreign=False))
    if status == "foreign":
        raise OutputLockedError(_locked_message(out, holder, foreign=True))
    if status == "alien":
        raise OutputLockedError(_alien_message(out, alien_lock(out) or "unreadable"))


def _warn_broken(out: Location, status: str, old: LockHolder | None) -> None:
    """The one line saying a dead holder's lock is being broken."""
    if status == "expired" and old is not None:
        logger.warning(
            "lock: breaking the expired lock of %s: its holder (%s) has not renewed it for "
            "%.0f s",
            out,
            old.describe_renewal(),
            old.silent_for(store_now(out)) or 0.0,
        )
    else:
        logger.warning(
            "lock: breaking the stale lock of %s: its holder (%s) is no longer running",
            out,
            old.describe() if old else "?",
        )


def break_lock(out: Location | str, *, force: bool = False) -> LockHolder | None:
    """Remove ``out``'s lock (what ``kpca unlock`` does); returns the old holder.

    Refused (OutputLockedError) when the holder is a live process on this host, and --
    unless ``force`` (``kpca unlock --force``) -- when the lock path holds something
    that is not a lock record of ours (which ``force`` removes, folder or file).
    """
    out = out if isinstance(out, Location) else Location(str(out))
    loc = _lock_loc(out)
    if loc.is_local and os.path.islink(loc.local_path):
        from pipeline.errors import RunError

        raise RunError(
            f"{loc} is a symbolic link, not a lock file of ours; remove the link "
            "yourself (kpca never removes or writes through links) and re-run."
        )
    status, holder = lock_status(out)
    if status == "held":
        raise OutputLockedError(
            f"output {out} is locked by a live process "
            f"({holder.describe() if holder else '?'}); "
            "stop that run first (the lock is released when it exits)."
        )
    if status == "alien":
        what = alien_lock(out) or "unreadable"
        if not force:
            raise OutputLockedError(_alien_message(out, what))
        loc.remove(root=out, owned=lambda p: True)
        logger.warning("lock: removed %s (%s, not a lock of kpca-dask: --force)", loc, what)
        return None
    if loc.exists():
        loc.remove(root=out, owned=_lock_owned(loc))
        logger.warning(
            "lock: broke the lock of %s (held by %s)",
            out,
            holder.describe() if holder else "nobody recorded",
        )
    return holder


def _remove_stale_probes(out: Location) -> None:
    """The next writer of ``out`` removes the visibility probe files a killed run, or a
    worker that answered too late, left in the output and its work folder (only ours,
    by name, and only those older than any probe lasts: pipeline/runtime/probe_files.py)."""
    from pipeline.runtime import remove_stale_probes

    from .layout import WORK

    for loc in (out, out.child(WORK)):
        remove_stale_probes(loc)


class _Renewer(threading.Thread):
    """The heartbeat of one held lock: renews it every third of its lease until stopped."""

    def __init__(self, lock: RunLock):
        super().__init__(name=f"kpca-lock-renewal {lock.out}", daemon=True)
        self.lock = lock
        self.stop_event = threading.Event()

    def run(self) -> None:
        lock = self.lock
        while not self.stop_event.wait(lock.lease / 3):
            if lock._lost is not None:
                return
            lock.renew()

    def stop(self) -> None:
        self.stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=30)


class RunLock:
    """Context manager holding ``<out>/.kpca-run.lock`` for one run, renewing it.

    >>> with RunLock(Location("out")):   # doctest: +SKIP
    ...     run the stages

    :attr:`holder` is the record this run holds; once the lock is lost (renewal found
    it replaced or removed, or could not renew it within the lease) it is that record
    with a token no lock carries, so any check of the token (pipeline/output/versions.py
    before publishing) refuses.
    """

    def __init__(self, out: Location, *, lease: float | None = None):
        self.out = out
        self.loc = _lock_loc(out)
        self._holder: LockHolder | None = None
        self._fd: int | None = None
        self._lease = lease
        self._version = ""  # the object-store version of the record this run last wrote
        self._renewed_at = 0.0  # time.monotonic() of the last successful renewal
        self._lost: str | None = None  # why the lock was lost
        self._renewer: _Renewer | None = None
        self._io = threading.Lock()  # renewal and release never write at once
        self._offset = 0.0  # this host's clock less the store's (store_offset)

    # ------------------------------------------------------------------ holder
    @property
    def lease(self) -> float:
        return self._holder.lease_s if self._holder is not None else lease_seconds()

    @property
    def holder(self) -> LockHolder | None:
        h = self._holder
        if h is None:
            return None
        if self._lost is None and time.monotonic() - self._renewed_at > self.lease:
            self._lose(f"not renewed for {time.monotonic() - self._renewed_at:.0f} s")
        if self._lost is not None:
            return dataclasses.replace(h, token=f"lost:{h.token}")
        return h

    @holder.setter
    def holder(self, value: LockHolder | None) -> None:
        self._holder = value

    @property
    def lost(self) -> str | None:
        """Why this run lost its lock (None: it holds it, or holds none)."""
        self.holder  # noqa: B018 - notices a lapsed lease
        return self._lost

    def _lose(self, why: str) -> None:
        if self._lost is None:
            self._lost = why
            logger.warning(
                "lock: lost the lock of %s (%s); this run will publish nothing",
                self.out,
                why,
            )

    def renew(self) -> bool:
        """Renew the lock now (the heartbeat does, every third of the lease); False
        when it was lost (replaced or removed by another writer, or lapsed)."""
        with self._io:
            h = self._holder
            if h is None or self._lost is not None:
                return False
            if time.monotonic() - self._renewed_at > self.lease:
                self._lose(f"not renewed within its lease of {self.lease:g} s")
                return False
            new = h.renewal(self._offset)
            try:
                ok = self._write_renewal(new)
            except Exception as exc:  # noqa: BLE001 - retried at the next renewal
                logger.warning(
                    "lock: could not renew the lock of %s (%s: %s); retrying",
                    self.out,
                    type(exc).__name__,
                    " ".join(str(exc).split())[:200],
                )
                return True
            if not ok:
                now = read_lock(self.out)
                self._lose(
                    "taken by another writer: "
                    + (now.describe() if now is not None else "removed")
                    if now is None or now.token != h.token
                    else "replaced"
                )
                return False
            self._holder = new
            self._renewed_at = time.monotonic()
            return True

    def _write_renewal(self, new: LockHolder) -> bool:
        data = _record(new)
        if self._fd is not None:
            path = self.loc.local_path
            try:
                same = os.fstat(self._fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                return False
            now = read_lock(self.out)
            if not same or now is None or now.token != new.token:
                return False
            # written over in place, then cut to length: never empty for a reader
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
            os.fsync(self._fd)
            return True
        if not _replace_object(self.loc, data, self._version):
            return False
        self._version = _object_version(self.loc)
        return True

    # ------------------------------------------------------------------ local
    def _acquire_local(self) -> None:
        import fcntl

        path = self.loc.local_path
        for _ in range(10):
            try:
                # O_NOFOLLOW: a linked lock file must never truncate what it points to
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno == errno.EISDIR:
                    raise OutputLockedError(_alien_message(self.out, "a folder")) from None
                if exc.errno != errno.ELOOP:
                    raise
                from pipeline.errors import RunError

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
            old, alien = _inspect(self.out)
            if alien is not None:
                os.close(fd)
                raise OutputLockedError(_alien_message(self.out, alien))
            if old is not None:
                alive = old.alive()
                if alive is None and old.expired(store_now(self.out)):
                    _warn_broken(self.out, "expired", old)
                elif alive is None or (alive and not flock_ok):
                    os.close(fd)
                    raise OutputLockedError(
                        _locked_message(self.out, old, foreign=alive is None)
                    )
                else:
                    _warn_broken(self.out, "stale", old)
            self._holder = LockHolder.me(self._lease, self._offset)
            data = _record(self._holder)
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
            self._holder = LockHolder.me(self._lease, self._offset)
            if create_object(self.loc, _record(self._holder)):
                self._version = _object_version(self.loc)
                now = read_lock(self.out)
                if now is None or now.token != self._holder.token:
                    raise OutputLockedError(_locked_message(self.out, now, foreign=True))
                return
            status, old = lock_status(self.out)
            if status in ("held", "foreign"):
                raise OutputLockedError(
                    _locked_message(self.out, old, foreign=status == "foreign")
                )
            if status == "alien":
                raise OutputLockedError(
                    _alien_message(self.out, alien_lock(self.out) or "unreadable")
                )
            if status in ("stale", "expired"):
                _warn_broken(self.out, status, old)
                again = read_lock(self.out)
                if (again.token if again else None) == (old.token if old else None):
                    self.loc.remove(root=self.out, owned=_lock_owned(self.loc))
        self._holder = None
        raise OutputLockedError(
            f"could not take the lock of {self.out} (it keeps changing); "
            "another run is starting there."
        )

    def acquire(self) -> RunLock:
        if self.out.exists() and self.out.is_local and not self.out.local_path.is_dir():
            from pipeline.errors import RunError

            raise RunError(
                f"output path {self.out} is a file, not a folder; choose another output.path."
            )
        self.out.makedirs()
        self._offset = store_offset(self.out)
        self._lost = None
        self._renewed_at = time.monotonic()
        if self.loc.is_local:
            self._acquire_local()
        else:
            self._acquire_remote()
        self._renewed_at = time.monotonic()
        _HELD[self.loc.url] = self._holder.token
        self._renewer = _Renewer(self)
        self._renewer.start()
        _remove_stale_probes(self.out)
        logger.info(
            "lock: %s held (%s; lease %g s, renewed every %g s)",
            self.out,
            self._holder.describe(),
            self.lease,
            self.lease / 3,
        )
        return self

    def release(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        if self._holder is None:
            return
        with self._io:
            token = self._holder.token
            if _HELD.get(self.loc.url) == token:
                _HELD.pop(self.loc.url, None)
            try:
                current = read_lock(self.out)
                if current is not None and current.token == token:
                    self.loc.remove(root=self.out, owned=_lock_owned(self.loc))
            finally:
                if self._fd is not None:
                    os.close(self._fd)  # releases the flock
                    self._fd = None
                self._holder = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
