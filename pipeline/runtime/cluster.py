"""Connect to the configured Dask cluster, or start a local one sized to this machine."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

from distributed.diagnostics.plugin import WorkerPlugin

from pipeline.config import ClusterConfig
from pipeline.errors import UserError

from .stacks import StacksOnSignal

__all__ = [
    "dask_client",
    "ClusterError",
    "worker_environ",
    "WORKER_MALLOC_ENV",
    "release_worker_memory",
]

logger = logging.getLogger("pipeline")


class ClusterError(UserError, RuntimeError):
    """The scheduler cannot be reached (or has no workers) in time."""


def _security(cfg: ClusterConfig):
    if cfg.tls is None:
        return None
    from distributed import Security

    for f in (cfg.tls.ca_file, cfg.tls.client_cert, cfg.tls.client_key):
        if not os.path.isfile(f):
            raise ClusterError(f"TLS file {f} does not exist (cluster.tls)")
    return Security(
        tls_ca_file=cfg.tls.ca_file,
        tls_client_cert=cfg.tls.client_cert,
        tls_client_key=cfg.tls.client_key,
        require_encryption=True,
    )


#: glibc malloc settings for the workers of a local cluster (see :func:`worker_environ`)
WORKER_MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": 64 << 20, "MALLOC_MMAP_THRESHOLD_": 32 << 20}


def worker_environ() -> dict[str, str]:
    """Environment for worker processes: keep freed kernel-block buffers for reuse.

    distributed starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also freezes
    glibc's mmap threshold at 128 KiB: every block-sized buffer (a stored kernel block is
    16 MB at 2000 rows) is then a fresh ``mmap`` whose pages fault in one by one and are
    zeroed, and is unmapped again when freed: keeping them halves a stored block's pass
    (docs/tuning.md). The price is up to 64 MiB of
    freed heap a worker may keep. A value set in the environment wins, except
    distributed's own 65536, which its nannies copy into the parent's environment.
    """
    env = {}
    for k, v in WORKER_MALLOC_ENV.items():
        mine = os.environ.get(k)
        env[k] = mine if mine not in (None, "", _DISTRIBUTED_DEFAULTS.get(k)) else str(v)
    return env


_DISTRIBUTED_DEFAULTS = {"MALLOC_TRIM_THRESHOLD_": "65536"}


def _malloc_trim() -> int:
    """glibc's ``malloc_trim(0)``: give freed heap pages back to the OS (0 elsewhere)."""
    import ctypes

    try:
        return int(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):  # not glibc
        return 0


