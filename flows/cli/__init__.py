"""The ``kpca`` command line: a thin shell over the pipeline (and its Prefect flows).

    kpca demo [--output DIR]           the whole job on a built-in labelled dataset
    kpca run CONFIG [--output DIR]     the job a YAML config describes
    kpca validate CONFIG               the checks `kpca run` makes before anything starts
    kpca transform MODEL INPUT OUTPUT  embed new data with a saved model (or run folder)
    kpca info ARTIFACT_DIR             what a run produced, after verifying it
    kpca update RUN NEW_DATA           a new run from a published run and new rows
    kpca unlock OUTPUT_DIR             break the lock a dead run left on its output
    kpca drain POOL [--worker-pid P]   stop a Prefect worker once its flow runs finish
    kpca migrate OUTPUT_DIR            an earlier release's output brought to versions/
    kpca --version

Global flags (-v/--verbose, -q/--quiet) go before or after the subcommand. ``kpca run``
first checks the config, the input (every row, streaming) and the output
(pipeline/data/validate.py), and only then starts Prefect and Dask: a wrong path, column or
type is one line per problem, in about a second, and leaves nothing behind.

Exit status by the error taxonomy (pipeline/errors.py): errors in the input, the
config or the artifacts print one line naming the problem and the fix and exit with 2
(nothing is published); a failure of the environment (I/O, network, lost workers) prints
one line and exits with 1 (re-running resumes); an unexpected exception is a bug: its
traceback is kept and the status is 70 (EX_SOFTWARE). Ctrl-C (SIGINT) stops a run within a
few seconds with status 130, SIGTERM (a scheduler, Kubernetes, systemd) likewise with 143:
one line, every process the command started (the local Dask workers, a temporary Prefect
server) stopped, and re-running resumes from the finished stages.

The package: ``parser`` declares the arguments, ``commands_*`` run them (one module per
command or family of commands), ``exits`` turns an exception into a line and a status,
``console`` holds the progress lines and the logging set-up; :func:`main` ties them
together. ``python -m flows.cli`` runs the same :func:`main` as the ``kpca`` script.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .commands_info import feature_lines
from .commands_run import prestart_checks
from .console import (
    START_LINES,
    interrupt_line,
    quiet_storage_sdks,
    say,
    setup_logging,
    start_runtime,
)
from .exits import (
    EXIT_BUG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    command_location,
    report_error,
)
from .parser import build_parser, parse_args

__all__ = [
    "EXIT_BUG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "build_parser",
    "feature_lines",
    "main",
    "parse_args",
    "prestart_checks",
    "quiet_storage_sdks",
    "report_error",
    "start_runtime",
]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args)
    args.t0 = time.perf_counter()
    if args.command in START_LINES:  # within a second or two: the imports come later
        say(args, START_LINES[args.command](args))
    from ..runtime import handle_interrupts

    try:
        # SIGTERM like Ctrl-C, from the first line on (a flow installs its own meanwhile)
        with handle_interrupts(lambda: interrupt_line(args)):
            if args.command not in ("run", "demo", "validate"):  # those start it themselves
                start_runtime(args)
            return args.func(args)
    except KeyboardInterrupt:
        return _interrupted(args)
    except Exception as exc:  # noqa: BLE001 - classified by the taxonomy, bugs re-shown
        from ..runtime import interrupted

        if interrupted():  # Prefect reports the interrupted flow as its own exception
            return _interrupted(args)
        return report_error(args.command, exc, command_location(args))


def _interrupted(args: argparse.Namespace) -> int:
    from ..runtime import interrupt_status, report_interrupt, stop_children

    if os.environ.get("KPCA_DEBUG_INTERRUPT"):
        from ..runtime import _INTERRUPT

        at = _INTERRUPT["at"]
        print(f"unwound in {time.monotonic() - at if at else -1:.2f} s", file=sys.stderr)

    report_interrupt(interrupt_line(args))
    # what the unwinding did not stop (a temporary Prefect server, cluster workers) goes
    # now: nothing the command started outlives it
    stop_children(timeout=1.0)
    return interrupt_status()
