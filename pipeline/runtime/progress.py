"""Progress display for long computations: a text bar in a terminal, quiet otherwise; and
numbered steps of a long stage in the log.

With a ``distributed`` client the bar follows the futures (and the dashboard
link is logged by the cluster helper); with a local scheduler it is dask's
``ProgressBar``. Library code calls :func:`compute` instead of ``dask.compute``.

:class:`Steps` logs a stage's steps at INFO on the ``pipeline`` logger (``evaluate
[2/4] linear PCA baseline ...``, then ``... done in 3.1 s``): ``kpca run`` shows them
and the Prefect flow forwards them to its run log. The solve stage's passes are logged
by the solvers themselves (``randomized solver: pass 3, ... max eigenvalue bound
1.5e-02``; kpca_dask's logger, which the flow forwards too).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import dask

__all__ = ["Steps", "compute", "show_progress"]

logger = logging.getLogger("pipeline")


class Steps:
    """The numbered steps of one stage, logged as they start and end."""

    def __init__(self, stage: str, total: int):
        self.stage, self.total, self.done = stage, int(total), 0

    @contextlib.contextmanager
    def step(self, what: str, *args: Any) -> Iterator[None]:
        self.done += 1
        head = f"{self.stage} [{self.done}/{self.total}] " + (what % args if args else what)
        logger.info("%s ...", head)
        t = time.perf_counter()
        yield
        logger.info("%s done in %.1f s", head, time.perf_counter() - t)

    def sub(self, what: str, i: int, n: int, *args: Any) -> None:
        """A step inside the current one (``i`` of ``n``, 1-based)."""
        logger.info(
            "%s [%d/%d] %s (%d/%d)",
            self.stage,
            self.done,
            self.total,
            what % args if args else what,
            i,
            n,
        )


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
