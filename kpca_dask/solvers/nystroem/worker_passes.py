"""The per-worker pass driver of the Nyström solver on a distributed cluster: the tasks of a
pass grow with the workers, not with ``n`` (issue 38; the exact solve's driver is
:mod:`kpca_dask.worker_passes`).

The default driver (:mod:`.passes`) runs one task per row block (or per
:data:`~.passes.SPLIT_EVERY` blocks) and a tree of fan-in 8 a pass: thousands of tasks a
pass at n = 100M. This driver, chosen by the dask config key :data:`DRIVER_CONFIG`
(``"blocks"``, the default, or ``"workers"``) on a distributed client, runs:

* **Resident data, placed at the first pass**: ``X`` persisted (its own ``nb`` tasks, or
  none if it is persisted already), cut into ``W`` shares of consecutive row blocks of
  about equal rows (:func:`split_blocks`), and one task per worker gathering its share's
  blocks (``kpca-nys-wrows``), placed on it (``workers=``, ``allow_other_workers=True``:
  a lost worker's share is recomputed elsewhere). The prepared landmarks (``m x d``) and
  the shift (``m``) are scattered to every worker once. All of it is kept until
  :meth:`NystroemWorkerPasses.release` (the end of the fit).
* **A pass**: the small matrix ``M`` (``m x l``; none for the covariance form) scattered
  to every worker (no task), one task per worker (``kpca-nys-wpart``) computing the
  default driver's block statistics ``(C'^T C' M or C'^T C', C'^T 1, sum k(x, x), rows)``
  summed over its blocks (:func:`share_stats`: the same :func:`~.passes._block_stats`
  per block; the worker's threads split its blocks into contiguous runs, added in run
  order), then the partials summed on the workers by a tree of fan-in
  :data:`~kpca_dask.worker_passes.REDUCE_FAN_IN` (``kpca-nys-wsum``); only the root
  (``m x l`` or ``m x m``) comes to the caller.

Tasks a pass after the first: ``W + R(W)`` (:func:`pass_tasks`; ``R`` the tree's,
:func:`~kpca_dask.worker_passes.reduction_tasks`), whatever ``n``; the first adds ``nb``
(X persisted, unless it is already) + ``W`` (the rows). The sums are the default
driver's in another order: results agree to rounding, and the same cluster gives the same
bits run after run (fixed shares, fixed tree, runs added in order).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask.base import tokenize

from ...worker_passes import REDUCE_FAN_IN, reduction_tasks
from .passes import _block_stats, _sum_stats

__all__ = [
    "DRIVER_CONFIG",
    "DRIVERS",
    "NystroemWorkerPasses",
    "nystroem_driver",
    "pass_tasks",
    "split_blocks",
]

#: dask config key choosing the Nyström passes' driver on a distributed client:
#: ``"blocks"`` (a task per row block or group of blocks, :mod:`.passes`) or
#: ``"workers"`` (this module: one task per worker a pass).
DRIVER_CONFIG = "kpca.nystroem-driver"
DRIVERS = ("blocks", "workers")


def nystroem_driver() -> str:
    """The driver the dask config asks for (:data:`DRIVER_CONFIG`; default ``"blocks"``)."""
    from ...worker_passes import config_driver

    return config_driver(DRIVER_CONFIG, DRIVERS, "blocks")


def worker_client() -> Any:
    """The distributed client the passes run on when the config asks for this driver,
    else None (the default driver)."""
    if nystroem_driver() != "workers":
        return None
    from ...resources import _scheduler_kind

    kind, client = _scheduler_kind()
    return client if kind == "distributed" else None


def split_blocks(row_chunks: Sequence[int], n_workers: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each share's row blocks: ``min(n_workers, nb)`` non-empty runs
    of consecutive blocks, in order, covering every block once, with about equal rows
    (each cut at the block boundary nearest to its equal-rows point)."""
    sizes = [int(c) for c in row_chunks]
    nb = len(sizes)
    w = max(1, min(int(n_workers), nb))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(float)
    n = offsets[-1]
    cuts = [0]
    for k in range(1, w):
        b = int(np.argmin(np.abs(offsets - n * k / w)))
        cuts.append(min(max(b, cuts[-1] + 1), nb - (w - k)))  # non-empty on both sides
    cuts.append(nb)
    return [(cuts[s], cuts[s + 1]) for s in range(w)]


def pass_tasks(n_workers: int, n_blocks: int, fan_in: int = REDUCE_FAN_IN) -> int:
    """Tasks of one pass after the first: a task per share and the tree of sums."""
    shares = max(1, min(int(n_workers), int(n_blocks)))
    return shares + reduction_tasks(shares, fan_in)


# ---- task functions (run on the workers) ----


def collect_rows(*blocks: np.ndarray) -> list[np.ndarray]:
    """A share's row blocks, in order (the task keeping them on its worker)."""
    return [np.ascontiguousarray(b) for b in blocks]


def _worker_threads() -> int:
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return 1


