"""Progress display for long computations: a text bar in a terminal, quiet otherwise.

With a ``distributed`` client the bar follows the futures (and the dashboard
link is logged by the cluster helper); with a local scheduler it is dask's
``ProgressBar``. Library code calls :func:`compute` instead of ``dask.compute``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import dask

__all__ = ["compute", "show_progress"]

_STATE = {"enabled": None}


@contextlib.contextmanager
def show_progress(enabled: bool | None = None):
    """Enable (True), disable (False) or auto-detect (None: a TTY) progress bars."""
    old = _STATE["enabled"]
    _STATE["enabled"] = enabled
    try:
        yield
    finally:
        _STATE["enabled"] = old


def _enabled() -> bool:
    e = _STATE["enabled"]
    return sys.stderr.isatty() if e is None else bool(e)


def compute(*collections: Any, label: str = "") -> tuple[Any, ...]:
    """``dask.compute`` with a progress bar when enabled."""
    if not _enabled():
        return dask.compute(*collections)
    try:
        from distributed import default_client, progress

        client = default_client()
    except (ImportError, ValueError):
        client = None
    if client is not None:
        futures = client.compute(list(collections))
        if label:
            print(f"{label}:", file=sys.stderr)
        progress(futures, notebook=False)
        print(file=sys.stderr)
        return tuple(client.gather(futures))
    from dask.diagnostics import ProgressBar

    if label:
        print(f"{label}:", file=sys.stderr)
    with ProgressBar(out=sys.stderr):
        return dask.compute(*collections)
