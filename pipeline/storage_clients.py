"""Closing the object-store clients that zarr opened, before the interpreter's exit.

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
import logging
import sys
import weakref

logger = logging.getLogger("pipeline")

_installed = False


def _noop() -> None:
    pass


def install() -> None:
    """Register the exit hook once. A throwaway finalizer first makes sure weakref's own
    exit hook is registered before ours, so that ours (later: run first) precedes it."""
    global _installed
    if _installed:
        return
    weakref.finalize(_noop, _noop).detach()
    atexit.register(close_async_clients)
    _installed = True


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
