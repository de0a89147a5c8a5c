"""One error taxonomy for the pipeline: who can fix a failure, and whether trying again helps.

- :class:`UserError`: the config, the input, the artifacts or the output location are
  wrong. The message names the problem and the fix; trying again cannot help. The CLI
  prints that one line and exits with status 2; the flow never retries it.
- :class:`TransientError`: the environment failed (I/O, network, a lost worker). The
  same command may succeed when run again; the flow retries it, the CLI exits with 1.
  It is raised as its specific kinds: :class:`StoreError` (a store operation failed:
  pipeline/output/verify.py words it) and ``WorkerTimeoutError`` (pipeline/runtime/liveness.py:
  a
  worker did not answer); other I/O and network errors are classified by
  :func:`is_transient` without being wrapped.
- :class:`InternalError`, and anything else unexpected, is a bug: the CLI keeps its
  traceback and exits with its own status, so it is reported rather than mistaken for
  bad input.

Every pipeline error class derives from :class:`PipelineError` and one of the three kinds,
and keeps the built-in base it always had (``ConfigError`` is still a ``ValueError``,
``ClusterError`` still a ``RuntimeError``), so existing ``except`` clauses keep working.
:func:`is_user_error` and :func:`is_transient` also classify exceptions the pipeline does
not own (kpca_dask's, pydantic's, the OS's, Dask's) without importing those packages:
this module imports nothing but the standard library, so every layer can use it.
"""

from __future__ import annotations

import sys

__all__ = [
    "USER_OS_ERRORS",
    "CorruptObjectError",
    "EvaluationError",
    "InternalError",
    "PipelineError",
    "RunCorruptError",
    "RunError",
    "RunExistsError",
    "RunIncompleteError",
    "StoreError",
    "TransientError",
    "UserError",
    "is_transient",
    "is_user_error",
    "quota_failure",
]


class PipelineError(Exception):
    """Base class of every error the pipeline raises on purpose."""


class UserError(PipelineError):
    """Bad config, input, artifacts or output location: the message says what to fix."""


class TransientError(PipelineError):
    """The environment failed (I/O, network, a lost worker): running again may succeed.

    The base of StoreError and liveness.WorkerTimeoutError; raise a subclass that names
    what failed."""


class InternalError(PipelineError):
    """A bug the pipeline caught itself (an invariant broken, e.g. a stage reading outside
    its config slice): never retried; the CLI keeps its traceback."""


# ------------------------------------------------- run folders (export, publish, transform)
class RunError(UserError, ValueError):
    """A run folder cannot be used as a result; the message says why."""


class RunExistsError(RunError, FileExistsError):
    """A complete run is already at the output path."""


class RunIncompleteError(RunError):
    """The manifest is missing or does not say complete."""


class RunCorruptError(RunError):
    """An array does not match its manifest checksum, or the schema is unknown."""


class CorruptObjectError(RunCorruptError):
    """A stored object (a chunk, a ``zarr.json``) is missing, truncated, undecodable or not
    what its digest says: the message names the object (array path and chunk key)."""


class StoreError(TransientError, OSError):
    """The store failed an operation (read, write, list, delete): the message names the
    location, the object and the operation; running again may succeed (exit 1)."""


class EvaluationError(UserError, ValueError):
    """The run folder cannot be evaluated as configured (the message names the fix)."""


# ---------------------------------------------------------------- classification
#: OS errors about a path the user named: a wrong path, not a flaky disk
USER_OS_ERRORS: tuple[type[OSError], ...] = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


def _loaded(module: str, name: str) -> type | None:
    """``module.name`` if that module is already imported (an exception of a class whose
    module was never imported cannot exist), else None: no import happens here."""
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


def is_user_error(exc: BaseException) -> bool:
    """The user can fix it: a pipeline UserError, any kpca_dask error (bad parameters or
    data), a pydantic validation error (a config built in code), or an OS error about a
    path the user named."""
    if isinstance(exc, (UserError, *USER_OS_ERRORS)):
        return True
    for module, name in (
        ("kpca_dask.exceptions", "KpcaError"),
        ("pydantic", "ValidationError"),
        ("botocore.exceptions", "NoCredentialsError"),  # the environment lacks them
    ):
        cls = _loaded(module, name)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: a TransientError, an I/O or network error (ConnectionError,
    TimeoutError, distributed's CommClosedError are OSErrors), a lost Dask worker.

    A user error is never transient, whatever else it subclasses (``RunExistsError`` is
    also a ``FileExistsError``), nor is a bug (ValueError, TypeError, KeyError) or
    running out of memory in the client.
    """
    if isinstance(exc, TransientError):
        return True
    if is_user_error(exc) or isinstance(exc, ValueError | TypeError | KeyError | MemoryError):
        return False
    if isinstance(exc, PipelineError):  # neither kind: not known to be safe to repeat
        return False
    if isinstance(exc, OSError):
        return True
    # an object store that cannot be reached or dropped the connection (botocore's,
    # aiohttp's (gcsfs) and the Azure SDK's are not OSErrors)
    for module, name in (
        ("botocore.exceptions", "ConnectionError"),
        ("botocore.exceptions", "HTTPClientError"),  # ConnectionClosedError, ReadTimeout
        ("aiohttp", "ClientConnectionError"),  # ServerDisconnectedError
        ("aiohttp", "ClientPayloadError"),  # an answer cut mid-body
        ("azure.core.exceptions", "ServiceRequestError"),
        ("azure.core.exceptions", "ServiceResponseError"),
    ):
        unreachable = _loaded(module, name)
        if unreachable is not None and isinstance(exc, unreachable):
            return True
    killed = _loaded("distributed.scheduler", "KilledWorker")
    return killed is not None and isinstance(exc, killed)


#: how stores say they are out of space or quota: HTTP 507 (WebDAV-style stores, MinIO,
#: proxies), S3's and MinIO's codes, GCS's ``quotaExceeded``/``storageQuotaExceeded``
#: reasons (a 429 or 403 that is not a rate limit), Azure's ``*QuotaExceeded`` and
#: ``AccountIsFull``-style codes
_QUOTA_WORDS = (
    "insufficientstorage",
    "insufficient storage",
    "quotaexceeded",
    "quota exceeded",
    "exceeded its quota",
    "exceeds the quota",
    "storagequota",
    "xminiostoragefull",
    "storage full",
    "accountisfull",
    "no space left",
)


def quota_failure(exc: BaseException) -> str | None:
    """What an object store said when it refused a write for lack of space or quota
    (HTTP 507, a quota error code), looking through ``exc`` and the errors it was raised
    from or while handling; None when it is not that. Running again cannot help until
    space is freed or the quota raised: the CLI says so instead of "re-run"."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        status = None
        for attr in ("code", "status", "status_code"):
            v = getattr(e, attr, None)
            if isinstance(v, int):
                status = v
                break
        if status is None:
            v = getattr(e, "response", None)
            v = (
                v.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if isinstance(v, dict)
                else None
            )
            status = v if isinstance(v, int) else None
        text = " ".join(str(e).split())
        low = text.lower()
        squashed = low.replace(" ", "").replace("_", "")
        if status == 507 or any(w.replace(" ", "") in squashed for w in _QUOTA_WORDS):
            return text[:160] or "HTTP 507"
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return None
