"""What the flows need around them: a reachable Prefect API, the library logs in the run log,
one console line per error, the flow run's address, and a Ctrl-C (or SIGTERM) that stops
within seconds, leaving no process behind."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.errors import UserError

__all__ = [
    "INTERRUPT_GRACE",
    "PrefectUnavailableError",
    "announce_flow_run",
    "check_prefect_api",
    "handle_interrupts",
    "interrupted",
    "interrupt_signal",
    "interrupt_status",
    "quiet_prefect",
    "report_interrupt",
    "stop_children",
    "forward_library_logs",
    "LIBRARY_LOGGERS",
    "OneLineRunErrors",
    "RUN_LOGGERS",
    "expected_failure",
    "one_line_run_errors",
    "dashboard_line",
]

#: Stdlib loggers of the layers below, forwarded to the Prefect run log.
LIBRARY_LOGGERS = ("pipeline", "kpca_dask")


class PrefectUnavailableError(UserError, RuntimeError):
    """No Prefect API to record a flow run in (no server configured, ephemeral mode off)."""


#: seconds to wait for an answer from PREFECT_API_URL before calling it unreachable
API_TIMEOUT = 5.0


def check_prefect_api(*, probe: bool = True, timeout: float = API_TIMEOUT) -> str:
    """``"server"`` or ``"ephemeral"``; raise a clear error when neither is possible.

    With ``PREFECT_API_URL`` set, flows run against that server: it must answer (any
    HTTP answer will do; ``probe=False`` skips the request) within ``timeout`` seconds,
    else :class:`PrefectUnavailableError` names the URL and the fix -- instead of a
    traceback from deep inside Prefect's client once the flow starts. Without it
    Prefect starts a temporary local server for the process (ephemeral mode,
    about 12-14 s here), unless ``PREFECT_SERVER_ALLOW_EPHEMERAL_MODE`` is false.
    """
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        if probe:
            _check_reachable(str(settings.api.url), timeout)
        return "server"
    if settings.server.ephemeral.enabled:
        return "ephemeral"
    raise PrefectUnavailableError(
        "no Prefect API to run the flow against: PREFECT_API_URL is not set and ephemeral "
        "mode is disabled (PREFECT_SERVER_ALLOW_EPHEMERAL_MODE=false). Set PREFECT_API_URL "
        "to your server (e.g. http://127.0.0.1:4200/api after `prefect server start`), allow "
        "ephemeral mode, or run the stages without Prefect (`kpca run --no-prefect`)."
    )


def _check_reachable(url: str, timeout: float) -> None:
    import httpx

    health = url.rstrip("/") + "/health"
    try:
        httpx.get(health, timeout=timeout, follow_redirects=True)
    except httpx.HTTPError as exc:  # connection refused, DNS, timeout, TLS
        why = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise PrefectUnavailableError(
            f"the Prefect API at PREFECT_API_URL={url} is not reachable ({type(exc).__name__}: "
            f"{why}); start the server (`prefect server start`), correct PREFECT_API_URL "
            "(or unset it for a temporary local API), or run without Prefect "
            "(`kpca run --no-prefect`)."
        ) from None


class _OneLinePerError(logging.Filter):
    """The console shows an error once: the CLI prints the failure that ends a run, so
    Prefect's own copies (the task's "failed with exception", the flow's "finished in
    state Failed", each with its traceback) are left to the run log on the server. A
    failure that is retried is still shown (without a traceback for a user error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from pipeline.errors import is_user_error

        if record.name.startswith(("prefect.flow_runs", "prefect.task_runs")):
            if record.levelno >= logging.ERROR and "Retry" not in record.getMessage():
                return False
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and is_user_error(exc):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_prefect() -> None:
    """Import Prefect with the settings a command-line run needs, and make its console
    output follow the CLI's contract (one line per error)."""
    # Prefect reads its settings once, on import. A first ephemeral server on a
    # fresh PREFECT_HOME migrates its database before answering, which on a
    # loaded machine takes longer than Prefect's 20 s default; wait longer.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # The temporary API server a command starts lives for that command only: no usage
    # telemetry from it (Prefect's documented switch; offline it logged "Failed to send
    # telemetry" as an ERROR on every run). Set it to true in the environment to keep it.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Nor from Prefect's client: on its first import in a terminal it printed a notice
    # that it collects usage data (a newcomer's first lines of `kpca demo`, though the
    # temporary server above sends none) and sends onboarding events to a server that
    # allows them. DO_NOT_TRACK is the client's documented switch; set it to 0 to keep them.
    os.environ.setdefault("DO_NOT_TRACK", "1")
    import prefect.main  # noqa: F401  (configures Prefect's loggers; filtered after)

    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _OneLinePerError) for f in handler.filters):
            handler.addFilter(_OneLinePerError())


