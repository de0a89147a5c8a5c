"""The object-store clients' behaviour we depend on: gcsfs's retries bounded and quiet,
and the clients zarr opened closed before the interpreter's exit.

**gcsfs retries** (gs://). gcsfs retries each failed request 6 times with backoff (1, 2, 4,
8, 16 s + up to 1 s of jitter each: at most 36 s), logs every request that ran out of
retries with ``logger.exception`` (the server's whole XML or HTML error body, a traceback),
and keeps the body as the error's message. A store answering 503 to every write then
cost each failing write its 36 s again, one after another (a failed writer's removal of
its version deletes object by object): 13.5 minutes and 107 XML dumps for one run.
:func:`install` replaces the retry loop of ``gcsfs.core.GCSFileSystem._request`` (once
gcsfs is imported: an import hook, so commands that never touch gs:// do not pay its
import) by :func:`_bounded_gcs_request`:

- at most :func:`gcs_attempts` attempts per request (default gcsfs's 6; the environment
  variable ``KPCA_GCS_ATTEMPTS`` lowers or raises it), the same backoff;
- a **breaker**: once a request to an endpoint has run out of attempts on an error worth
  retrying (5xx, 429, a dropped connection), every request of the same kind (reads:
  GET, HEAD; writes: the others) to that endpoint from this process in the next
  :data:`BREAKER_SECONDS` makes one attempt (no backoff) until one succeeds: the
  clean-up after a failed write costs one attempt per object, not 36 s;
- the error keeps its type (``gcsfs.retry.HttpError``, its code) with a one-line message
  (the XML/HTML body's ``Code`` and ``Message``), and nothing is logged above DEBUG.

So a command meeting a store that fails every write ends within
:func:`storm_bound_seconds` of the failure (two full retry sequences: the failing write's,
on a worker, and the first clean-up request's, in the command; the rest fail at once).

**Closing clients at exit.**

zarr 3 opens every fsspec store in asynchronous mode on its own event loop. adlfs (az://,
abfs://) registers, for each filesystem it creates, a ``weakref.finalize`` that closes its
Azure client through ``fsspec.asyn.sync(self.loop, ...)``; an asynchronous filesystem has no
loop (``self.loop`` is None), so at exit every such finalizer fails with ``RuntimeError:
Loop is not running`` and a traceback, after a run that succeeded, and the client's aiohttp
session is never closed (upstream: fsspec/adlfs#495, zarr-developers/zarr-python#4221).

:func:`install` registers an exit hook that runs before those finalizers (and before zarr
stops its loop): it closes each such client on zarr's loop, where its session lives, and
detaches the finalizer that would have failed. Nothing else is touched.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.abc
import importlib.util
import logging
import os
import random
import re
import sys
import threading
import time
import weakref
from typing import Any

logger = logging.getLogger("pipeline")

_installed = False


def _noop() -> None:
    pass


def install() -> None:
    """Register the exit hook once, and bound gcsfs's retries (now if gcsfs is imported,
    else when it is). A throwaway finalizer first makes sure weakref's own exit hook is
    registered before ours, so that ours (later: run first) precedes it."""
    global _installed
    if _installed:
        return
    weakref.finalize(_noop, _noop).detach()
    atexit.register(close_async_clients)
    if "gcsfs.core" in sys.modules:
        _bound_gcsfs(sys.modules["gcsfs.core"])
    else:
        sys.meta_path.insert(0, _GcsfsHook())
    _installed = True


# ------------------------------------------------------------------ gcsfs retries
#: gcsfs's own attempts per request (gcsfs.core.GCSFileSystem.retries)
GCS_DEFAULT_ATTEMPTS = 6
#: gcsfs's backoff before attempt i+1 (i >= 1): min(2**(i-1) + U(0, 1), 32) s
GCS_MAX_SLEEP = 32.0
#: how long, after a request ran out of attempts, other requests to the same endpoint
#: make one attempt each
BREAKER_SECONDS = 300.0

_tripped: dict[str, float] = {}  # endpoint -> monotonic time the breaker opened
_tripped_lock = threading.Lock()


def gcs_attempts() -> int:
    """Attempts per gcsfs request: ``KPCA_GCS_ATTEMPTS`` (at least 1), else gcsfs's 6."""
    raw = os.environ.get("KPCA_GCS_ATTEMPTS", "").strip()
    try:
        return max(1, int(raw)) if raw else GCS_DEFAULT_ATTEMPTS
    except ValueError:
        return GCS_DEFAULT_ATTEMPTS


