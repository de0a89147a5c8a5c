"""The task functions of block products: one upper block ``K_IJ`` evaluated (or read)
strip by strip and multiplied by the matching rows of ``Z`` (the memory model is in
:mod:`kpca_dask.gram`), the sums of their parts, and the new-row products of transform."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .kernels import Kernel

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
    return _block(kernel, xi, xj, dtype, eval_dtype, flush=False)


def cache_block(
    kernel: Kernel, xi: np.ndarray, xj: np.ndarray, dtype: Any, eval_dtype: Any = None
) -> np.ndarray:
    """:func:`kernel_block` for the memory tier of :meth:`BlockKernelMatrix.kernel_cache`,
    float32 subnormals flushed to zero (:func:`_flush_subnormal`; evaluated in float64
    and rounded, strip by strip while the strip is in cache)."""
    return _block(kernel, xi, xj, dtype, eval_dtype, flush=True)


def _block(
    kernel: Kernel, xi: np.ndarray, xj: np.ndarray, dtype: Any, eval_dtype: Any, flush: bool
) -> np.ndarray:
    dtype = np.dtype(dtype)
    ev = dtype if eval_dtype is None else np.dtype(eval_dtype)
    flush = flush and dtype == np.float32
    if ev == dtype:
        out = np.asarray(kernel(xi, xj, dtype=dtype), dtype=dtype)
        return _flush_subnormal(out) if flush else out
    # strip by strip into the rounded block: no whole block in the evaluation dtype
    A = kernel.prepare(np.asarray(xi), ev, "left")
    B = kernel.prepare(np.asarray(xj), ev, "right")
    out = np.empty((A.shape[0], B.shape[0]), dtype=dtype)
    step = _strip_rows(B.shape[0], ev.itemsize)
    buf = np.empty(step * B.shape[0], dtype=ev)
    work = _FlushBuffers(step * B.shape[0]) if flush else None
    for a in range(0, A.shape[0], step):
        b = min(a + step, A.shape[0])
        np.copyto(
            out[a:b],
            kernel.evaluate(A[a:b], B, out=buf[: (b - a) * B.shape[0]].reshape(b - a, -1)),
            casting="unsafe",
        )
        if work is not None:
            work.flush(out[a:b])
    return out


#: Bits of a float32's exponent: zero for zeros and subnormals only.
_F32_EXPONENT = np.int32(0x7F800000)

#: Values of a block flushed at a time by :func:`_flush_subnormal` (its buffers' size).
_FLUSH_CHUNK = 1 << 18


class _FlushBuffers:
    """Work arrays of :meth:`flush` for strips of up to ``size`` values."""

    def __init__(self, size: int):
        self.bits = np.empty(size, dtype=np.int32)
        self.keep = np.empty(size, dtype=bool)

    def flush(self, strip: np.ndarray) -> None:
        """Zero the subnormals of the C-contiguous float32 ``strip``, in place.

        On the values' bits (integer operations: float arithmetic on subnormals is
        what is slow): a value is kept where its exponent bits are not all zero, and
        multiplied by 0 or 1 as an integer."""
        m = strip.size
        i = strip.reshape(-1).view(np.int32)
        bits, keep = self.bits[:m], self.keep[:m]
        np.bitwise_and(i, _F32_EXPONENT, out=bits)
        np.not_equal(bits, 0, out=keep)
        np.multiply(i, keep, out=i)


def _flush_subnormal(block: np.ndarray) -> np.ndarray:
    """Zero the subnormal values of a float32 block, in place (returned).

    rbf values between far clusters (``exp(-88)`` and below) are float32 subnormals,
    and a GEMM on subnormals runs at a fraction of its speed: a pass over the cached
    float32 blocks of the clustered headline data took 0.17 s against 0.11 s for
    float64 blocks (n = 10 000). The values changed are below ``1.2e-38`` in absolute
    value: far below any level the certificate works at. A block that is not
    C-contiguous is flushed with a mask (a copy's worth of temporaries)."""
    if block.dtype != np.float32 or block.size == 0:
        return block
    if not block.flags.c_contiguous:
        np.putmask(block, np.abs(block) < np.finfo(np.float32).tiny, 0.0)
        return block
    flat = block.reshape(-1)
    work = _FlushBuffers(min(flat.size, _FLUSH_CHUNK))
    for a in range(0, flat.size, _FLUSH_CHUNK):
        work.flush(flat[a : a + _FLUSH_CHUNK])
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