def announce_flow_run(stream=None) -> str | None:
    """Print (stderr) and return the flow run's address in the Prefect UI, when a server
    records it (PREFECT_UI_URL, derived from PREFECT_API_URL); None for an ephemeral API."""
    try:
        from prefect.runtime import flow_run
        from prefect.settings import get_current_settings

        ui = get_current_settings().ui_url
        if not ui or not get_current_settings().api.url or flow_run.id is None:
            return None
        line = flow_run.ui_url
    except Exception:  # noqa: BLE001 - an address is a courtesy, never a failure
        return None
    print(
        f"kpca: Prefect flow run {flow_run.name!r}: {line}",
        file=stream or sys.stderr,
        flush=True,
    )
    return line


# ------------------------------------------------------------------ Ctrl-C, SIGTERM
#: seconds between Ctrl-C (or SIGTERM) and the process's end, whatever is still shutting
#: down (KPCA_INTERRUPT_GRACE overrides it)
INTERRUPT_GRACE = 2.5

#: the signals a run stops on: Ctrl-C, and what schedulers, Kubernetes and systemd send
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_INTERRUPT: dict[str, Any] = {"at": None, "reported": False, "signum": None}


def interrupted() -> bool:
    """Whether SIGINT or SIGTERM was received during :func:`handle_interrupts`."""
    return _INTERRUPT["at"] is not None


def interrupt_signal() -> int | None:
    """The signal that stopped the command (``signal.SIGINT``/``SIGTERM``), or None."""
    return _INTERRUPT["signum"]


def interrupt_status() -> int:
    """The exit status of a stopped command: 128 + the signal (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + int(_INTERRUPT["signum"] or signal.SIGINT)


_REPORT_LOCK = threading.Lock()


def report_interrupt(line: str) -> None:
    """Print the interrupt's one line (stderr), once: from the main thread or the watchdog."""
    with _REPORT_LOCK:
        if not _INTERRUPT["reported"]:
            print(line, file=sys.stderr, flush=True)
            _INTERRUPT["reported"] = True


def stop_children(timeout: float = 0.0) -> None:
    """End this process's own child processes (local Dask workers, the ephemeral Prefect
    server and its workers), by pid: they would otherwise outlive this process (re-parented
    to init). With ``timeout``, ask them first (SIGTERM) and wait that long before
    killing the rest."""
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001
        return
    if timeout > 0:
        for child in children:
            with contextlib.suppress(Exception):
                child.terminate()
        with contextlib.suppress(Exception):
            _, children = psutil.wait_procs(children, timeout=timeout)
    for child in children:
        with contextlib.suppress(Exception):
            child.kill()