def release_worker_memory() -> None:
    """Return the workers' freed heap to the OS between stages (distributed's documented
    remedy for "memory not released back to the OS": ``client.run(malloc_trim)``).

    glibc only trims the top of a heap on its own; the holes the kernel build's
    block-sized buffers leave stay resident. Measured at n = 100k, d = 1024: the two
    workers held 1.0 GiB through the solve after the build; see docs/kernel-store.md
    for what this call changed. A no-op without a distributed client.
    """
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):
        return
    from .liveness import current_timeout, run_on_workers

    try:
        # bounded: a worker that stopped answering is named by the worker watch instead
        _, silent = run_on_workers(client, _malloc_trim, timeout=current_timeout())
        if silent:
            logger.debug("malloc_trim: no answer from %s", ", ".join(silent))
    except Exception as exc:  # never fail a run over housekeeping
        logger.debug("malloc_trim on the workers failed: %s", exc)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` updated for the block (distributed's nannies read it at spawn)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: worker log records a local cluster's user never needs: a failed task's dump (the error
#: reaches the client, where the CLI prints it as one line) and the heartbeat that fails
#: while the cluster shuts down after an error
_QUIET = ("Compute Failed", "Failed to communicate with scheduler during heartbeat")
#: the loggers those records come from (a filter applies to its own logger only)
_QUIET_LOGGERS = ("distributed.worker", "distributed.worker.state_machine")


def _not_a_task_error(record: logging.LogRecord) -> bool:
    msg = str(record.msg)
    # a task cancelled while the cluster closes (an interrupted run: the CLI's one line
    # says it was stopped); the state machine's other warnings stay
    if msg.startswith("Async instruction for") and msg.endswith("ended with CancelledError"):
        return False
    return not msg.startswith(_QUIET)


class QuietTaskErrors(WorkerPlugin):
    """Worker plugin: drop the workers' "Compute Failed" records (a dump of the task and its
    traceback) and shutdown heartbeat noise, so that an error ends in one line. Used for
    local clusters only, whose workers write to the user's terminal; a remote cluster's
    logs are left as they are."""

    name = "kpca-quiet-task-errors"

    def setup(self, worker) -> None:
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).addFilter(_not_a_task_error)

    def teardown(self, worker) -> None:
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).removeFilter(_not_a_task_error)


class PauseWatchdog(threading.Thread):
    """Fail a run when a worker has stayed paused for ``timeout`` s with work pending.

    Dask pauses a worker at 80% of its memory limit until its memory drops. When the
    memory is the worker's own (an interpreter, a freed block the allocator keeps) it never
    drops, and the computation waits forever -- the worst outcome for a job that runs
    unattended. The watchdog cancels the client's pending work with a message naming the
    paused worker(s), the cause and the fix; :func:`dask_client` turns it into a
    :class:`ClusterError`.

    Maintenance note (issue 36): it used to wait for *every* worker to be paused. With
    256 MiB workers one paused worker hung the run while the other stayed active (it
    cannot run the tasks queued on the paused one, nor read the chunks it holds), so the
    watchdog never fired. Now each worker's pause is timed on its own: one worker paused
    beyond the timeout while the run has work pending ends it.
    """

    def __init__(self, client, timeout: float, interval: float = 1.0):
        super().__init__(daemon=True, name="kpca-pause-watchdog")
        self.client, self.timeout, self.interval = client, timeout, interval
        self.tripped: str | None = None
        self._done = threading.Event()
        self._since: dict[str, float] = {}

    def _paused_too_long(self) -> dict[str, object]:
        """{address: memory limit} of the workers paused for ``timeout`` s while the client
        has work pending (and the pause clock of each worker updated)."""
        workers = self.client.scheduler_info()["workers"]
        pending = any(st.status == "pending" for st in list(self.client.futures.values()))
        now = time.monotonic()
        paused = {a for a, w in workers.items() if w.get("status") == "paused"}
        if not pending:
            paused = set()
        for addr in list(self._since):
            if addr not in paused:
                del self._since[addr]
        for addr in paused:
            self._since.setdefault(addr, now)
        return {
            a: workers[a].get("memory_limit")
            for a in sorted(paused)
            if now - self._since[a] >= self.timeout
        }

    def run(self) -> None:
        from dask.utils import format_bytes
        from distributed import Future

        while not self._done.wait(self.interval):
            try:
                stuck = self._paused_too_long()
            except Exception:  # the client is closing, the scheduler is gone: not our call
                stuck = {}
            if not stuck:
                continue
            limit = ", ".join(sorted({format_bytes(m) for m in stuck.values() if m})) or "?"
            try:
                n_workers = len(self.client.scheduler_info()["workers"])
            except Exception:  # noqa: BLE001 - the scheduler went away: name what we saw
                n_workers = len(stuck)
            if len(stuck) >= n_workers:
                who = "every worker has"  # the same line as before issue 36
            elif len(stuck) == 1:
                who = f"Dask worker {next(iter(stuck))} has"
            else:
                who = f"Dask workers {', '.join(stuck)} have"
            self.tripped = (
                f"{who} been paused at its memory limit ({limit}) for "
                f"{self.timeout:g} s with work pending: the run cannot progress. Give the "
                "workers more memory (cluster.memory_limit) or use smaller chunks "
                "(chunks.block_rows, chunks.target_chunk_mb), then re-run the same command "
                "to resume."
            )
            logger.error("%s", self.tripped)
            keys = [k for k, st in list(self.client.futures.items()) if st.status == "pending"]
            with contextlib.suppress(Exception):
                self.client.cancel(
                    [Future(k, self.client) for k in keys],
                    reason="kpca-pause-watchdog",
                    msg=self.tripped,
                )
            return

    def stop(self) -> None:
        self._done.set()


@contextlib.contextmanager
def _watched(client, cfg: ClusterConfig, local: bool = False) -> Iterator[object]:
    """Yield ``client`` with a :class:`PauseWatchdog` (unless ``paused_timeout`` is null)
    and a :class:`pipeline.runtime.liveness.WorkerWatch` (``worker_timeout``)."""
    from .liveness import watching

    dog = None
    if cfg.paused_timeout is not None:
        dog = PauseWatchdog(client, cfg.paused_timeout)
        dog.start()
    try:
        # workers that stop answering, and pauses, named in one line
        # (pipeline/runtime/liveness.py)
        with watching(client, cfg.worker_timeout, local=local):
            yield client
    except BaseException as exc:
        if dog is not None and dog.tripped:
            raise ClusterError(dog.tripped) from exc
        raise
    finally:
        if dog is not None:
            dog.stop()


def _probe(cfg: ClusterConfig, security) -> None:
    """Fail within ``connect_timeout`` when something that is not a Dask scheduler listens
    at ``cfg.address`` (an HTTP server, the dashboard's port): distributed's Client waits
    for its handshake for ever there. A port nobody listens on is left to the Client (its
    own message); only "connected, but no Dask handshake" is decided here."""
    import asyncio
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(cfg.address)
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or parts.port is None:
        return
    try:
        socket.create_connection(
            (parts.hostname, parts.port), timeout=cfg.connect_timeout
        ).close()
    except OSError:
        return  # unreachable: the Client says so in its own words

    async def handshake() -> None:
        from distributed.comm import connect

        args = security.get_connection_args("client") if security is not None else {}
        comm = await asyncio.wait_for(
            connect(cfg.address, timeout=cfg.connect_timeout, **args), cfg.connect_timeout
        )
        await comm.close()

    outcome: list[BaseException | None] = []

    def run() -> None:  # its own thread and loop: the caller may be inside an event loop
        try:
            asyncio.run(handshake())
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    t = threading.Thread(target=run, name="kpca-scheduler-probe", daemon=True)
    t.start()
    t.join(cfg.connect_timeout + 5)
    err = outcome[0] if outcome else TimeoutError("no answer")
    if err is not None:
        # which error ends the wait (our timeout, distributed's, the peer closing) is a race:
        # the detail goes to the log, the message stays the same
        logger.debug("scheduler probe of %s: %s: %s", cfg.address, type(err).__name__, err)
        raise ClusterError(
            f"{cfg.address} accepts connections but did not complete a Dask handshake within "
            f"{cfg.connect_timeout:g} s: another service on that port (the dashboard's?), a "
            "tcp:// address for a TLS scheduler, or certificates the scheduler does not "
            "accept; check cluster.address (the scheduler's port, 8786 by default) and "
            "cluster.tls."
        )


@contextlib.contextmanager
def dask_client(cfg: ClusterConfig) -> Iterator[object]:
    """A ``distributed.Client`` for the run; closes what it started.

    ``cfg.address`` empty: a LocalCluster of worker processes bound to
    127.0.0.1 (one single-threaded worker per core by default, so BLAS threads
    x Dask threads never exceed the cores), dashboard on localhost only.
    Otherwise connect to the scheduler (tcp:// or tls://) and fail within
    ``connect_timeout`` seconds with an actionable message.
    """
    from distributed import Client, LocalCluster

    if cfg.address:
        security = _security(cfg)
        _probe(cfg, security)
        try:
            client = Client(
                cfg.address, security=security, timeout=cfg.connect_timeout, set_as_default=True
            )
        except (OSError, TimeoutError) as exc:
            raise ClusterError(
                f"cannot reach the Dask scheduler at {cfg.address} within "
                f"{cfg.connect_timeout:g} s ({type(exc).__name__}: {exc}); "
                "check cluster.address, that the scheduler is running and that this "
                "machine can reach it (leave cluster.address empty to start a local cluster)."
            ) from exc
        try:
            try:
                client.wait_for_workers(1, timeout=cfg.connect_timeout)
            except TimeoutError as exc:
                raise ClusterError(
                    f"the scheduler at {cfg.address} has no workers after "
                    f"{cfg.connect_timeout:g} s; start workers (dask worker {cfg.address})."
                ) from exc
            logger.info(
                "connected to %s (%d workers); dashboard: %s",
                cfg.address,
                len(client.scheduler_info()["workers"]),
                client.dashboard_link,
            )
            with _watched(client, cfg):
                yield client
        finally:
            client.close()
        return
    from kpca_dask.threads import cpu_count

    n_workers = cfg.n_workers or max(1, cpu_count() // cfg.threads_per_worker)
    # distributed's nannies take these from os.environ before their config, and spawn
    # (and re-spawn after a crash) within the cluster's lifetime: set them for that long
    with (
        _environ(worker_environ()),
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=cfg.threads_per_worker,
            processes=True,
            host="127.0.0.1",
            dashboard_address=cfg.dashboard_address,
            memory_limit=cfg.memory_limit,
            silence_logs=logging.WARNING,
        ) as cluster,
    ):
        with Client(cluster, set_as_default=True) as client:
            if not logging.getLogger("distributed").isEnabledFor(logging.DEBUG):
                client.register_plugin(QuietTaskErrors())
            client.register_plugin(StacksOnSignal())  # a silent worker's stacks, kept
            logger.info(
                "local Dask cluster: %d workers x %d threads; dashboard: %s",
                n_workers,
                cfg.threads_per_worker,
                client.dashboard_link if cfg.dashboard_address else "disabled",
            )
            with _watched(client, cfg, local=True):
                yield client
