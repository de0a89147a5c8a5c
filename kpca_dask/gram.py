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

from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .exceptions import InvalidInputError
from .kernels import Kernel

__all__ = ["BlockKernelMatrix", "pair_products", "stored_pair_products", "kernel_block", "cross_products"]

#: Target size of one strip of kernel values, in bytes. Measured here (2 cores,
#: 1.25 MB L2 each, shared L3) with two tasks running at once: 4 MB strips gave
#: 11.2 ms per 2000 x 2000 float32 block, 2 MB 11.8, 1 MB 13.3, 256 KB 21;
#: larger strips make the GEMMs more efficient than cache misses cost.
STRIP_BYTES = 4 << 20


def _strip_rows(ncols: int, itemsize: int) -> int:
    return int(max(16, min(4096, STRIP_BYTES // max(1, ncols * itemsize))))


def kernel_block(kernel: Kernel, xi: np.ndarray, xj: np.ndarray, dtype: Any) -> np.ndarray:
    """The whole block ``k(xi, xj)`` in ``dtype`` (used to materialise K)."""
    dtype = np.dtype(dtype)
    return np.asarray(kernel(xi, xj, dtype=dtype), dtype=dtype)


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
        lambda a, b, c, out: kernel.evaluate(A[a:b], B[c:], out=out), A.shape[0], B.shape[0],
        zi, zi if diagonal else zj, diagonal, dtype,
    )


def stored_pair_products(
    block: np.ndarray, zi: np.ndarray, zj: np.ndarray | None, dtype: Any
) -> tuple[np.ndarray, np.ndarray | None]:
    """As :func:`pair_products` for a block read from a kernel store.

    A stored diagonal block (``zj is None``) holds its full square.
    """
    diagonal = zj is None
    return _accumulate(
        lambda a, b, c, out: block[a:b, c:], block.shape[0], block.shape[1], zi,
        zi if diagonal else zj, diagonal, np.dtype(dtype),
    )


def _accumulate(strip_fn, ri, rj, zi, zj, diagonal, dtype):
    zi_c = np.ascontiguousarray(zi, dtype=dtype)
    zj_c = zi_c if diagonal else np.ascontiguousarray(zj, dtype=dtype)
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
    return yi, yj


def _stored_task(read_block, i, j, zi, zj, dtype):
    return stored_pair_products(read_block(i, j), zi, zj, dtype)


def _diag_block(x, kernel):
    return kernel.diag(x, np.float64)


def _sum_parts(parts: Sequence[Any], which: Sequence[int]) -> np.ndarray:
    it = iter(zip(parts, which))
    p, w = next(it)
    out = np.array(p[w], dtype=np.float64, copy=True)
    for p, w in it:
        out += p[w]
    return out


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
    """

    def __init__(self, X: da.Array, kernel: Kernel, dtype: Any = np.float64, block_reader=None):
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

    def matmul(self, Z: np.ndarray | da.Array) -> da.Array:
        """Lazy ``K @ Z`` for ``Z`` of shape (n, l): one task per upper block.

        ``Z`` may be a numpy array (split along the row blocks of X) or a dask
        array (rechunked to them). The result is a float64 dask array with the
        row chunks of X and a single column chunk.
        """
        if Z.ndim != 2 or Z.shape[0] != self.n:
            raise InvalidInputError(f"Z must have shape ({self.n}, l), got {Z.shape}.")
        ncols = int(Z.shape[1])
        nb = self.n_blocks
        offsets = np.concatenate([[0], np.cumsum(self.row_chunks)])
        token = tokenize(self.X.name, self.kernel, self.dtype.str, Z, self.block_reader is None)
        zname = "kpca-z-" + token
        pname = "kpca-kz-part-" + token
        oname = "kpca-kz-" + token
        dsk: dict[Any, Any] = {}
        deps: list[Any] = [self.X]
        if isinstance(Z, da.Array):
            Zd = Z.rechunk((self.row_chunks, (ncols,)))
            deps.append(Zd)
            zkey = lambda i: (Zd.name, i, 0)  # noqa: E731
        else:
            Z = np.asarray(Z)
            for i in range(nb):
                dsk[(zname, i)] = Z[offsets[i] : offsets[i + 1]]
            zkey = lambda i: (zname, i)  # noqa: E731
        xn = self.X.name
        for i, j in self.upper_blocks():
            zj = None if i == j else zkey(j)
            if self.block_reader is not None:
                task = (_stored_task, self.block_reader, i, j, zkey(i), zj, self.dtype.str)
            else:
                xj = None if i == j else (xn, j, 0)
                task = (pair_products, self.kernel, (xn, i, 0), xj, zkey(i), zj, self.dtype.str)
            dsk[(pname, i, j)] = task
        for i in range(nb):
            # Row block i: K_ij Z_j from its own upper blocks (j >= i, first output)
            # and K_ji^T Z_j from the blocks above it (j < i, second output).
            parts = [(pname, i, j) for j in range(i, nb)] + [(pname, j, i) for j in range(i)]
            which = [0] * (nb - i) + [1] * i
            dsk[(oname, i, 0)] = (_sum_parts, parts, which)
        graph = HighLevelGraph.from_collections(oname, dsk, dependencies=deps)
        return da.Array(graph, oname, chunks=(self.row_chunks, (ncols,)), dtype=np.float64)

    def diag(self) -> da.Array:
        """Lazy ``k(x_i, x_i)`` for every row (float64)."""
        return self.X.map_blocks(
            _diag_block, self.kernel, drop_axis=1, dtype=np.float64,
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
        if self.block_reader is not None:
            tasks = [dask.delayed(self.block_reader, pure=True)(i, j) for i, j in pairs]
        else:
            tasks = [dask.delayed(kernel_block, pure=True)(self.kernel, xb[i], xb[j], self.dtype)
                     for i, j in pairs]
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
            Ks = kernel.evaluate(A[a:b], B, out=buf[: (b - a) * (j1 - j0)].reshape(b - a, j1 - j0))
            if Ks.dtype != dtype:
                Ks = Ks.astype(dtype)
            out[a:b] += Ks @ Mc[j0:j1]
    return out
