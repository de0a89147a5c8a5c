"""The block-partitioned kernel matrix over the row blocks of a dask array.

``X`` (n x d) is split into row blocks ``X_0, X_1, ...`` (its dask chunks).
The kernel matrix is the grid of blocks ``K_IJ = k(X_I, X_J)``; by symmetry only
the blocks with ``I <= J`` are ever evaluated. A product ``K @ Z`` is one dask
graph with one task per upper block, which uses its block twice:
``K_IJ Z_J`` goes to row block ``I`` and ``K_IJ^T Z_I`` to row block ``J``.

Inside a task the block is never held whole: it is produced in strips of rows
small enough to stay in cache (about a megabyte), and each strip is consumed by
the two GEMMs right after the kernel evaluation that made it. Diagonal blocks
evaluate only their upper triangle (strip by strip), so a full pass evaluates
``n (n + r) / 2`` kernel entries for row blocks of ``r`` rows.

Memory model: a task holds its two row blocks of ``X``, the matching rows of
``Z``, one strip (``strip_rows x r`` in the compute dtype) and two ``r x l``
float64 accumulators. Nothing of size ``n x n`` exists anywhere. All graphs
are lazy and carry deterministic names (``tokenize``), so they run unchanged
on the threaded scheduler, a LocalCluster or a remote ``distributed`` cluster.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .exceptions import InvalidInputError
from .kernels import Kernel
from .params import KERNEL_CACHE_MODES  # noqa: F401  (what kernel_cache accepts)

__all__ = [
    "KERNEL_CACHE_MODES",
    "BlockKernelMatrix",
    "cross_products",
    "kernel_block",
    "kernel_cache_budget",
    "pair_products",
    "stored_pair_products",
]

#: Target size of one strip of kernel values, in bytes: larger strips make the GEMMs
#: more efficient than their cache misses cost (measurements: docs/tuning.md).
STRIP_BYTES = 4 << 20


def _strip_rows(ncols: int, itemsize: int) -> int:
    return int(max(16, min(4096, STRIP_BYTES // max(1, ncols * itemsize))))


def kernel_block(
    kernel: Kernel, xi: np.ndarray, xj: np.ndarray, dtype: Any, eval_dtype: Any = None
) -> np.ndarray:
    """The whole block ``k(xi, xj)`` in ``dtype`` (used to materialise K).

    ``eval_dtype``: evaluate in this dtype, then round to ``dtype`` (mixed precision:
    float64 values rounded to float32 are within float32's unit roundoff of the kernel,
    entry by entry; a float32 evaluation is not -- the expanded distance cancels)."""
    dtype = np.dtype(dtype)
    ev = dtype if eval_dtype is None else np.dtype(eval_dtype)
    if ev == dtype:
        return np.asarray(kernel(xi, xj, dtype=dtype), dtype=dtype)
    # strip by strip into the rounded block: no whole block in the evaluation dtype
    A = kernel.prepare(np.asarray(xi), ev, "left")
    B = kernel.prepare(np.asarray(xj), ev, "right")
    out = np.empty((A.shape[0], B.shape[0]), dtype=dtype)
    step = _strip_rows(B.shape[0], ev.itemsize)
    buf = np.empty(step * B.shape[0], dtype=ev)
    for a in range(0, A.shape[0], step):
        b = min(a + step, A.shape[0])
        out[a:b] = kernel.evaluate(
            A[a:b], B, out=buf[: (b - a) * B.shape[0]].reshape(b - a, -1)
        )
    return out


def cache_block(
    kernel: Kernel, xi: np.ndarray, xj: np.ndarray, dtype: Any, eval_dtype: Any = None
) -> np.ndarray:
    """:func:`kernel_block` for the memory tier of :meth:`BlockKernelMatrix.kernel_cache`,
    float32 subnormals flushed to zero (:func:`_flush_subnormal`)."""
    return _flush_subnormal(kernel_block(kernel, xi, xj, dtype, eval_dtype))


def _flush_subnormal(block: np.ndarray) -> np.ndarray:
    """Zero the subnormal values of a float32 block, in place (returned).

    rbf values between far clusters (``exp(-88)`` and below) are float32 subnormals,
    and a GEMM on subnormals runs at a fraction of its speed: a pass over the cached
    float32 blocks of the clustered headline data took 0.17 s against 0.11 s for
    float64 blocks (n = 10 000). The values changed are below ``1.2e-38`` in absolute
    value: far below any level the certificate works at."""
    if block.dtype == np.float32:
        np.putmask(block, np.abs(block) < np.finfo(np.float32).tiny, 0.0)
    return block


def pair_products(
    kernel: Kernel,
    xi: np.ndarray,
    xj: np.ndarray | None,
    zi: np.ndarray,
    zj: np.ndarray | None,
    dtype: Any,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(K_IJ @ zj, K_IJ^T @ zi)`` for one upper block, evaluated strip by strip.

    For a diagonal block pass ``xj = zj = None``: only the upper triangle of
    ``K_II`` is evaluated and ``(K_II @ zi, None)`` is returned. Products run
    in ``dtype``; the accumulators are float64.
    """
    dtype = np.dtype(dtype)
    diagonal = xj is None
    A = kernel.prepare(xi, dtype, "left")
    B = kernel.prepare(xi if diagonal else xj, dtype, "right")
    return _accumulate(
        lambda a, b, c, out: kernel.evaluate(A[a:b], B[c:], out=out),
        A.shape[0],
        B.shape[0],
        zi,
        zi if diagonal else zj,
        diagonal,
        dtype,
    )


