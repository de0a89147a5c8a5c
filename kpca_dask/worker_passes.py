# long: the driver's placement, pass, reductions and resident products read together
"""The per-worker pass driver of the exact (block-Krylov) solve on a distributed cluster:
the tasks of a pass grow with the workers, not with ``n`` (issue 38).

The waves driver (:mod:`kpca_dask.cluster_waves`) runs one task per upper block
``K_IJ``: ``nb (nb + 1) / 2`` tasks a pass for ``nb`` row blocks, which puts the
scheduler on the critical path as ``n`` grows (2 ms a task: 4 000 tasks are 8 s a pass).
This driver gives each worker a fixed share of the upper blocks for the whole solve and
runs one task per worker a pass:

* **Shares** (:func:`assign_pairs`): the upper pairs ``(I, J)``, ``I <= J``, in square
  tiles of ``t x t`` block pairs (``t = max(1, floor(nb / sqrt(2 W)))``: about ``W``
  tiles for ``W`` workers), tile after tile, cut into ``W`` contiguous runs of equal
  cost (block area). A worker's blocks then touch a few tiles' rows: its rows, its part
  of ``Z`` and its partial sums are a fraction of ``n``, and every upper block is
  used twice (``K_IJ Z_J`` and ``K_IJ^T Z_I``) as in the waves driver.
* **Resident data, first pass only**: ``X`` persisted (its own ``nb`` tasks, or none if
  it is persisted already), then per worker one task gathering the row blocks its share
  reads (``kpca-wrows``), placed on that worker; with the kernel cache (memory or
  partial tier) one more task per worker evaluating the kept blocks of its share
  (``kpca-wcache``, :func:`~kpca_dask.block_products.cache_block`), kept there until
  :meth:`WorkerPasses.release`. With every block kept, the rows are dropped after the
  fill. The placement is a preference (``allow_other_workers``): a lost worker's keys
  are recomputed elsewhere by the scheduler.
* **A pass**: ``Z`` (``n x c``, from the caller) is scattered straight to the workers
  in ``W`` row panels (no task; ``W`` keys the scheduler registers), then one task per
  worker (``kpca-kz-part-w``) computes its share of ``K Z`` as a dict of row blocks
  (float64), with the worker's threads inside the task (static split of the share over
  the worker's ``nthreads`` Python threads, BLAS capped per thread by
  :class:`~kpca_dask.threads.BlasLimitPlugin`); the partials are summed on the workers
  by a tree of fan-in :data:`REDUCE_FAN_IN` (``kpca-kz-sum``), and only the root, the
  whole ``n x c`` result, comes to the caller: ``n c 8`` bytes a pass.

Task counts (for the cost model; ``W`` workers, ``f = REDUCE_FAN_IN``)::

    share tasks per pass        W            (min(W, nb (nb + 1) / 2) when fewer pairs)
    reduction tasks per pass    R(W) = sum over levels of ceil(m / f), m = W, ceil(W/f), ... > 1
                                (W = 2: 1, W = 16: 4 + 1 = 5, W = 32: 8 + 2 + 1 = 11)
    scattered Z panels per pass W keys, no tasks (direct to the workers)
    first pass, once            nb (X persisted, when not already) + W (rows)
                                + W (kept blocks, memory/partial tier)

So a later pass is ``W + R(W)`` tasks whatever ``n``: 21 on 16 workers, 43 on 32.
With the basis on the workers (:mod:`kpca_dask.worker_basis`, :meth:`WorkerPasses.
product_resident`) ``Z`` and ``K Z`` stay in row panels on the workers: ``P <= W`` publish
tasks, the same share tasks and tree, ``ceil(P / f)`` tasks cutting the root (when
``P > f``) and ``P`` tasks storing the panels: ``2 P + W + R(W) + ceil(P / f)`` a pass
(57 on 16 workers, 115 on 32: within ``4 W + R(W)``).
Bytes: into the caller ``n c 8`` a pass (the root); out of the caller ``n c s`` (Z's
panels, ``s`` the compute dtype's item size); between workers each share task fetches the
Z panels its rows need and each reduction level moves the partials (the root level about
``f n c 8``). Memory per worker: its rows (``≈ 2 t nb / W`` row blocks, ``x d x 8``
bytes each, fewer when its tiles share rows), its kept blocks (``1/W`` of the upper
blocks), and during a pass its Z panels and its partial (its rows' blocks ``x c x 8``).
Flops per pass are the waves driver's (the same block products).

The sums are in another order than the waves driver's: results agree to rounding,
and the same cluster (the same number of workers) gives the same bits run after run
(fixed shares, fixed tree). Chosen with the dask config key :data:`DRIVER_CONFIG`
(``"waves"``, the default, or ``"workers"``; docs/scaling.md, "Scale-out drivers").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask.base import tokenize

from .block_products import cache_block, pair_products, stored_pair_products

#: dask config key choosing the exact solver's driver on a distributed client:
#: ``"waves"`` (one task per upper block, :mod:`kpca_dask.cluster_waves`) or
#: ``"workers"`` (this module: one task per worker a pass).
DRIVER_CONFIG = "kpca.exact-driver"
DRIVERS = ("waves", "workers")

#: Partials summed by one reduction task.
REDUCE_FAN_IN = 4


def config_driver(key: str, drivers: tuple[str, ...], default: str) -> str:
    """The driver the dask config ``key`` asks for, one of ``drivers`` (refused otherwise)."""
    import dask

    from .exceptions import InvalidInputError

    value = str(dask.config.get(key, default)).lower()
    if value not in drivers:
        raise InvalidInputError(
            f"dask config {key} must be one of {drivers}, got {value!r}; "
            f"set it with dask.config.set({{{key!r}: 'workers'}})."
        )
    return value


def exact_driver() -> str:
    """The driver the dask config asks for (:data:`DRIVER_CONFIG`; default ``"waves"``)."""
    return config_driver(DRIVER_CONFIG, DRIVERS, "waves")


def reduction_tasks(n_leaves: int, fan_in: int = REDUCE_FAN_IN) -> int:
    """Tasks of the tree summing ``n_leaves`` partials with fan-in ``fan_in``."""
    total, m = 0, int(n_leaves)
    while m > 1:
        m = math.ceil(m / fan_in)
        total += m
    return total


def pass_tasks(n_workers: int, n_blocks: int, fan_in: int = REDUCE_FAN_IN) -> int:
    """Tasks of one pass after the first (share tasks plus the reduction tree)."""
    shares = min(int(n_workers), n_blocks * (n_blocks + 1) // 2)
    return shares + reduction_tasks(shares, fan_in)


def panel_starts(row_chunks: Sequence[int], n_workers: int) -> np.ndarray:
    """The first row block of each row panel of the basis (and ``nb`` last): at most
    ``n_workers`` panels of whole row blocks with about equal rows."""
    offsets = np.concatenate([[0], np.cumsum([int(c) for c in row_chunks])]).astype(int)
    n, nb = int(offsets[-1]), len(row_chunks)
    bounds = np.searchsorted(offsets, np.linspace(0, n, int(n_workers) + 1), side="left")
    return np.unique(np.clip(bounds, 0, nb))


def basis_pass_tasks(
    row_chunks: Sequence[int], n_workers: int, fan_in: int = REDUCE_FAN_IN
) -> int:
    """Tasks of one Krylov pass with the basis on the workers (:mod:`.worker_basis`): a
    publish and a store task a panel around the pass's share tasks and tree, and a level of
    ``ceil(P / f)`` tasks cutting the root when there are more than ``f`` panels (with
    fewer, each store task cuts its own rows from the root): ``2 P + W + R(W) +
    ceil(P / f)``, as :meth:`WorkerPasses.product_resident` submits them.

    (Until 2026-11-28 this counted ``3 P``: a cut task a panel as well as the groups. The
    count measured on 5, 16 and 32 workers is ``2 P + ...``; the test that compares them is
    in the slow run and had not been run since the cuts were grouped.)"""
    nb = len(row_chunks)
    panels = len(panel_starts(row_chunks, n_workers)) - 1
    cuts = math.ceil(panels / fan_in) if panels > fan_in else 0
    return 2 * panels + pass_tasks(n_workers, nb, fan_in) + cuts


def tile_side(n_blocks: int, n_workers: int) -> int:
    """Block pairs per side of a tile of :func:`assign_pairs`."""
    return max(1, math.floor(n_blocks / math.sqrt(2 * max(1, n_workers))))


def assign_pairs(row_chunks: Sequence[int], n_workers: int) -> list[list[tuple[int, int]]]:
    """The upper pairs ``(I, J)`` of each worker's share (at most ``n_workers`` non-empty
    shares, every pair in exactly one).

    Pairs are taken tile by tile (square tiles of :func:`tile_side` blocks a side, the
    tiles in the order of the upper triangle, the pairs row by row inside a tile) and the
    sequence is cut into contiguous runs of about equal cost (the blocks' areas)."""
    c = [int(x) for x in row_chunks]
    nb = len(c)
    t = tile_side(nb, n_workers)
    order: list[tuple[int, int]] = []
    for a in range(0, nb, t):
        for b in range(a, nb, t):
            for i in range(a, min(a + t, nb)):
                for j in range(max(i, b), min(b + t, nb)):
                    order.append((i, j))
    w = max(1, min(int(n_workers), len(order)))
    if len(order) <= w:  # a pair a share
        return [[p] for p in order]
    cost = np.array([c[i] * c[j] for i, j in order], dtype=float)
    cum = np.cumsum(cost)
    total = cum[-1] if len(cum) else 0.0
    # pair p goes to share floor(W x (cost before p + half its own) / total)
    mid = (cum - cost / 2) / max(total, 1e-300)
    which = np.minimum((mid * w).astype(int), w - 1)
    shares: list[list[tuple[int, int]]] = [[] for _ in range(w)]
    for p, s in zip(order, which):
        shares[int(s)].append(p)
    return [s for s in shares if s]


def share_blocks(pairs: Sequence[tuple[int, int]]) -> list[int]:
    """The row blocks a share reads (sorted)."""
    return sorted({b for p in pairs for b in p})


# ---- task functions (run on the workers) ----


def collect_rows(blocks: Sequence[int], *arrays: np.ndarray) -> dict[int, np.ndarray]:
    """The row blocks of a share, by block index (the task keeping them on its worker)."""
    return {int(b): np.ascontiguousarray(a) for b, a in zip(blocks, arrays)}


def fill_share(
    kernel: Any,
    rows: dict[int, np.ndarray],
    pairs: Sequence[tuple[int, int]],
    dtype: str,
    eval_dtype: str,
) -> dict[tuple[int, int], np.ndarray]:
    """The kept blocks of a share (diagonal squares whole), as the waves driver's cache
    (:func:`~kpca_dask.block_products.cache_block`)."""
    return {(i, j): cache_block(kernel, rows[i], rows[j], dtype, eval_dtype) for i, j in pairs}


def _worker_threads() -> int:
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return 1


def share_product(
    kernel: Any,
    rows: dict[int, np.ndarray] | None,
    cache: dict[tuple[int, int], np.ndarray] | None,
    pairs: Sequence[tuple[int, int]],
    panel_of: dict[int, tuple[int, int, int]],
    dtype: str,
    panels: Sequence[np.ndarray],
    threads: int | None = None,
) -> dict[int, np.ndarray]:
    """A share's part of ``K Z``: ``{row block: float64 sum}`` over its pairs.

    ``panel_of[b] = (index into panels, first row, last row)`` locates ``Z_b``. The share
    is split into ``threads`` contiguous runs (default: the worker's threads), one Python
    thread each (the kernel's exp and the GEMMs release the GIL); their sums are added in
    run order, so the result does not depend on timing."""

    def z(b: int) -> np.ndarray:
        p, a, e = panel_of[b]
        return panels[p][a:e]

    def run(part: Sequence[tuple[int, int]]) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}

        def add(b: int, y: np.ndarray) -> None:
            if b in out:
                out[b] += y
            else:
                out[b] = np.array(y, dtype=np.float64, copy=True)

        for i, j in part:
            zj = None if i == j else z(j)
            blk = None if cache is None else cache.get((i, j))
            if blk is not None:
                yi, yj = stored_pair_products(blk, z(i), zj, dtype)
            else:
                xj = None if i == j else rows[j]  # type: ignore[index]
                yi, yj = pair_products(kernel, rows[i], xj, z(i), zj, dtype)  # type: ignore[index]
            add(i, yi)
            if yj is not None:
                add(j, yj)
        return out

    pairs = list(pairs)
    nt = max(1, min(threads or _worker_threads(), len(pairs)))
    if nt == 1:
        return run(pairs)
    cuts = np.linspace(0, len(pairs), nt + 1).astype(int)
    parts = [pairs[cuts[k] : cuts[k + 1]] for k in range(nt)]
    results: list[Any] = [None] * nt

    def work(k: int) -> None:
        try:
            results[k] = run(parts[k])
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
    return sum_shares(*results)