def share_stats(
    rows: Sequence[np.ndarray],
    Zp: np.ndarray,
    shift: np.ndarray,
    M: np.ndarray | None,
    first: bool,
    kernel: Any,
    dtype_str: str,
    threads: int | None = None,
) -> tuple:
    """The block statistics ``(acc, colsum, diag, rows)`` of a share's row blocks summed
    (:func:`~.passes._block_stats` per block, ``M`` None for the covariance form). The
    blocks are split into ``threads`` contiguous runs (default: the worker's threads), one
    Python thread each (the kernel's exp and the GEMMs release the GIL); the runs' sums
    are added in run order, so the result does not depend on timing."""
    method = "covariance" if M is None else "randomized"
    consts = (Zp, M, shift)
    rows = list(rows)

    def run(part: Sequence[np.ndarray]) -> tuple:
        return _sum_stats(
            _block_stats(xb, consts, method, first, kernel, dtype_str) for xb in part
        )

    nt = max(1, min(threads or _worker_threads(), len(rows)))
    if nt == 1:
        return run(rows)
    cuts = np.linspace(0, len(rows), nt + 1).astype(int)
    results: list[Any] = [None] * nt

    def work(k: int) -> None:
        try:
            results[k] = run(rows[cuts[k] : cuts[k + 1]])
        except BaseException as exc:  # re-raised in the task's thread below
            results[k] = exc

    ts = [threading.Thread(target=work, args=(k,)) for k in range(nt)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return _sum_stats(results)


def sum_stats(*parts: tuple) -> tuple:
    """Add block statistics in argument order (a node of the tree)."""
    return _sum_stats(parts)


# ---- the driver (runs in the caller) ----


class NystroemWorkerPasses:
    """The per-worker pass driver for the rows ``X`` (row-chunked dask array) against the
    landmarks of ``basis`` (prepared: ``Zp``) on a distributed ``client`` (see the
    module's docstring). The rows are placed at the first :meth:`run`; :meth:`release`
    drops every future it holds."""

    def __init__(self, X: Any, basis: Any, Zp: np.ndarray, client: Any):
        self.X, self.basis, self.Zp, self.client = X, basis, Zp, client
        self.workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if not self.workers:
            raise RuntimeError("the distributed client has no workers")
        self.shares = split_blocks(X.chunks[0], len(self.workers))
        self.token = tokenize(X.name, basis.kernel, basis.dtype.str, Zp, basis.shift)
        self.rows: list[Any] = []  # per share: the future of its row blocks
        self.consts: list[Any] = []  # the landmarks' and the shift's futures
        self.passes = 0

    def _place(self) -> None:
        """First pass: every share's rows on its worker, the landmarks on every worker."""
        import dask
        from distributed import futures_of

        client = self.client
        Xp = client.persist(self.X)
        xfut = {f.key: f for f in futures_of(Xp)}
        xname = Xp.name
        shift = np.asarray(self.basis.shift)
        self.consts = client.scatter([self.Zp, shift], broadcast=True, hash=False)
        with dask.annotate(priority=10):
            self.rows = [
                client.submit(
                    collect_rows,
                    *[xfut[(xname, b, 0)] for b in range(a, e)],
                    key=f"kpca-nys-wrows-{self.token}-{s}",
                    workers=[self.workers[s]],
                    allow_other_workers=True,
                    pure=False,
                )
                for s, (a, e) in enumerate(self.shares)
            ]
        del Xp, xfut  # the row tasks hold what they still need

    def run(self, M: np.ndarray | None, first: bool) -> tuple:
        """One pass: ``(acc, colsum, diag, rows)`` as the default driver's
        :func:`~.passes.block_stats_graph` computes them (``M`` None: the covariance
        form; ``first``: the column sums and the kernel trace too)."""
        from distributed import wait

        client = self.client
        if not self.rows:
            self._place()
        Zf, shift_f = self.consts
        Mf = None if M is None else client.scatter(M, broadcast=True, hash=False)
        ptoken = tokenize(self.token, self.passes, None if M is None else M.shape, first)
        self.passes += 1
        level = [
            client.submit(
                share_stats,
                self.rows[s],
                Zf,
                shift_f,
                Mf,
                bool(first),
                self.basis.kernel,
                self.basis.dtype.str,
                key=f"kpca-nys-wpart-{ptoken}-{s}",
                workers=[self.workers[s]],
                allow_other_workers=True,
                pure=False,
            )
            for s in range(len(self.shares))
        ]
        tier = 0
        while len(level) > 1:
            level = [
                client.submit(
                    sum_stats,
                    *level[a : a + REDUCE_FAN_IN],
                    key=f"kpca-nys-wsum-{ptoken}-{tier}-{a // REDUCE_FAN_IN}",
                    pure=False,
                )
                for a in range(0, len(level), REDUCE_FAN_IN)
            ]
            tier += 1
        root = level[0]
        wait([root])
        out = root.result()
        del Mf, root, level
        return out

    def release(self) -> None:
        """Drop the resident rows and landmarks (the cluster frees them)."""
        self.rows, self.consts = [], []
