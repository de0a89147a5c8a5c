"""Exit codes and how an exception becomes one (the error taxonomy, pipeline/errors.py).

Errors in the input, the config or the artifacts print one line naming the problem and
the fix and exit with 2 (nothing is published); a failure of the environment (I/O,
network, lost workers) prints one line and exits with 1 (re-running resumes); an
unexpected exception is a bug: its traceback is kept and the status is 70 (EX_SOFTWARE).
Ctrl-C exits with 130, SIGTERM with 143 (flows/runtime.py).
"""

from __future__ import annotations

import argparse
import sys

from pipeline.errors import is_transient, is_user_error

__all__ = [
    "EXIT_BUG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "command_location",
    "report_error",
]

EXIT_USAGE = 2  # the user can fix it: config, input, artifacts, output location
EXIT_FAILED = 1  # the environment failed (I/O, network, workers): re-run to resume
EXIT_BUG = 70  # an unexpected exception (sysexits.h EX_SOFTWARE): report it
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT): re-running resumes
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM), handled as Ctrl-C


def report_error(command: str, exc: Exception, where: str = "") -> int:
    """Print what went wrong as the taxonomy says (pipeline/errors.py); the exit status."""
    from pipeline.verify import describe_store_failure

    store = (
        None
        if _environment_error(exc)
        or (is_user_error(exc) and not isinstance(exc, PermissionError))
        else describe_store_failure(exc, where)
    )
    if store is not None:  # the store failed: the environment (exit 1), one line
        print(f"kpca {command}: error: {store}", file=sys.stderr)
        return EXIT_FAILED
    findings = getattr(exc, "findings", None)
    if findings and is_user_error(exc):  # the pre-start checks: one line per problem
        for f in findings:
            print(f"kpca {command}: error: {f.message}", file=sys.stderr)
        return EXIT_USAGE
    if is_user_error(exc):
        msg = _user_message(exc).strip().splitlines()
        print(
            f"kpca {command}: error: {msg[0] if msg else type(exc).__name__}", file=sys.stderr
        )
        for line in msg[1:]:
            print(f"  {line}", file=sys.stderr)
        return EXIT_USAGE
    line = _environment_error(exc)
    if line is not None:  # the machine or cluster, with a fix to name
        print(f"kpca {command}: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    if is_transient(exc):
        from pipeline.verify import endpoint_hint

        print(
            f"kpca {command}: error: {type(exc).__name__}: {exc} (I/O, network or lost "
            f"workers){endpoint_hint(exc)}; re-run the same command to resume.",
            file=sys.stderr,
        )
        return EXIT_FAILED
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    print(
        f"kpca {command}: internal error ({type(exc).__name__}): a bug in kpca-dask, not "
        "in your input; please report it with the traceback above.",
        file=sys.stderr,
    )
    return EXIT_BUG


def _user_message(exc: BaseException) -> str:
    """The error's message; pydantic's (a parameter given on the command line) in the
    config's words: the field and the problem, without pydantic's URLs."""
    from pydantic import ValidationError

    from pipeline.config import format_validation_error

    if isinstance(exc, ValidationError):
        return format_validation_error(exc, "the command-line arguments")
    if type(exc).__name__ == "NoCredentialsError":  # botocore: no credentials anywhere
        return (
            f"{exc}: the object store needs credentials; set them in the environment "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) or give the "
            'pods an identity, or pass {"anon": true} in the storage options of a public '
            "bucket."
        )
    return str(exc)


def command_location(args: argparse.Namespace) -> str:
    """The location a command works on (for a store failure that names no object)."""
    for name in ("location", "artifact_dir", "output_dir", "output", "run"):
        v = getattr(args, name, None)
        if isinstance(v, str) and v:
            return v
    return ""


_DISK_FULL = {"ENOSPC", "EDQUOT", "EFBIG"}


def _disk_full(exc: BaseException) -> str | None:
    """One line for a full disk / exceeded quota / file size limit, else None."""
    import errno

    if isinstance(exc, OSError) and errno.errorcode.get(exc.errno or -1) in _DISK_FULL:
        where = f" writing {exc.filename}" if exc.filename else ""
        return (
            f"out of disk space{where} ({exc.strerror or exc}); free space or set "
            "output.path to a bigger disk, then re-run the same command to resume."
        )
    return None


def _environment_error(exc: BaseException) -> str | None:
    """One line for a failure of the machine or cluster rather than of the code: a full
    disk, or workers that kept dying on one task (out of memory, as a rule). None: a bug."""
    line = _disk_full(exc)
    if line is None and isinstance(exc, OSError) and exc.errno == 30:  # EROFS
        where = f" {exc.filename}" if exc.filename else ""
        line = (
            f"cannot write{where}: the file system is read-only; set output.path (or "
            "--output) to a writable folder."
        )
    if line is None and type(exc).__name__ == "KilledWorker":
        from dask.utils import key_split

        task = key_split(exc.args[0]) if exc.args else "?"
        tries = exc.args[2] + 1 if len(exc.args) > 2 else "several"
        line = (
            f"{tries} workers died running a {task!r} task (out of memory, as a rule); "
            "give the workers more memory (cluster.memory_limit) or use smaller chunks "
            "(chunks.block_rows, chunks.target_chunk_mb), then re-run the same command to "
            "resume."
        )
    return line