@contextlib.contextmanager
def handle_interrupts(
    message: Callable[[], str] | None = None, grace: float | None = None
) -> Iterator[None]:
    """Ctrl-C or SIGTERM stops the run within ``grace`` seconds, with status 130 / 143.

    The first signal raises KeyboardInterrupt in the main thread (SIGTERM as SIGINT
    does), so the stage in progress, the run lock and the publishing transaction unwind;
    a watchdog ends the process (status 128 + signal, its children by pid) if that -- or
    a Prefect engine reporting the crash, a cluster closing, the ephemeral server
    stopping -- takes longer than ``grace``. A second signal ends it at once. Finished
    stages are on disk, so running the same command again resumes.

    A flow run in this process installs Prefect's own SIGTERM handler while it runs
    (it raises ``TerminationSignal``, reports the crash, puts the previous handler back
    and sends SIGTERM again), so a SIGTERM during a flow reaches this handler too, after
    Prefect recorded the run as crashed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if grace is None:
        grace = float(os.environ.get("KPCA_INTERRUPT_GRACE", INTERRUPT_GRACE))

    def stop_now() -> None:
        report_interrupt(
            message() if message else "kpca: interrupted; re-run the same command to resume."
        )
        stop_children()
        sys.stderr.flush()
        os._exit(interrupt_status())

    def watchdog() -> None:
        while time.monotonic() < _INTERRUPT["at"] + grace:
            time.sleep(0.05)
        stop_now()

    def on_signal(signum, frame):
        if _INTERRUPT["at"] is not None:  # a second signal: no more waiting
            stop_now()
        _INTERRUPT["at"] = time.monotonic()
        _INTERRUPT["signum"] = signum
        # what unwinds now (a client losing its futures, a cluster closing, Prefect
        # recording a crash) would log its own errors: the CLI's one line says it all
        logging.disable(logging.CRITICAL)
        # ... and so would Prefect's API log worker, which writes "--- Error logging to
        # API ---" straight to stderr (not through a logger) when the ephemeral server it
        # sends to was stopped first; it, like the stdlib's handlers, writes only while
        # ``logging.raiseExceptions`` is set
        logging.raiseExceptions = False
        threading.Thread(target=watchdog, name="kpca-interrupt", daemon=True).start()
        raise KeyboardInterrupt

    old = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        if _INTERRUPT["at"] is None:  # after an interrupt, keep it until the process ends
            for signum, handler in old.items():
                signal.signal(signum, handler)


#: set once the libraries' loggers were set for this process (by the CLI or a flow run)
_QUIETED = {"done": False}


def quiet_libraries(verbose: int = 0) -> None:
    """The libraries' loggers at the CLI's levels: WARNING (``-vv``: DEBUG), and at the
    default verbosity none of their routine noise: distributed's shuffle lines of a local
    cluster's in-process scheduler (ingest), its "Sending large graph" warnings (the
    model's rows travel to the workers once, not in every graph: kpca_dask.estimator; what
    is left is the data's own size) and a dashboard on another port than 8787 (the stage
    log names the address it got). ``-v`` shows the warnings."""
    import warnings

    import distributed  # noqa: F401  (configures its loggers on import; set them after)

    for noisy in ("distributed", "prefect", "httpx", "asyncio", "tornado"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose >= 2 else logging.WARNING)
    if verbose == 0:
        logging.getLogger("distributed.shuffle._scheduler_plugin").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        warnings.filterwarnings(
            "ignore", message="Port .* is already in use", category=UserWarning
        )
    _QUIETED["done"] = True


#: Prefect's loggers of flow and task runs (the run log a worker prints and sends)
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


def expected_failure(exc: BaseException) -> bool:
    """Whether a failure is one the taxonomy (pipeline/errors.py) names in one line: the
    user's input or config, or the environment (I/O, network, lost workers, a full disk).
    Anything else is a bug, whose traceback is kept."""
    from pipeline.errors import is_transient, is_user_error

    if is_user_error(exc) or is_transient(exc):
        return True
    return type(exc).__name__ == "KilledWorker"


class OneLineRunErrors(logging.Filter):
    """A failed flow run logs its error once, in one line.

    Prefect logs the exception that ends a run up to three times, each with a full
    traceback: the task's "Task run failed with exception", the flow's "Encountered
    exception during execution" and the engine's "Engine execution exited with unexpected
    exception" (a worker's log showed two full tracebacks per failed night). On the run
    loggers (so the console a worker prints and the run log on the server alike) the
    first record of an exception is kept and the later ones are dropped; for an expected
    failure (:func:`expected_failure`) its traceback is dropped too -- its message is the
    one line naming the cause and the fix. A bug keeps one traceback. Prefect's state
    message ("Finished in state Failed(...)") is untouched."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: collections.deque[tuple[str, str]] = collections.deque(maxlen=32)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return True
        key = (type(exc).__name__, str(exc))
        if "Retry" not in record.getMessage():  # each retry of a task is shown
            if key in self._seen:
                return False
            self._seen.append(key)
        if expected_failure(exc):
            record.exc_info, record.exc_text = None, None
        return True


def one_line_run_errors() -> None:
    """Install :class:`OneLineRunErrors` on Prefect's run loggers (once per process)."""
    for name in RUN_LOGGERS:
        lg = logging.getLogger(name)
        if not any(isinstance(f, OneLineRunErrors) for f in lg.filters):
            lg.addFilter(OneLineRunErrors())


@contextlib.contextmanager
def forward_library_logs(names: tuple[str, ...] = LIBRARY_LOGGERS) -> Iterator[None]:
    """Send the ``pipeline``/``kpca_dask`` stdlib loggers to the Prefect run log meanwhile.

    The same as listing them in ``PREFECT_LOGGING_EXTRA_LOGGERS`` (which also
    works and is then left alone), but scoped to the flow run: outside a run
    Prefect's API handler would warn on every record.
    """
    from prefect.logging.handlers import APILogHandler

    # Prefect logs the run's failure after this context has ended: the filter stays
    one_line_run_errors()
    if not _QUIETED["done"]:
        # a flow run a Prefect worker started (a deployment) has not been through the
        # CLI: its console and run log get the CLI's default levels too, not
        # distributed's INFO lines for every cluster event
        quiet_libraries(0)
    added: list[tuple[logging.Logger, logging.Handler]] = []
    levels: list[tuple[logging.Logger, int]] = []
    for name in names:
        lg = logging.getLogger(name)
        if not any(isinstance(h, APILogHandler) for h in lg.handlers):
            h = APILogHandler()
            lg.addHandler(h)
            added.append((lg, h))
        if lg.getEffectiveLevel() > logging.INFO:  # stage progress is INFO
            levels.append((lg, lg.level))
            lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg, h in added:
            lg.removeHandler(h)
        for lg, level in levels:
            lg.setLevel(level)


def dashboard_line(client: Any) -> str:
    """One line naming the cluster, its workers and the dashboard link."""
    try:
        info = client.scheduler_info()
        workers = len(info.get("workers", {}))
        address = info.get("address", "?")
    except Exception:  # pragma: no cover - a dying scheduler must not fail the log line
        workers, address = 0, "?"
    link = client.dashboard_link if client.dashboard_link else "disabled"
    return f"Dask scheduler {address} with {workers} workers; dashboard: {link}"
