"""One pass over the rows of X: the block products of the Nyström solver and their tree sum.

Memory model: a task holds its row block of X, one strip of kernel values
(``strip_rows x m`` in the compute dtype, a few MB) and its partial sum (``m x l``
float64, or ``m x m`` for the covariance method); partial sums are added in a tree with
fan-in :data:`SPLIT_EVERY`. Nothing of size n x m exists; the graph is lazy with
deterministic names and runs on any Dask scheduler.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from scipy.linalg.blas import dsyrk, ssyrk

from .basis import NystroemBasis

__all__ = ["SPLIT_EVERY", "STRIP_BYTES", "block_stats_graph"]

#: Strip of kernel values computed and consumed at once inside a task: the
#: covariance method's rank-k update gains from wider strips, the randomized
#: products do not (measurements: docs/nystroem.md, tuning constants).
STRIP_BYTES = {"randomized": 4 << 20, "covariance": 16 << 20}

#: Partial sums added per tree-reduction task.
SPLIT_EVERY = 8


def _strip_rows(m: int, itemsize: int, method: str) -> int:
    return int(max(16, min(8192, STRIP_BYTES[method] // max(1, m * itemsize))))


def _block_stats(xb, consts, method, first, kernel, dtype_str):
    """One row block's share of a pass: ``C'^T C' M`` (or ``C'^T C'``) and, on the
    first pass, ``C'^T 1`` and ``sum k(x, x)``.

    ``consts = (Zp, M, shift)``; ``M`` is None for the covariance method.
    Returns ``(acc, colsum, diag_sum, rows)`` with float64 ``acc``.
    """
    Zp, M, shift = consts
    dtype = np.dtype(dtype_str)
    A = kernel.prepare(xb, dtype, "left")
    r, m = A.shape[0], Zp.shape[0]
    step = _strip_rows(m, dtype.itemsize, method)
    buf = np.empty(min(step, r) * m, dtype=dtype)
    shift_d = shift.astype(dtype)
    ones = np.ones(min(step, r), dtype=dtype)
    colsum = np.zeros(m, dtype=np.float64) if first else None
    if method == "covariance":
        syrk = ssyrk if dtype == np.float32 else dsyrk
        acc = np.zeros((m, m), dtype=dtype, order="F")
    else:
        acc = np.zeros((m, M.shape[1]), dtype=np.float64)
    for a in range(0, r, step):
        b = min(r, a + step)
        Ks = kernel.evaluate(A[a:b], Zp, out=buf[: (b - a) * m].reshape(b - a, m))
        if Ks.dtype != dtype:
            Ks = Ks.astype(dtype)
        Ks -= shift_d
        if first:
            colsum += ones[: b - a] @ Ks
        if method == "covariance":
            # acc += Ks^T Ks, upper triangle, in place (Ks.T is Fortran-ordered: no copy)
            syrk(1.0, Ks.T, beta=1.0, c=acc, trans=0, lower=0, overwrite_c=1)
        else:
            acc += Ks.T @ (Ks @ M)
    if method == "covariance":
        acc = acc.astype(np.float64)  # upper triangle only: symmetrised once, after the sum
    diag = float(kernel.diag(xb, np.float64).sum()) if first else 0.0
    return acc, colsum, diag, r


def _sum_stats(parts):
    """The sum of block statistics ``(acc, colsum, diag, rows)``, in order (``parts``
    may be a generator: one block's partial alive at a time)."""
    it = iter(parts)
    acc, colsum, diag, rows = next(it)
    acc = np.array(acc, dtype=np.float64, copy=True)
    colsum = None if colsum is None else np.array(colsum, copy=True)
    for a, c, dg, r in it:
        acc += a
        if colsum is not None:
            colsum += c
        diag += dg
        rows += r
    return acc, colsum, diag, rows


def _group_stats(xbs, consts, method, first, kernel, dtype_str):
    """``_sum_stats`` of the ``_block_stats`` of the blocks ``xbs``, computed in one
    task: the first level of the tree fused with its leaves. The same additions in the
    same order as the unfused tree (the same bits), but a worker holds one running sum
    instead of one m x m partial per block."""
    return _sum_stats(_block_stats(xb, consts, method, first, kernel, dtype_str) for xb in xbs)


def _fuse_leaves(n_blocks: int, split_every: int = SPLIT_EVERY) -> bool:
    """Fuse the tree's first level with its leaves when the fused tasks still give
    every thread of the scheduler two tasks: each unfused leaf returns an m x m float64
    partial (32 MiB at m = 2048), and a scheduler that runs leaves ahead of the sums
    held ~3 GiB of them at n = 2M."""
    from ...gram import _cluster_threads

    return n_blocks // split_every >= 2 * _cluster_threads()


def _tree_reduce(
    dsk: dict, leaves: list, name: str, split_every: int = SPLIT_EVERY, levels_done: int = 0
):
    """Add ``leaves`` in a tree of ``_sum_stats`` tasks; returns the root key.
    ``levels_done``: the leaves are sums already (at least one level is added
    otherwise, as a copy for a single leaf)."""
    level = 0
    keys = leaves
    while len(keys) > 1 or level + levels_done == 0:
        nxt = []
        for j in range(0, len(keys), split_every):
            key = (f"{name}-sum{level}", j // split_every)
            dsk[key] = (_sum_stats, keys[j : j + split_every])
            nxt.append(key)
        keys, level = nxt, level + 1
    return keys[0]


def block_stats_graph(
    X: da.Array,
    basis: NystroemBasis,
    Zp: np.ndarray,
    M: np.ndarray | None,
    first: bool,
    fuse: bool | None = None,
) -> Delayed:
    """Lazy pass over the row blocks of ``X``: one task per block plus a tree sum
    (``fuse``: the tree's first level computed inside its leaves, one task per
    ``SPLIT_EVERY`` blocks; default :func:`_fuse_leaves`; the same sums either way)."""
    method = "covariance" if M is None else "randomized"
    consts = (Zp, M, basis.shift)
    token = tokenize(X.name, basis.kernel, basis.dtype.str, Zp, M, basis.shift, first)
    cname = "kpca-nys-consts-" + token
    lname = "kpca-nys-block-" + token
    dsk: dict[Any, Any] = {cname: consts}
    leaves = []
    nb = len(X.chunks[0])
    if _fuse_leaves(nb) if fuse is None else fuse:
        for j in range(0, nb, SPLIT_EVERY):
            dsk[(lname, j)] = (
                _group_stats,
                [(X.name, i, 0) for i in range(j, min(nb, j + SPLIT_EVERY))],
                cname,
                method,
                first,
                basis.kernel,
                basis.dtype.str,
            )
            leaves.append((lname, j))
        # the fused tasks are the tree's first level: the tree goes on from the second
        root = _tree_reduce(dsk, leaves, "kpca-nys-" + token, levels_done=1)
    else:
        for i in range(nb):
            dsk[(lname, i)] = (
                _block_stats,
                (X.name, i, 0),
                cname,
                method,
                first,
                basis.kernel,
                basis.dtype.str,
            )
            leaves.append((lname, i))
        root = _tree_reduce(dsk, leaves, "kpca-nys-" + token)
    graph = HighLevelGraph.from_collections(root[0], dsk, dependencies=[X])
    return Delayed(root, graph, layer=root[0])