def gcs_backoff(attempt: int, jitter: float) -> float:
    """The sleep before attempt ``attempt + 1`` (``attempt`` >= 1), gcsfs's formula."""
    return min(jitter + 2 ** (attempt - 1), GCS_MAX_SLEEP)


def gcs_retry_seconds(attempts: int | None = None) -> float:
    """The longest one request keeps retrying (its sleeps at the largest jitter): 36 s
    for gcsfs's 6 attempts (2 + 3 + 5 + 9 + 17)."""
    n = gcs_attempts() if attempts is None else attempts
    return sum(gcs_backoff(i, 1.0) for i in range(1, n))


def storm_bound_seconds(attempts: int | None = None, request_seconds: float = 1.0) -> float:
    """How long after a store starts failing every request a command still waits on it
    (``request_seconds``: each attempt's own time): the failing write's retries, then the
    first clean-up request's; every later request is one attempt (the breaker)."""
    n = gcs_attempts() if attempts is None else attempts
    return 2 * (gcs_retry_seconds(n) + n * request_seconds)


_XML_FIELD = re.compile(r"<(Code|Message)>([^<]*)</\1>", re.S)
_TAGS = re.compile(r"<[^>]+>")


def short_http_message(message: Any, code: Any = None) -> str:
    """One line of an error body a server answered: an XML body's ``Code: Message``, an
    HTML page's text, cut to 160 characters."""
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    text = str(message or "")
    suffix = f", {code}"
    if code is not None and text.endswith(suffix):
        text = text[: -len(suffix)]
    fields = dict((k, " ".join(v.split())) for k, v in _XML_FIELD.findall(text))
    if fields:
        text = ": ".join(v for v in (fields.get("Code"), fields.get("Message")) if v)
    elif "<" in text:
        text = " ".join(_TAGS.sub(" ", text).split())
    text = " ".join(text.split())[:160]
    return f"HTTP {code}: {text}" if code is not None else text


def _retriable(exc: BaseException) -> bool:
    from gcsfs.retry import is_retriable

    return is_retriable(exc)


def _endpoint(fs: Any) -> str:
    return str(getattr(fs, "_endpoint", None) or getattr(fs, "base", "") or "gs")