def _aligned(a: np.ndarray, dtype: Any) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype`` whose data are aligned to its items
    (copied only when they are not). An array deserialised from a Dask message can
    start at any byte; numpy's matmul hands only aligned operands to BLAS and multiplies
    the others with its own loop, whose sums round differently: a product's last bits
    would then depend on where a message put the array (seen as run-to-run and
    local-vs-object-store differences in the embedding)."""
    return np.require(a, dtype=dtype, requirements=["C_CONTIGUOUS", "ALIGNED"])


#: Bytes of a stored (cached or read) kernel block multiplied at a time: both products of a
#: strip (``K_s Z_J`` and ``Z_I,s^T K_s``) run while it is in cache (docs/tuning.md).
STORED_STRIP_BYTES = 2 << 20


def stored_pair_products(
    block: np.ndarray, zi: np.ndarray, zj: np.ndarray | None, dtype: Any
) -> tuple[np.ndarray, np.ndarray | None]:
    """As :func:`pair_products` for a block read from a kernel store.

    A stored diagonal block (``zj is None``) holds its full square.
    """
    dtype = np.dtype(dtype)
    if np.dtype(block.dtype).itemsize < dtype.itemsize:
        return _upcast_pair_products(block, zi, zj, dtype)
    blk = _aligned(block, dtype)
    zi_c = _aligned(zi, dtype)
    if zj is None:
        return blk @ zi_c, None
    zj_c = _aligned(zj, dtype)
    # Strip by strip, both products while the strip is in cache: the block is read
    # once instead of twice (faster in float32, no loss in float64; docs/tuning.md).
    # The second product is accumulated transposed (c x r, contiguous rows). Partials
    # travel in the compute dtype, as in pair_products.
    ri, ncols = blk.shape[0], zi_c.shape[1]
    yi = np.empty((ri, ncols), dtype=dtype)
    yjT = np.zeros((ncols, blk.shape[1]), dtype=dtype)
    step = max(16, STORED_STRIP_BYTES // max(1, blk.shape[1] * blk.itemsize))
    for a in range(0, ri, step):
        b = min(ri, a + step)
        np.matmul(blk[a:b], zj_c, out=yi[a:b])
        yjT += zi_c[a:b].T @ blk[a:b]
    return yi, np.ascontiguousarray(yjT.T)


def _upcast_pair_products(block, zi, zj, dtype):
    """:func:`stored_pair_products` of a float32 block in float64 (mixed precision's
    certifying pass): strips of the block converted in cache, never the whole block."""
    zi_c = _aligned(zi, dtype)
    zj_c = zi_c if zj is None else _aligned(zj, dtype)
    ri, rj = block.shape
    yi = np.empty((ri, zi_c.shape[1]), dtype=dtype)
    yjT = None if zj is None else np.zeros((zi_c.shape[1], rj), dtype=dtype)
    step = max(16, STORED_STRIP_BYTES // max(1, rj * dtype.itemsize))
    buf = np.empty(step * rj, dtype=dtype)
    for a in range(0, ri, step):
        b = min(ri, a + step)
        s = buf[: (b - a) * rj].reshape(b - a, rj)
        s[...] = block[a:b]
        np.matmul(s, zj_c, out=yi[a:b])
        if yjT is not None:
            yjT += zi_c[a:b].T @ s
    return yi, None if yjT is None else np.ascontiguousarray(yjT.T)


def _accumulate(strip_fn, ri, rj, zi, zj, diagonal, dtype):
    zi_c = _aligned(zi, dtype)
    zj_c = zi_c if diagonal else _aligned(zj, dtype)
    ncols = zi.shape[1]
    yi = np.zeros((ri, ncols), dtype=np.float64)
    yj = None if diagonal else np.zeros((rj, ncols), dtype=np.float64)
    step = _strip_rows(rj, dtype.itemsize)
    buf = np.empty(step * rj, dtype=dtype)
    for a in range(0, ri, step):
        b = min(a + step, ri)
        c = a if diagonal else 0
        Ks = strip_fn(a, b, c, buf[: (b - a) * (rj - c)].reshape(b - a, rj - c))
        if Ks.dtype != dtype:
            Ks = Ks.astype(dtype)
        yi[a:b] += Ks @ zj_c[c:]
        if diagonal:
            if b < rj:
                # strictly upper part of the strip, mirrored into the rows below
                yi[b:] += Ks[:, b - a :].T @ zi_c[a:b]
        else:
            yj += Ks.T @ zi_c[a:b]  # type: ignore[operator]
    if dtype == np.float32:
        # Block partials travel and wait for their sums in the compute dtype:
        # half the memory; the sums across blocks are float64 again.
        return yi.astype(np.float32), None if yj is None else yj.astype(np.float32)
    return yi, yj


def _stored_task(read_block, i, j, zi, zj, dtype):
    return stored_pair_products(read_block(i, j), zi, zj, dtype)


def _cluster_threads() -> int:
    """Threads of the active distributed cluster, else this machine's cores."""
    try:
        from distributed import default_client

        return max(1, sum(default_client().nthreads().values()))
    except (ImportError, ValueError):
        from .threads import cpu_count

        return cpu_count()


