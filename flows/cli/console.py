"""What a command says on stderr besides its result: the progress lines (``kpca <command>:
...``), the interrupt line, and the logging set-up (quiet storage SDKs, Dask and Prefect
imported only once a command's cheap checks passed)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

__all__ = [
    "START_LINES",
    "STORAGE_LOGGERS",
    "interrupt_line",
    "prefect_line",
    "quiet_storage_sdks",
    "say",
    "setup_logging",
    "start_runtime",
]


def say(args: argparse.Namespace, what: str) -> None:
    """One progress line on stderr (``kpca <command>: ...``), unless -q."""
    if not args.quiet:
        print(f"kpca {args.command}: {what}", file=sys.stderr, flush=True)


def prefect_line(mode: str) -> str:
    """What a flow run waits for first: a temporary API server (10-60 s) or the server."""
    if mode == "ephemeral":
        return (
            "starting a temporary Prefect API server for this run (PREFECT_API_URL is not "
            "set; 10-60 s; --no-prefect runs without it)"
        )
    from prefect.settings import get_current_settings

    return f"recording the run at the Prefect API {get_current_settings().api.url}"


#: the first line of the commands that start a cluster or Prefect, before anything else
START_LINES = {
    "demo": lambda a: (
        f"writing the built-in digits data to {Path(a.output).resolve()}-data/, then the run "
        f"to {Path(a.output).resolve()}/"
    ),
    "run": lambda a: f"checking {a.config}, its input and its output",
    "update": lambda a: f"checking {a.run} and {a.new_data}",
    "transform": lambda a: f"embedding {a.input} with {a.model} -> {a.output}",
}


def interrupt_line(args: argparse.Namespace) -> str:
    import signal

    from ..runtime import interrupt_signal

    kept = " (finished stages are kept)" if args.command in ("run", "demo") else ""
    how = "stopped by SIGTERM" if interrupt_signal() == signal.SIGTERM else "interrupted"
    return (
        f"kpca {args.command}: {how} after {time.perf_counter() - args.t0:.0f} s{kept}; "
        "re-run the same command to resume."
    )


def setup_logging(args: argparse.Namespace) -> None:
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    if args.command in ("demo", "run", "update") and args.verbose == 0 and not args.quiet:
        level = logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"
    )
    quiet_storage_sdks(args.verbose)


#: loggers of the object-store clients: the Azure SDK logs every request's headers at INFO
#: (azure.core.pipeline.policies.http_logging_policy), thousands of lines for one run
STORAGE_LOGGERS = (
    "azure",
    "adlfs",
    "gcsfs",
    "google",
    "google_auth_httplib2",
    "s3fs",
    "botocore",
    "aiobotocore",
    "boto3",
    "urllib3",
    "aiohttp",
    "fsspec",
)


def quiet_storage_sdks(verbose: int = 0) -> None:
    """Storage SDK logging: warnings only at the default level, their INFO at -v, their
    DEBUG at -vv."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    for name in STORAGE_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if verbose == 0:  # their retry tracebacks repeat the command's one error line
            logger.addFilter(_without_traceback)


def _without_traceback(record: logging.LogRecord) -> bool:
    record.exc_info = None
    record.exc_text = None
    return True


def start_runtime(args: argparse.Namespace) -> None:
    """Import (and quieten) Dask and, for a flow, Prefect: called by a command once its
    cheap checks passed, so that a wrong path is reported before any of this starts."""
    import distributed  # noqa: F401  (configures its loggers on import; quieten them after)

    if getattr(args, "prefect", False):
        from ..runtime import quiet_prefect

        quiet_prefect()
    from ..runtime import quiet_libraries

    quiet_libraries(args.verbose)
