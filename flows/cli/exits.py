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

from pipeline.errors import is_transient, is_user_error, quota_failure

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
    store = _store_line(exc, where)
    if store is not None:  # the store failed: the environment (exit 1), one line
        print(f"kpca {command}: error: {_quota_line(exc, store) or store}", file=sys.stderr)
        return EXIT_FAILED
    findings = getattr(exc, "findings", None)
    if findings and is_user_error(exc):  # the pre-start checks: one line per problem
        for f in findings:
            print(f"kpca {command}: error: {f.message}", file=sys.stderr)
        # a store or network that did not answer is the environment's failure, not the
        # user's: exit 1 (re-run), as the same failure met after the start would
        return EXIT_FAILED if getattr(exc, "transient", False) else EXIT_USAGE
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
        from pipeline.output import endpoint_hint

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


def _store_failure(exc: BaseException, where: str) -> str | None:
    from pipeline.output import describe_store_failure

    if _environment_error(exc) or (is_user_error(exc) and not isinstance(exc, PermissionError)):
        return None
    return describe_store_failure(exc, where)


def _store_line(exc: BaseException, where: str) -> str | None:
    """The line for a store failure (None: ``exc`` is not one). When it was raised while
    handling an earlier store failure (a failed writer's clean-up -- removing its version,
    releasing its lock -- meeting the same broken store), the earlier one is the cause:
    the line names it, its operation and object, and the clean-up's failure follows it
    in a clause."""
    line = _store_failure(exc, where)
    if line is None:
        return None
    # walk the chain. ``raise X from Y`` (__cause__) stays within one failure (a client's
    # error translated); the exception being handled when one was raised (__context__,
    # when it is not its cause: also kept by ``raise X from Y`` inside an ``except``, and
    # dropped only by ``from None``) is an earlier failure. Keep the outermost store
    # failure of the earliest one.
    first, node, seen, found = None, exc, {id(exc)}, True
    while True:
        cause, ctx = node.__cause__, node.__context__
        hidden = cause is None and node.__suppress_context__
        if ctx is not None and ctx is not cause and not hidden and id(ctx) not in seen:
            node, found = ctx, False  # an earlier failure's outermost exception
        elif cause is not None and id(cause) not in seen:
            node = cause
        else:
            break
        seen.add(id(node))
        if not found:
            earlier = _store_failure(node, where)
            if earlier is not None:
                first, found = earlier, True
    # only a failed write's clean-up: a read failing again while a failed read was handled
    # (a retry, a fallback) is the same failure, told by its own line
    if first is None or first == line or not first.startswith("cannot write "):
        return line
    if line.startswith("cannot write "):
        return line
    # the clean-up's failure, its operation and object only (its advice is the cause's)
    then = line.split(": ", 1)[0] if line.startswith("cannot ") else "the clean-up failed"
    return f"{first.rstrip('.')} (the clean-up afterwards failed too: {then})."


def _quota_line(exc: BaseException, line: str) -> str | None:
    """The store's line reworded when the store refused for lack of space or quota
    (pipeline/errors.py ``quota_failure``): re-running cannot help until space is freed
    or the quota raised. None: not a quota failure."""
    said = quota_failure(exc)
    if said is None:
        return None
    # the failed operation and object ("cannot write X (in Y)"), as the store's line has it
    head = line.split(": ", 1)[0] if line.startswith("cannot ") else "cannot write to the store"
    return (
        f"{head}: the store is out of space or over its quota ({said}); free space in the "
        "bucket or raise its quota (or write elsewhere), then re-run the same command to "
        "resume."
    )


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