async def _bounded_gcs_request(original, self, *args, **kwargs):
    """gcsfs's ``_request`` retry loop, bounded (see the module's docstring)."""
    import aiohttp
    import google.auth.exceptions
    import requests
    from gcsfs.retry import ChecksumError, HttpError

    retried = (
        HttpError,
        requests.exceptions.RequestException,
        google.auth.exceptions.GoogleAuthError,
        ChecksumError,
        aiohttp.client_exceptions.ClientError,
    )
    # reads and writes trip apart: a store refusing writes still answers reads, and a
    # read's success must not close the writes' breaker
    method = str(args[0] if args else kwargs.get("method", "")).upper()
    kind = "read" if method in ("GET", "HEAD") else "write"
    endpoint = f"{_endpoint(self)} {kind}"
    with _tripped_lock:
        since = _tripped.get(endpoint)
    open_ = since is not None and time.monotonic() - since < BREAKER_SECONDS
    attempts = 1 if open_ else gcs_attempts()
    failure: BaseException | None = None
    for attempt in range(attempts):
        if attempt > 0:
            await asyncio.sleep(gcs_backoff(attempt, random.random()))
        try:
            result = await original(self, *args, **kwargs)
        except retried as exc:
            if (
                isinstance(exc, HttpError)
                and exc.code == 400
                and "requester pays" in str(exc.message)
            ):
                raise ValueError(
                    "Bucket is requester pays. Set `requester_pays=True` when creating "
                    "the GCSFileSystem."
                ) from exc
            status = getattr(exc, "code", None) or getattr(exc, "status", None)
            if status == 404 or not _retriable(exc):
                failure = _quiet(exc)
                break
            if attempt == attempts - 1:
                with _tripped_lock:
                    _tripped[endpoint] = time.monotonic()
                logger.debug("gcsfs request out of %d attempts: %r", attempts, exc)
                failure = _quiet(exc)
                break
            logger.debug("gcsfs request retried after %r", exc)
            continue
        if since is not None:
            with _tripped_lock:
                _tripped.pop(endpoint, None)
        return result
    # raised here, outside the except clause: its context is what the caller was handling
    # (a failed writer's clean-up: the write that failed), which the CLI reports first
    # (flows/cli/exits.py), not the attempt's own error
    raise failure


def _quiet(exc: BaseException) -> BaseException:
    """A gcsfs HttpError with a one-line message (same class and code); others as they
    are."""
    from gcsfs.retry import HttpError

    if type(exc) is HttpError and exc.code is not None:
        short = short_http_message(exc.message, exc.code)
        return HttpError(
            {"code": exc.code, "message": short.removeprefix(f"HTTP {exc.code}: ")}
        )
    return exc


def _bound_gcsfs(core: Any) -> None:
    cls = core.GCSFileSystem
    if getattr(cls._request, "_kpca_bounded", False):
        return
    original = getattr(cls._request, "__wrapped__", None)
    if original is None:  # a gcsfs without the decorator: leave it as it is
        logger.debug("gcsfs: no retry decorator found on _request; retries not bounded")
        return

    async def _request(self, *args, **kwargs):
        return await _bounded_gcs_request(original, self, *args, **kwargs)

    _request._kpca_bounded = True
    _request.__doc__ = original.__doc__
    cls._request = _request


class _GcsfsHook(importlib.abc.MetaPathFinder):
    """Bounds gcsfs's retries right after ``gcsfs.core`` is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "gcsfs.core":
            return None
        sys.meta_path.remove(self)  # find the real spec, once
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_bound(module):
            exec_module(module)
            _bound_gcsfs(module)
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass

        loader.exec_module = exec_and_bound
        return spec


def close_async_clients(timeout: float = 5.0) -> int:
    """Close the Azure clients of asynchronous adlfs filesystems whose finalizers would
    fail at exit; detach those finalizers. Returns how many were closed."""
    utils = sys.modules.get("adlfs.utils")
    asyn = sys.modules.get("fsspec.asyn")
    if utils is None or asyn is None:
        return 0
    closers = {
        getattr(utils, "close_service_client", None),
        getattr(utils, "close_credential", None),
    }
    closers.discard(None)
    zarr_sync = sys.modules.get("zarr.core.sync")
    loop = zarr_sync.loop[0] if zarr_sync is not None else None
    registry = getattr(weakref.finalize, "_registry", {})
    closed = 0
    for fin in list(registry):
        found = fin.peek()
        if found is None:
            continue
        _, func, args, _ = found
        if func is not asyn.sync or len(args) < 3 or args[0] is not None:
            continue
        if args[1] not in closers:
            continue
        fin.detach()
        if loop is None or loop.is_closed() or not loop.is_running():
            continue
        try:
            asyncio.run_coroutine_threadsafe(args[1](*args[2:]), loop).result(timeout)
            closed += 1
        except Exception as exc:  # noqa: BLE001 - closing at exit: never a traceback
            logger.debug("could not close an Azure client at exit: %r", exc)
    return closed