#: Share of the memory the cached upper blocks may take: of each worker's
#: ``memory_limit`` (less what the worker already uses) on a distributed
#: cluster, of the available RAM on the threaded scheduler. Dask starts spilling
#: a worker's data to disk at 60 % of its limit; the half leaves room for the
#: tasks' own working memory (two row blocks, one strip, the partial products).
CACHE_MEMORY_FRACTION = 0.5

#: dask config key overriding the budget (bytes, or a string such as "2GiB").
CACHE_BUDGET_CONFIG = "kpca.kernel-cache-budget"


def _scheduler_kind() -> tuple[str, Any]:
    """("local", None) (threaded or synchronous: data stays in this process),
    ("distributed", client) or ("other", None) (e.g. the multiprocessing
    scheduler, which keeps nothing between computations)."""
    import dask.local
    import dask.threaded
    from dask.base import get_scheduler

    scheduler = get_scheduler()
    if scheduler is None or scheduler is dask.threaded.get or scheduler is dask.local.get_sync:
        return "local", None
    owner = getattr(scheduler, "__self__", None)  # the client whose get() runs the graphs
    if type(owner).__name__ == "Client" and type(owner).__module__.startswith("distributed"):
        return "distributed", owner
    return "other", None


def kernel_cache_budget() -> tuple[int, str]:
    """Bytes the cached kernel blocks may take on the active scheduler, and why.

    Distributed: ``CACHE_MEMORY_FRACTION`` of each worker's ``memory_limit``
    less the memory the worker process already uses, times the number of
    workers, taking the worker with the least room (the blocks spread evenly
    over the workers). Threaded scheduler: ``CACHE_MEMORY_FRACTION`` of this
    machine's available memory. The dask config key ``kpca.kernel-cache-budget``
    overrides both.
    """
    import dask
    from dask.utils import format_bytes, parse_bytes

    override = dask.config.get(CACHE_BUDGET_CONFIG, None)
    if override is not None:
        return int(parse_bytes(override)), f"dask config {CACHE_BUDGET_CONFIG}"
    import psutil

    kind, client = _scheduler_kind()
    if kind == "distributed":
        workers = client.scheduler_info(n_workers=-1)["workers"]
        room = []
        for w in workers.values():
            metrics = w.get("metrics") or {}
            limit = w.get("memory_limit") or metrics.get("host_total") or 0
            room.append(
                max(0, int(CACHE_MEMORY_FRACTION * limit) - int(metrics.get("memory", 0)))
            )
        if not room:
            return 0, "no workers"
        return len(room) * min(room), (
            f"{CACHE_MEMORY_FRACTION:g} of the memory limit of {len(room)} workers less what "
            f"they use (least room: {format_bytes(min(room))})"
        )
    if kind == "local":
        avail = int(psutil.virtual_memory().available)
        return int(CACHE_MEMORY_FRACTION * avail), (
            f"{CACHE_MEMORY_FRACTION:g} of this machine's available memory"
        )
    return 0, "the scheduler keeps no data between computations"