def sum_shares(*parts: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Add partial sums (dicts of row blocks) in argument order."""
    out: dict[int, np.ndarray] = {}
    for part in parts:
        for b, y in part.items():
            if b in out:
                out[b] = out[b] + y
            else:
                out[b] = y
    return out


# ---- the driver (runs in the caller) ----


class WorkerPasses:
    """The per-worker pass driver for one :class:`~kpca_dask.block_matrix.BlockKernelMatrix`
    on a distributed ``client`` (see the module's docstring).

    ``keep``: the kept blocks (``None``: none; ``"all"``: every upper block; a list of
    pairs: the partial tier's), evaluated in ``eval_dtype`` and kept in ``dtype`` at the
    first pass. Built by the matrix at its first product; :meth:`release` drops every
    future it holds."""

    def __init__(self, K: Any, client: Any, keep: Any = None):
        self.K = K
        self.client = client
        self.dtype = np.dtype(K.dtype)
        self.eval_dtype = np.dtype(K.cache_eval_dtype)
        self.workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if not self.workers:
            raise RuntimeError("the distributed client has no workers")
        self.shares = assign_pairs(K.row_chunks, len(self.workers))
        upper = set(K.upper_blocks())
        self.keep: set[tuple[int, int]] = (
            set() if keep is None else upper if keep == "all" else set(keep) & upper
        )
        self.token = tokenize(K.X.name, K.kernel, self.dtype.str, sorted(self.keep))
        self.rows: list[Any] = []  # per share: future of its row blocks (or None)
        self.cache: list[Any] = []  # per share: future of its kept blocks (or None)
        self.passes = 0

    # the resident data

    def _place(self) -> None:
        """First pass: the rows (and the kept blocks) of every share on its worker."""
        import dask
        from distributed import futures_of

        K, client = self.K, self.client
        Xp = client.persist(K.X)
        xfut = {f.key: f for f in futures_of(Xp)}
        xname = Xp.name
        rows, cache = [], []
        with dask.annotate(priority=10):
            for s, pairs in enumerate(self.shares):
                w = self.workers[s % len(self.workers)]
                blocks = share_blocks(pairs)
                rf = client.submit(
                    collect_rows,
                    blocks,
                    *[xfut[(xname, b, 0)] for b in blocks],
                    key=f"kpca-wrows-{self.token}-{s}",
                    workers=[w],
                    allow_other_workers=True,
                    pure=False,
                )
                kept = [p for p in pairs if p in self.keep]
                cf = None
                if kept:
                    cf = client.submit(
                        fill_share,
                        K.kernel,
                        rf,
                        kept,
                        self.dtype.str,
                        self.eval_dtype.str,
                        key=f"kpca-wcache-{self.token}-{s}",
                        workers=[w],
                        allow_other_workers=True,
                        pure=False,
                    )
                evaluates = len(kept) < len(pairs)
                rows.append(rf if evaluates else None)
                cache.append(cf)
        self.rows, self.cache = rows, cache
        del Xp, xfut  # the shares' tasks hold what they still need

    def panel_bounds(self) -> np.ndarray:
        """The first row block of each row panel (and ``nb`` last): at most ``W`` panels
        of whole row blocks with about equal rows; panel ``p`` lives on worker ``p``."""
        return panel_starts(self.K.row_chunks, len(self.workers))

    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.K.row_chunks)]).astype(int)

    def _panel_of(self, bounds: np.ndarray) -> dict[int, tuple[int, int, int]]:
        offsets = self.offsets()
        panel_of = {}
        for p in range(len(bounds) - 1):
            b0, b1 = int(bounds[p]), int(bounds[p + 1])
            for b in range(b0, b1):
                a, e = int(offsets[b] - offsets[b0]), int(offsets[b + 1] - offsets[b0])
                panel_of[b] = (p, a, e)
        return panel_of

    def _share_tree(self, pf: Sequence[Any], panel_of: dict, ptoken: str) -> Any:
        """The share tasks on the panels ``pf`` and their tree of sums: the root's future."""
        client, w = self.client, len(self.workers)
        leaves = []
        for s, pairs in enumerate(self.shares):
            blocks = share_blocks(pairs)
            need = sorted({panel_of[b][0] for b in blocks})
            local = {b: (need.index(panel_of[b][0]), *panel_of[b][1:]) for b in blocks}
            leaves.append(
                client.submit(
                    share_product,
                    self.K.kernel,
                    self.rows[s],
                    self.cache[s],
                    pairs,
                    local,
                    self.dtype.str,
                    [pf[p] for p in need],
                    key=f"kpca-kz-part-w-{ptoken}-{s}",
                    workers=[self.workers[s % w]],
                    allow_other_workers=True,
                    pure=False,
                )
            )
        level, tier = leaves, 0
        while len(level) > 1:
            nxt = []
            for a in range(0, len(level), REDUCE_FAN_IN):
                group = level[a : a + REDUCE_FAN_IN]
                nxt.append(
                    client.submit(
                        sum_shares,
                        *group,
                        key=f"kpca-kz-sum-{ptoken}-{tier}-{a // REDUCE_FAN_IN}",
                        pure=False,
                    )
                )
            level, tier = nxt, tier + 1
        return level[0]

    def product(self, Z: np.ndarray) -> np.ndarray:
        """``K @ Z`` (numpy, float64) in one round of share tasks and a tree of sums."""
        from distributed import wait

        K, client = self.K, self.client
        if not self.rows and not self.cache:
            self._place()
        ncols = int(Z.shape[1])
        offsets = self.offsets()
        # Z in W row panels of whole row blocks (about equal rows), straight to the workers
        bounds = self.panel_bounds()
        panel_of = self._panel_of(bounds)
        Zc = np.ascontiguousarray(Z, dtype=self.dtype)
        panels = [
            Zc[offsets[bounds[p]] : offsets[bounds[p + 1]]] for p in range(len(bounds) - 1)
        ]
        pf = client.scatter(panels, direct=True, hash=False)
        ptoken = tokenize(self.token, self.passes, Zc.shape)
        self.passes += 1
        root = self._share_tree(pf, panel_of, ptoken)
        wait([root])
        parts = root.result()
        Y = np.zeros((K.n, ncols), dtype=np.float64)
        for b, y in parts.items():
            Y[offsets[b] : offsets[b + 1]] = y
        del pf, root, parts
        return Y

    def product_resident(
        self, store: str, src: str, dst: str, shift: np.ndarray, ones: bool = False
    ) -> list[Any]:
        """``K @ (src - shift)`` with ``src`` and the result row panels resident on the
        workers (:mod:`kpca_dask.worker_basis`'s store ``store``): a task per panel
        publishes its rows (``[src - shift, 1]`` with ``ones``), the share tasks and the
        tree of sums run as in :meth:`product`, and the root is cut into the panels on
        their workers (a level of ``ceil(P / f)`` group tasks when there are more than
        ``f`` panels, then a task per panel storing ``dst``). Returns each panel's small
        result of :func:`~kpca_dask.worker_basis.store_rows` (its column sums); the caller
        receives nothing of size ``n``."""
        from . import worker_basis as wb

        client = self.client
        if not self.rows and not self.cache:
            self._place()
        bounds = self.panel_bounds()
        P = len(bounds) - 1
        panel_of = self._panel_of(bounds)
        offsets = self.offsets()
        ptoken = tokenize(self.token, self.passes, store, src, dst)
        self.passes += 1
        pf = [
            client.submit(
                wb.publish,
                store,
                src,
                np.asarray(shift, dtype=np.float64),
                ones,
                self.dtype.str,
                key=f"kpca-wpub-{ptoken}-{p}",
                workers=[self.workers[p]],
                allow_other_workers=False,
                pure=False,
            )
            for p in range(P)
        ]
        root = self._share_tree(pf, panel_of, ptoken)
        f = REDUCE_FAN_IN
        groups: list[Any] = []
        if P > f:
            for g in range(0, P, f):
                blocks = list(range(int(bounds[g]), int(bounds[min(g + f, P)])))
                groups.append(
                    client.submit(
                        wb.pick_blocks,
                        root,
                        blocks,
                        key=f"kpca-wcut-{ptoken}-{g // f}",
                        workers=[self.workers[g]],
                        allow_other_workers=True,
                        pure=False,
                    )
                )
        stored = []
        for p in range(P):
            b0, b1 = int(bounds[p]), int(bounds[p + 1])
            local = {b: int(offsets[b] - offsets[b0]) for b in range(b0, b1)}
            stored.append(
                client.submit(
                    wb.store_rows,
                    store,
                    dst,
                    groups[p // f] if groups else root,
                    local,
                    int(offsets[b1] - offsets[b0]),
                    ones,
                    self.K.n,
                    key=f"kpca-wstore-{ptoken}-{p}",
                    workers=[self.workers[p]],
                    allow_other_workers=False,
                    pure=False,
                )
            )
        out = client.gather(stored)
        del pf, root, groups, stored
        return out

    def release(self) -> None:
        """Drop the resident rows and kept blocks (the cluster frees them)."""
        self.rows, self.cache = [], []


class OnWorkers:
    """:meth:`BlockKernelMatrix.product` by :class:`WorkerPasses` (a mixin of the matrix:
    it uses ``block_reader``, ``_cache``, ``_cache_pending`` and ``_cache_pairs``)."""

    #: the driver's state while it runs (a class default: PrecomputedKernelMatrix does
    #: not call the matrix's __init__)
    _worker_passes: Any = None

    def _uses_worker_passes(self) -> bool:
        """Whether :meth:`product` runs the per-worker pass driver: a distributed
        client, the dask config :data:`~kpca_dask.worker_passes.DRIVER_CONFIG` set to
        ``"workers"``, blocks evaluated from the rows by the kernel (no kernel store, not
        a precomputed matrix) and no blocks kept by the waves driver's cache already."""
        if self.block_reader is not None or self._cache is not None:
            return False
        if type(self)._pair_graph.__qualname__ != "BlockKernelMatrix._pair_graph":
            return False  # blocks of another kind (a precomputed matrix's): the waves driver
        if exact_driver() != "workers":
            return False
        from .resources import _scheduler_kind

        kind, _ = _scheduler_kind()
        return kind == "distributed"

    def worker_passes(self) -> WorkerPasses:
        """The per-worker pass driver of this matrix (built at its first use, with the
        kept blocks the kernel cache asks for)."""
        if self._worker_passes is None:
            from .resources import _scheduler_kind

            _, client = _scheduler_kind()
            keep = None
            if self._cache_pending:
                keep = "all" if self._cache_pairs is None else list(self._cache_pairs)
            self._cache_pending = False
            self._worker_passes = WorkerPasses(self, client, keep)
        return self._worker_passes

    def _product_on_workers(self, Z: np.ndarray) -> np.ndarray:
        """:meth:`product` by :class:`~kpca_dask.worker_passes.WorkerPasses`: one task per
        worker a pass, the rows and the kept blocks resident on the workers from the
        first pass until :meth:`release_cache`."""
        return self.worker_passes().product(Z)
