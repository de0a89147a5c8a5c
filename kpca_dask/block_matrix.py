"""The block-partitioned kernel matrix over the row blocks of a dask array, never
formed (the partition, the products and the memory model: :mod:`kpca_dask.gram`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .block_products import (
    _diag_block,
    _stored_task,
    _sum_parts,
    cache_block,
    exact_waves,
    kernel_block,
    pair_products,
    stored_pair_products,
    upper_block_bytes,
)
from .cache_tiers import block_evaluations, blocks_to_cache
from .cluster_waves import ClusterWaves
from .exceptions import InvalidInputError
from .kernels import Kernel
from .params import KERNEL_CACHE_MODES
from .resources import (
    BUDGET_SET,
    CACHE_BUDGET_CONFIG,
    _cluster_threads,
    _scheduler_kind,
    kernel_cache_budget,
)
from .worker_passes import OnWorkers


class BlockKernelMatrix(ClusterWaves, OnWorkers):
    """The kernel matrix ``K = k(X, X)`` over the row blocks of ``X``, never formed.

    Parameters
    ----------
    X : dask array of shape (n_samples, n_features)
        Row-chunked, with a single chunk along the features. Its row chunks
        are the blocks of the partition.
    kernel : Kernel
        The kernel (see :mod:`kpca_dask.kernels`).
    dtype : {"float32", "float64"}
        Precision of kernel evaluation and of the in-block products
        (accumulation across blocks is always float64).
    block_reader : callable, optional
        ``block_reader(I, J) -> ndarray`` returning a stored upper block
        ``K_IJ`` (``I <= J``); when given, products read the stored blocks
        instead of evaluating the kernel (a materialised kernel store).
    cache_eval_dtype : {"float32", "float64"}, optional
        Precision in which the memory tier of :meth:`kernel_cache` evaluates its
        blocks before keeping them in ``dtype`` (default ``dtype``). Mixed precision
        (kpca_dask.mixed) evaluates in float64 and keeps float32 blocks.
    """

    def __init__(
        self,
        X: da.Array,
        kernel: Kernel,
        dtype: Any = np.float64,
        block_reader=None,
        cache_eval_dtype: Any = None,
    ):
        if X.ndim != 2:
            raise InvalidInputError(f"Expected a 2-D array, got {X.ndim} dimensions.")
        if len(X.chunks[1]) != 1:
            raise InvalidInputError(
                f"X must have a single chunk along the features, got chunks {X.chunks[1]}; "
                "rechunk with X.rechunk({1: -1})."
            )
        if any(np.isnan(c) for c in X.chunks[0]):
            raise InvalidInputError(
                "X has unknown chunk sizes; call X.compute_chunk_sizes() first "
                "(or to_dask_array(lengths=True) for dataframes)."
            )
        self.X = X
        self.kernel = kernel
        self.dtype = np.dtype(dtype)
        self.block_reader = block_reader
        self.cache_eval_dtype = np.dtype(cache_eval_dtype or dtype)
        self._products = 0  # products computed: the stored path alternates their order
        self._cache: dict[tuple[int, int], Any] | None = None  # (I, J) -> persisted block
        self._cache_pending = False  # fill the cache at the next product
        #: the blocks the next fill keeps (None: every upper block, the memory tier)
        self._cache_pairs: list[tuple[int, int]] | None = None

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def row_chunks(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.X.chunks[0])

    @property
    def n_blocks(self) -> int:
        return len(self.X.chunks[0])

    def upper_blocks(self) -> list[tuple[int, int]]:
        """The (I, J) pairs with I <= J that a product evaluates."""
        nb = self.n_blocks
        return [(i, j) for i in range(nb) for j in range(i, nb)]

    def kernel_evaluations_per_pass(self) -> int:
        """Kernel entries one product evaluates (about ``n (n + strip) / 2``).

        Off-diagonal blocks are evaluated whole; a diagonal block strip by
        strip from its diagonal on (the upper triangle plus the lower half of
        each strip's diagonal square).
        """
        c, item = self.row_chunks, self.dtype.itemsize
        return sum(block_evaluations(c[i], c[j], i == j, item) for i, j in self.upper_blocks())

    def upper_block_bytes(self) -> int:
        """Bytes of all upper blocks ``K_IJ`` (``I <= J``, diagonal squares whole) in
        the compute dtype: what the memory tier of :meth:`kernel_cache` holds."""
        return upper_block_bytes(self.row_chunks, self.dtype.itemsize)

    def products_in(self, dtype: Any) -> BlockKernelMatrix:
        """The same matrix with products in ``dtype``, sharing this one's cached blocks
        (float32 blocks are then multiplied in float64: exact products of the rounded
        blocks). Without a cache, blocks are evaluated in ``dtype``."""
        other = BlockKernelMatrix(
            self.X, self.kernel, dtype, self.block_reader, self.cache_eval_dtype
        )
        other._cache = self._cache
        return other

    def plan_cache(self, mode: str = "auto", solver: str = "randomized") -> dict[str, Any]:
        """Decide where the kernel blocks come from during the passes of a solve.

        Tiers: ``"memory"`` evaluates every upper block once (first pass) and keeps
        it in memory -- on the workers of a distributed cluster, in this process on
        the threaded scheduler -- until :meth:`release_cache`; ``"partial"`` keeps
        the upper blocks that fit the budget that way (:func:`blocks_to_cache`) and
        evaluates the others at every pass; ``"recompute"`` evaluates the blocks
        again at every pass (memory: one strip per task); ``"store"`` reads them
        from the kernel store (``block_reader``). ``mode``: ``"auto"`` keeps all the
        blocks in memory when they fit :func:`kernel_cache_budget`, as many as fit
        when the budget holds at least one block but not all, none below that, when
        the solver makes several passes (a stored kernel stays on disk: the caller
        chose it); ``"memory"`` and ``"recompute"`` force a tier (``"memory"`` with
        a stored kernel reads each block once).
        Returns the decision (JSON-serialisable, for ``solver_info_``): ``tier``,
        ``reason``, ``bytes`` (all upper blocks), ``cached_bytes``, ``blocks_cached``
        and ``blocks`` (upper blocks in all), with ``"auto"`` the ``budget``.
        """
        from dask.utils import format_bytes

        if mode not in KERNEL_CACHE_MODES:
            raise InvalidInputError(
                f"kernel_cache must be one of {KERNEL_CACHE_MODES}, got {mode!r}."
            )
        nbytes = self.upper_block_bytes()
        info: dict[str, Any] = {"requested": mode, "bytes": nbytes}
        pairs: list[tuple[int, int]] | None = None  # the partial tier's blocks
        source = "store" if self.block_reader is not None else "recompute"
        if solver not in ("randomized", "arpack"):
            tier, why = source, f"the {solver} solver reads every block once"
        elif mode == "recompute":
            tier, why = source, "kernel_cache='recompute'"
        elif mode == "memory":
            tier, why = "memory", "kernel_cache='memory'"
        elif self.block_reader is not None:
            tier, why = "store", "blocks read from the kernel store"
        else:
            budget, where = kernel_cache_budget()
            info["budget"] = int(budget)
            fits = nbytes <= budget
            why = (
                f"upper blocks {format_bytes(nbytes)} {'within' if fits else 'above'} "
                f"the budget {format_bytes(budget)} ({where})"
            )
            if fits:
                tier = "memory"
            elif where != BUDGET_SET:
                # the partial tier only on a budget the user set: measured at n = 100 000
                # on two local workers it took 13.2 GiB instead of 1.6 GiB for no faster
                # solve (41.5 s against 37.9 s, 5 passes; docs/tuning.md)
                tier = "recompute"
                why += f": none kept (set {CACHE_BUDGET_CONFIG} to keep the blocks that fit)"
            else:
                pairs = blocks_to_cache(self.row_chunks, self.dtype.itemsize, budget)
                tier = "partial" if pairs else "recompute"
                why += (
                    f": {len(pairs)} of {len(self.upper_blocks())} blocks kept, the others "
                    "evaluated at every pass"
                    if pairs
                    else ": not one block fits"
                )
        total = len(self.upper_blocks())
        kept = {"memory": total, "partial": len(pairs or ())}.get(tier, 0)
        c, item = self.row_chunks, self.dtype.itemsize
        info["tier"], info["reason"] = tier, why
        info["blocks"], info["blocks_cached"] = total, kept
        info["cached_bytes"] = (
            nbytes if tier == "memory" else sum(c[i] * c[j] * item for i, j in pairs or ())
        )
        self._cache_pending = tier in ("memory", "partial")
        self._cache_pairs = pairs
        return info

    def _fill_cache(self) -> None:
        """Evaluate (or read) every upper block once -- the partial tier: the blocks it
        chose -- and keep it: ``dask.persist`` of one task per block (futures held on
        the workers of a distributed cluster, arrays in this process on the threaded
        scheduler)."""
        import dask

        self._cache_pending = False
        token = tokenize(
            self.X.name,
            self.kernel,
            self.dtype.str,
            self.cache_eval_dtype.str,
            self.block_reader if self.block_reader is not None else "eval",
        )
        pairs = self.upper_blocks() if self._cache_pairs is None else list(self._cache_pairs)
        if self.block_reader is not None:
            tasks = [
                dask.delayed(self.block_reader, pure=True)(
                    i, j, dask_key_name=f"kpca-kblock-{token}-{i}-{j}"
                )
                for i, j in pairs
            ]
        else:
            xb = self.X.to_delayed()[:, 0]
            tasks = [
                dask.delayed(cache_block, pure=True)(
                    self.kernel,
                    xb[i],
                    xb[j],
                    self.dtype.str,
                    self.cache_eval_dtype.str,
                    dask_key_name=f"kpca-kblock-{token}-{i}-{j}",
                )
                for i, j in pairs
            ]
        self._cache = dict(zip(pairs, dask.persist(*tasks)))

    def release_cache(self) -> None:
        """Drop the cached blocks: the last references to their futures (the
        cluster frees them) or arrays."""
        self._cache = None
        self._cache_pending = False
        self._cache_pairs = None
        if self._worker_passes is not None:
            self._worker_passes.release()
            self._worker_passes = None

    def _evaluates_blocks(self) -> bool:
        """Whether a product evaluates kernel blocks (it needs the rows of X): no
        kernel store and not every block cached."""
        if self.block_reader is not None:
            return False
        return self._cache is None or len(self._cache) < len(self.upper_blocks())

    def _cache_token(self) -> Any:
        """What the products' keys depend on about the cache: the blocks it holds."""
        return None if self._cache is None else sorted(self._cache)

    @contextlib.contextmanager
    def kernel_cache(
        self, mode: str = "auto", solver: str = "randomized"
    ) -> Iterator[dict[str, Any]]:
        """:meth:`plan_cache`, then the cached blocks released on exit (even on error).

        The blocks are filled lazily by the first product, so the first pass
        pays for their evaluation and the following passes read them.
        """
        info = self.plan_cache(mode, solver)
        try:
            yield info
        finally:
            self.release_cache()

    def _z_source(self, Z, dsk, deps, token):
        ncols = int(Z.shape[1])
        if isinstance(Z, da.Array):
            Zd = Z.rechunk((self.row_chunks, (ncols,)))
            deps.append(Zd)
            return lambda i: (Zd.name, i, 0)
        Z = np.asarray(Z)
        offsets = np.concatenate([[0], np.cumsum(self.row_chunks)])
        zname = "kpca-z-" + token
        used = set()

        def key(i):
            if i not in used:
                dsk[(zname, i)] = Z[offsets[i] : offsets[i + 1]]
                used.add(i)
            return (zname, i)

        return key

    def _pair_graph(self, Z, rows: range, token: str, X=None) -> tuple[dict, list, str]:
        """Tasks for the upper blocks in block rows ``rows`` and, per row block
        ``j >= rows.start``, one key ``(oname, j - rows.start, 0)`` summing what
        they contribute to ``(K @ Z)_j``. ``X``: the rows to use instead of
        ``self.X`` (the same values, persisted on a cluster)."""
        nb = self.n_blocks
        X = self.X if X is None else X
        pname = "kpca-kz-part-" + token
        oname = "kpca-kz-" + token
        dsk: dict[Any, Any] = {}
        deps: list[Any] = [X]
        zkey = self._z_source(Z, dsk, deps, token)
        xn = X.name
        contrib: dict[int, list] = {j: [] for j in range(rows.start, nb)}
        for i in rows:
            for j in range(i, nb):
                zj = None if i == j else zkey(j)
                blk = None if self._cache is None else self._cache.get((i, j))
                if blk is not None:
                    deps.append(blk)
                    task = (stored_pair_products, blk.key, zkey(i), zj, self.dtype.str)
                elif self.block_reader is not None:
                    task = (_stored_task, self.block_reader, i, j, zkey(i), zj, self.dtype.str)
                else:
                    xj = None if i == j else (xn, j, 0)
                    task = (
                        pair_products,
                        self.kernel,
                        (xn, i, 0),
                        xj,
                        zkey(i),
                        zj,
                        self.dtype.str,
                    )
                dsk[(pname, i, j)] = task
                # K_ij Z_j goes to row block i, K_ij^T Z_i to row block j
                contrib[i].append(((pname, i, j), 0))
                if i != j:
                    contrib[j].append(((pname, i, j), 1))
        for j, parts in contrib.items():  # output keys count from rows.start
            dsk[(oname, j - rows.start, 0)] = (
                _sum_parts,
                [k for k, _ in parts],
                [w for _, w in parts],
            )
        return dsk, deps, oname

    def _product_token(self, Z: Any) -> str:
        """The graph keys' token of a product with ``Z``: the rows, the kernel, the
        compute dtype, where the blocks come from and what the cache holds."""
        return tokenize(
            self.X.name,
            self.kernel,
            self.dtype.str,
            Z,
            self.block_reader is None,
            self._cache_token(),
        )

    def matmul(self, Z: np.ndarray | da.Array) -> da.Array:
        """Lazy ``K @ Z`` for ``Z`` of shape (n, l): one task per upper block.

        ``Z`` may be a numpy array (split along the row blocks of X) or a dask
        array (rechunked to them). The result is a float64 dask array with the
        row chunks of X and a single column chunk. One graph for the whole
        product: simple, but a scheduler may keep O(nb^2) block products
        alive before the sums consume them -- :meth:`product` bounds that.
        """
        if Z.ndim != 2 or Z.shape[0] != self.n:
            raise InvalidInputError(f"Z must have shape ({self.n}, l), got {Z.shape}.")
        if self._cache_pending:
            self._fill_cache()
        token = self._product_token(Z)
        dsk, deps, oname = self._pair_graph(Z, range(self.n_blocks), token)
        graph = HighLevelGraph.from_collections(oname, dsk, dependencies=deps)
        return da.Array(
            graph, oname, chunks=(self.row_chunks, (int(Z.shape[1]),)), dtype=np.float64
        )

    def product(self, Z: np.ndarray, wave_tasks: int | None = None) -> np.ndarray:
        """``K @ Z`` computed now, in *waves* of block rows, as a numpy array.

        Each wave is one graph over a few consecutive block rows (about
        ``wave_tasks`` block tasks, default ``max(128, 4 x threads)``); its
        partial sums are added into the result (on the workers when the scheduler
        is distributed: :meth:`_product_on_cluster`). Memory on the
        cluster is then bounded by one wave's block products instead of
        growing as ``(n / r)^2`` (measured: with one graph, dask kept half of
        all 1275 block products of an n = 100k pass alive at once).
        """
        import dask

        if Z.ndim != 2 or Z.shape[0] != self.n:
            raise InvalidInputError(f"Z must have shape ({self.n}, l), got {Z.shape}.")
        Z = np.asarray(Z)
        nb = self.n_blocks
        if self._worker_passes is not None or self._uses_worker_passes():
            return self._product_on_workers(Z)
        if self._cache_pending:
            self._fill_cache()
        wave_tasks = wave_tasks or max(128, 4 * _cluster_threads())
        offsets = np.concatenate([[0], np.cumsum(self.row_chunks)])
        Y = np.zeros((self.n, Z.shape[1]), dtype=np.float64)
        token = self._product_token(Z)
        waves = exact_waves(self.row_chunks, wave_tasks)
        if self.block_reader is not None and self._cache is None:
            # A stored K read in the same order every pass defeats the page cache as
            # soon as the store is a little larger than it: each pass evicts the
            # blocks the next one starts with. Alternating the direction starts every
            # pass with the blocks the previous one read last.
            if self._products % 2:
                waves.reverse()
            self._products += 1
        kind, client = _scheduler_kind()
        Zsrc: Any = Z
        if kind == "distributed":
            # One copy of Z's row blocks on the workers for every wave of this pass: in
            # each wave's graph they would go through the scheduler again (n = 50 000:
            # passes 2.3x slower than the same tasks on threads). Persisted, not
            # scattered: the scheduler keeps the blocks' tasks and recomputes a block a
            # killed worker held (scattered data is lost with it). In the compute
            # dtype, as the tasks convert them anyway (the same values).
            Zc = Z.astype(self.dtype, copy=False)
            zname = "kpca-z-" + token
            zdsk = {
                (zname, b, 0): np.ascontiguousarray(Zc[offsets[b] : offsets[b + 1]])
                for b in range(nb)
            }
            Zsrc = client.persist(
                da.Array(
                    HighLevelGraph.from_collections(zname, zdsk, dependencies=[]),
                    zname,
                    chunks=(self.row_chunks, (int(Z.shape[1]),)),
                    dtype=Zc.dtype,
                )
            )
        if kind == "distributed":
            self._product_on_cluster(client, Zsrc, waves, token, offsets, Y)
            return Y
        for start, stop in waves:
            dsk, deps, oname = self._pair_graph(Zsrc, range(start, stop), f"{token}-{start}")
            graph = HighLevelGraph.from_collections(oname, dsk, dependencies=deps)
            wave = da.Array(
                graph, oname, chunks=(self.row_chunks[start:], (Z.shape[1],)), dtype=np.float64
            )
            (part,) = dask.compute(wave)
            Y[offsets[start] :] += part
        return Y

    def diag(self) -> da.Array:
        """Lazy ``k(x_i, x_i)`` for every row (float64)."""
        return self.X.map_blocks(
            _diag_block,
            self.kernel,
            drop_axis=1,
            dtype=np.float64,
            name="kpca-diag-" + tokenize(self.X.name, self.kernel),
        )

    def to_numpy(self) -> np.ndarray:
        """The whole matrix as numpy (small n only: the dense solver).

        The upper blocks are evaluated as dask tasks (on the cluster when one
        is active) and mirrored into one n x n array on the caller.
        """
        import dask

        xb = self.X.to_delayed()[:, 0]
        pairs = self.upper_blocks()
        cache = self._cache or {}  # e.g. the randomized solver escalated to dense
        tasks = []
        for i, j in pairs:
            if (i, j) in cache:
                tasks.append(cache[(i, j)])
            elif self.block_reader is not None:
                tasks.append(dask.delayed(self.block_reader, pure=True)(i, j))
            else:
                tasks.append(
                    dask.delayed(kernel_block, pure=True)(self.kernel, xb[i], xb[j], self.dtype)
                )
        blocks = dask.compute(*tasks)
        offsets = np.concatenate([[0], np.cumsum(self.row_chunks)])
        K = np.empty((self.n, self.n), dtype=self.dtype)
        for (i, j), blk in zip(pairs, blocks):
            K[offsets[i] : offsets[i + 1], offsets[j] : offsets[j + 1]] = blk
            if i != j:
                K[offsets[j] : offsets[j + 1], offsets[i] : offsets[i + 1]] = blk.T
        return K