def upper_block_bytes(row_chunks: Sequence[int], itemsize: int) -> int:
    """Bytes of all upper blocks ``K_IJ`` (``I <= J``, diagonal squares whole) of a
    partition into ``row_chunks`` (the cost model prices the cache tier with it)."""
    c = list(row_chunks)
    return int(sum(ci * cj for i, ci in enumerate(c) for cj in c[i:]) * itemsize)


def _diag_block(x, kernel):
    return kernel.diag(x, np.float64)


def _sum_parts(parts: Sequence[Any], which: Sequence[int | None]) -> np.ndarray:
    """Sum ``part[w]`` (``w`` picks one output of a block task; None: the part itself)."""
    it = iter(zip(parts, which))
    p, w = next(it)
    out = np.array(p if w is None else p[w], dtype=np.float64, copy=True)
    for p, w in it:
        out += p if w is None else p[w]
    return out


def exact_waves(row_chunks: Sequence[int], wave_tasks: int) -> list[tuple[int, int]]:
    """The waves of block rows of one exact product (:meth:`BlockKernelMatrix.product`;
    the cost model counts them with the same function): consecutive block rows while the
    wave has at most ``wave_tasks`` block tasks (at least one row)."""
    nb = len(row_chunks)
    waves, start = [], 0
    while start < nb:
        stop, tasks = start, 0
        while stop < nb and (tasks == 0 or tasks + (nb - stop) <= wave_tasks):
            tasks += nb - stop
            stop += 1
        waves.append((start, stop))
        start = stop
    return waves


