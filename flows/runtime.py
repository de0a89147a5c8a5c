"""What the flows need around them: a Prefect API, and the library logs in the run log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from pipeline.errors import UserError

__all__ = [
    "PrefectUnavailableError",
    "check_prefect_api",
    "forward_library_logs",
    "LIBRARY_LOGGERS",
    "dashboard_line",
]

#: Stdlib loggers of the layers below, forwarded to the Prefect run log.
LIBRARY_LOGGERS = ("pipeline", "kpca_dask")


class PrefectUnavailableError(UserError, RuntimeError):
    """No Prefect API to record a flow run in (no server configured, ephemeral mode off)."""


def check_prefect_api() -> str:
    """``"server"`` or ``"ephemeral"``; raise a clear error when neither is possible.

    With ``PREFECT_API_URL`` set, flows run against that server. Without it
    Prefect starts a temporary local server for the process (ephemeral mode,
    about 12-14 s here), unless ``PREFECT_SERVER_ALLOW_EPHEMERAL_MODE`` is false.
    """
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return "server"
    if settings.server.ephemeral.enabled:
        return "ephemeral"
    raise PrefectUnavailableError(
        "no Prefect API to run the flow against: PREFECT_API_URL is not set and ephemeral "
        "mode is disabled (PREFECT_SERVER_ALLOW_EPHEMERAL_MODE=false). Set PREFECT_API_URL "
        "to your server (e.g. http://127.0.0.1:4200/api after `prefect server start`), allow "
        "ephemeral mode, or run the stages without Prefect (`kpca run --no-prefect`)."
    )


@contextlib.contextmanager
def forward_library_logs(names: tuple[str, ...] = LIBRARY_LOGGERS) -> Iterator[None]:
    """Send the ``pipeline``/``kpca_dask`` stdlib loggers to the Prefect run log meanwhile.

    The same as listing them in ``PREFECT_LOGGING_EXTRA_LOGGERS`` (which also
    works and is then left alone), but scoped to the flow run: outside a run
    Prefect's API handler would warn on every record.
    """
    from prefect.logging.handlers import APILogHandler

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