class BlockKernelMatrix:
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
        c = self.row_chunks
        off = sum(ci * cj for i, ci in enumerate(c) for cj in c[i + 1 :])
        diag = 0
        for r in c:
            step = _strip_rows(r, self.dtype.itemsize)
            diag += sum((min(a + step, r) - a) * (r - a) for a in range(0, r, step))
        return int(off + diag)

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
        the threaded scheduler -- until :meth:`release_cache`; ``"recompute"``
        evaluates the blocks again at every pass (memory: one strip per task);
        ``"store"`` reads them from the kernel store (``block_reader``). ``mode``:
        ``"auto"`` keeps the blocks in memory when they fit
        :func:`kernel_cache_budget` and the solver makes several passes (a stored
        kernel stays on disk: the caller chose it); ``"memory"`` and ``"recompute"``
        force a tier (``"memory"`` with a stored kernel reads each block once).
        Returns the decision (JSON-serialisable, for ``solver_info_``).
        """
        from dask.utils import format_bytes

        if mode not in KERNEL_CACHE_MODES:
            raise InvalidInputError(
                f"kernel_cache must be one of {KERNEL_CACHE_MODES}, got {mode!r}."
            )
        nbytes = self.upper_block_bytes()
        info: dict[str, Any] = {"requested": mode, "bytes": nbytes}
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
            tier = "memory" if fits else "recompute"
            why = (
                f"upper blocks {format_bytes(nbytes)} {'within' if fits else 'above'} "
                f"the budget {format_bytes(budget)} ({where})"
            )
        info["tier"], info["reason"] = tier, why
        self._cache_pending = tier == "memory"
        return info

    def _fill_cache(self) -> None:
        """Evaluate (or read) every upper block once and keep it: ``dask.persist`` of
        one task per block (futures held on the workers of a distributed cluster,
        arrays in this process on the threaded scheduler)."""
        import dask

        self._cache_pending = False
        token = tokenize(
            self.X.name,
            self.kernel,
            self.dtype.str,
            self.cache_eval_dtype.str,
            self.block_reader if self.block_reader is not None else "eval",
        )
        pairs = self.upper_blocks()
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
                if self._cache is not None:
                    blk = self._cache[(i, j)]
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
        token = tokenize(
            self.X.name,
            self.kernel,
            self.dtype.str,
            Z,
            self.block_reader is None,
            self._cache is not None,
        )
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
        if self._cache_pending:
            self._fill_cache()
        wave_tasks = wave_tasks or max(128, 4 * _cluster_threads())
        offsets = np.concatenate([[0], np.cumsum(self.row_chunks)])
        Y = np.zeros((self.n, Z.shape[1]), dtype=np.float64)
        token = tokenize(
            self.X.name,
            self.kernel,
            self.dtype.str,
            Z,
            self.block_reader is None,
            self._cache is not None,
        )
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

    def _product_on_cluster(self, client, Zsrc, waves, token, offsets, Y) -> None:
        """The waves of one pass on a distributed cluster, their partial sums added on the
        workers: wave ``w``'s sum for row block ``j`` is ``acc_{w-1, j} + part_{w, j}``
        (the same additions in the same order as adding the waves on the caller, so the
        same bits). A row block is final once a wave starts past it; only final row
        blocks travel to the caller, each once, so the bytes into the caller per pass
        are ``n x l x 8`` whatever the number of waves (before: every wave's partial
        sums of every row block from its first row to ``n``).

        Two waves are on the cluster at a time: the next one's block tasks start while
        the last of this one's finish. Memory on the workers: one wave's block products
        plus one accumulator per row block."""
        from distributed import futures_of, wait

        # The rows too: two waves are on the cluster at a time and each wave's graph
        # would carry X's tasks again, under the keys the scheduler is releasing
        # from the wave before (distributed 2026.8 then lost a worker, "'<' not
        # supported between NoneType", and the caller got a KeyError for an X
        # block). Persisted for the pass, X is also read from its store once per
        # pass instead of once per wave. Held by this frame only.
        X = None
        if self.block_reader is None and self._cache is None:
            X = client.persist(self.X)
        nb, ncols = self.n_blocks, int(Zsrc.shape[1])
        # the row blocks each wave makes final: those no later wave adds to (a wave
        # adds to every row block from its first one on; waves may run backwards)
        final, bound = [], nb
        for start, _ in reversed(waves):
            final.append(range(start, max(start, bound)))
            bound = min(bound, start)
        final.reverse()
        prev: tuple[int, Any] | None = None  # (first row block, persisted accumulator)
        inflight: collections.deque = collections.deque()
        for (start, stop), done in zip(waves, final):
            dsk, deps, oname = self._pair_graph(Zsrc, range(start, stop), f"{token}-{start}", X)
            name = oname
            if prev is not None:
                pstart, pacc = prev
                name = f"kpca-kz-acc-{token}-{start}"
                for j in range(start, nb):
                    dsk[(name, j - start, 0)] = (
                        (np.add, (pacc.name, j - pstart, 0), (oname, j - start, 0))
                        if j >= pstart
                        else (oname, j - start, 0)
                    )
                deps.append(pacc)
            graph = HighLevelGraph.from_collections(name, dsk, dependencies=deps)
            acc = client.persist(
                da.Array(
                    graph, name, chunks=(self.row_chunks[start:], (ncols,)), dtype=np.float64
                )
            )
            inflight.append((start, done, acc))
            prev = (start, acc)
            if len(inflight) > 1:
                self._gather_final(client, inflight.popleft(), offsets, Y, futures_of, wait)
        while inflight:
            self._gather_final(client, inflight.popleft(), offsets, Y, futures_of, wait)

    @staticmethod
    def _gather_final(client, item, offsets, Y, futures_of, wait) -> None:
        """Wait for a wave's accumulator and bring the row blocks it made final to the
        caller."""
        start, done, acc = item
        futs = {f.key: f for f in futures_of(acc)}
        wait(list(futs.values()))
        if len(done):
            parts = client.gather([futs[(acc.name, j - start, 0)] for j in done])
            Y[offsets[done.start] : offsets[done.stop]] = np.concatenate(parts, axis=0)

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
        if self._cache is not None:  # e.g. the randomized solver escalated to dense
            tasks = [self._cache[p] for p in pairs]
        elif self.block_reader is not None:
            tasks = [dask.delayed(self.block_reader, pure=True)(i, j) for i, j in pairs]
        else:
            tasks = [
                dask.delayed(kernel_block, pure=True)(self.kernel, xb[i], xb[j], self.dtype)
                for i, j in pairs
            ]
        blocks = dask.compute(*tasks)
        offsets = np.concatenate([[0], np.cumsum(self.row_chunks)])
        K = np.empty((self.n, self.n), dtype=self.dtype)
        for (i, j), blk in zip(pairs, blocks):
            K[offsets[i] : offsets[i + 1], offsets[j] : offsets[j + 1]] = blk
            if i != j:
                K[offsets[j] : offsets[j + 1], offsets[i] : offsets[i + 1]] = blk.T
        return K


def cross_products(
    kernel: Kernel,
    xb: np.ndarray,
    X_train: np.ndarray,
    M: np.ndarray,
    dtype: Any,
    train_rows: int = 2048,
) -> np.ndarray:
    """``k(xb, X_train) @ M`` for new rows ``xb`` (m x d), without forming the m x n block.

    The training rows are taken ``train_rows`` at a time and the new rows in
    cache-sized strips; each strip of kernel values is multiplied by the
    matching rows of ``M`` (n x c) right away. Returns (m x c) float64.
    Memory: one strip plus ``train_rows x d`` prepared training rows.
    """
    dtype = np.dtype(dtype)
    m = xb.shape[0]
    n = X_train.shape[0]
    A = kernel.prepare(xb, dtype, "left")
    Mc = np.ascontiguousarray(M, dtype=dtype)
    out = np.zeros((m, M.shape[1]), dtype=np.float64)
    for j0 in range(0, n, train_rows):
        j1 = min(n, j0 + train_rows)
        B = kernel.prepare(X_train[j0:j1], dtype, "right")
        step = _strip_rows(j1 - j0, dtype.itemsize)
        buf = np.empty(step * (j1 - j0), dtype=dtype)
        for a in range(0, m, step):
            b = min(m, a + step)
            Ks = kernel.evaluate(
                A[a:b], B, out=buf[: (b - a) * (j1 - j0)].reshape(b - a, j1 - j0)
            )
            if Ks.dtype != dtype:
                Ks = Ks.astype(dtype)
            out[a:b] += Ks @ Mc[j0:j1]
    return out


# ------------------------------------------------------------ precomputed kernel
def _precomputed_task(kij, kji, zi, zj, dtype, symmetrise_diag):
    """``(K_IJ @ zj, K_IJ^T @ zi)`` for one upper block of a caller-given K, using its
    symmetric part ``(K + K^T) / 2`` when ``kji`` (the mirror block) is given or a
    diagonal block is to be symmetrised."""
    if kji is not None:
        kij = 0.5 * (np.asarray(kij, dtype=np.float64) + np.asarray(kji, dtype=np.float64).T)
    elif symmetrise_diag:
        kij = np.asarray(kij, dtype=np.float64)
        kij = 0.5 * (kij + kij.T)
    return stored_pair_products(np.asarray(kij), zi, zj, dtype)


def _inspect_pair(kij, kji):
    """Non-finite count, ``max |K_IJ - K_JI^T|`` and ``max |K_IJ|`` of one block pair."""
    kij = np.asarray(kij, dtype=np.float64)
    kji = kij if kji is None else np.asarray(kji, dtype=np.float64)
    bad = int(np.count_nonzero(~np.isfinite(kij)))
    if kji is not kij:
        bad += int(np.count_nonzero(~np.isfinite(kji)))
    if bad:
        return bad, np.inf, np.inf
    asym = float(np.max(np.abs(kij - kji.T))) if kij.size else 0.0
    top = float(max(np.max(np.abs(kij)), np.max(np.abs(kji)))) if kij.size else 0.0
    return 0, asym, top


class PrecomputedKernelMatrix(BlockKernelMatrix):
    """A kernel matrix given by the caller (``kernel="precomputed"``), never copied whole.

    ``K`` is any n x n dask array (from numpy, zarr, a scipy.sparse matrix...),
    rechunked into ``block_rows`` square blocks. Products read each upper block
    ``K_IJ`` (``I <= J``) once per pass and use it for both ``K_IJ Z_J`` and
    ``K_IJ^T Z_I``, as for a stored kernel. A matrix that is not exactly
    symmetric is used through its symmetric part ``(K + K^T) / 2`` (what
    scikit-learn's centring and ``eigh`` amount to): then each task reads its
    mirror block too, doubling the reads. :meth:`inspect` (one read of K)
    decides which, and finds NaN/inf.
    """

    def __init__(
        self,
        K: da.Array,
        dtype: Any = np.float64,
        block_rows: int = 2048,
        symmetric: bool | None = None,
    ):
        from .kernels import PrecomputedKernel

        if K.ndim != 2 or K.shape[0] != K.shape[1]:
            raise InvalidInputError(
                f"Precomputed matrix must be a square matrix. Input is a "
                f"{K.shape[0]}x{K.shape[1]} matrix; with kernel='precomputed' fit takes the "
                "n x n kernel matrix of the training rows."
            )
        r = max(1, min(int(block_rows), int(K.shape[0])))
        self.X = K.rechunk((r, r))
        self.kernel = PrecomputedKernel()
        self.dtype = np.dtype(dtype)
        self.block_reader = None
        self._products = 0
        self._cache = None
        self._cache_pending = False
        self.symmetric = symmetric

    def plan_cache(self, mode: str = "auto", solver: str = "randomized") -> dict[str, Any]:
        """A precomputed K is the caller's array: read at every pass, never cached here."""
        if mode not in KERNEL_CACHE_MODES:
            raise InvalidInputError(
                f"kernel_cache must be one of {KERNEL_CACHE_MODES}, got {mode!r}."
            )
        return {
            "requested": mode,
            "tier": "precomputed",
            "reason": "kernel='precomputed': the given matrix is read at every pass",
        }

    def inspect(self) -> tuple[int, float, float]:
        """One read of K: (non-finite values, max asymmetry, max |K|); sets ``symmetric``."""
        import dask

        blocks = self.X.to_delayed()
        nb = self.n_blocks
        inspect = dask.delayed(_inspect_pair, pure=True)
        results = dask.compute(
            *[
                inspect(blocks[i, j], None if i == j else blocks[j, i])
                for i in range(nb)
                for j in range(i, nb)
            ]
        )
        bad = sum(r[0] for r in results)
        asym = max(r[1] for r in results)
        top = max(r[2] for r in results)
        self.symmetric = bad == 0 and asym == 0.0
        return bad, asym, top

    def _pair_graph(self, Z, rows: range, token: str) -> tuple[dict, list, str]:
        nb = self.n_blocks
        pname = "kpca-pkz-part-" + token
        oname = "kpca-pkz-" + token
        dsk: dict[Any, Any] = {}
        deps: list[Any] = [self.X]
        zkey = self._z_source(Z, dsk, deps, token)
        kn = self.X.name
        sym = bool(self.symmetric)
        contrib: dict[int, list] = {j: [] for j in range(rows.start, nb)}
        for i in rows:
            for j in range(i, nb):
                if i == j:
                    task = (
                        _precomputed_task,
                        (kn, i, i),
                        None,
                        zkey(i),
                        None,
                        self.dtype.str,
                        not sym,
                    )
                else:
                    task = (
                        _precomputed_task,
                        (kn, i, j),
                        None if sym else (kn, j, i),
                        zkey(i),
                        zkey(j),
                        self.dtype.str,
                        False,
                    )
                dsk[(pname, i, j)] = task
                contrib[i].append(((pname, i, j), 0))
                if i != j:
                    contrib[j].append(((pname, i, j), 1))
        for j, parts in contrib.items():
            dsk[(oname, j - rows.start, 0)] = (
                _sum_parts,
                [k for k, _ in parts],
                [w for _, w in parts],
            )
        return dsk, deps, oname

    def diag(self) -> da.Array:
        return da.diagonal(self.X).astype(np.float64)

    def to_numpy(self) -> np.ndarray:
        K = np.asarray(self.X.compute(), dtype=np.float64)
        if not self.symmetric:
            K = 0.5 * (K + K.T)
        return K.astype(self.dtype, copy=False)
