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

from .block_matrix import BlockKernelMatrix
from .block_products import (  # noqa: F401  (importable from here, as before the split)
    STORED_STRIP_BYTES,
    STRIP_BYTES,
    _accumulate,
    _aligned,
    _diag_block,
    _flush_subnormal,
    _stored_task,
    _strip_rows,
    _sum_parts,
    _upcast_pair_products,
    cache_block,
    cross_products,
    exact_waves,
    kernel_block,
    pair_products,
    stored_pair_products,
    upper_block_bytes,
)
from .params import KERNEL_CACHE_MODES  # noqa: F401  (what kernel_cache accepts)
from .precomputed_matrix import (  # noqa: F401
    PrecomputedKernelMatrix,
    _inspect_pair,
    _precomputed_task,
)
from .resources import (  # noqa: F401  (scheduler probing and the memory budget)
    CACHE_BUDGET_CONFIG,
    CACHE_MEMORY_FRACTION,
    _cluster_threads,
    _scheduler_kind,
    kernel_cache_budget,
)

__all__ = [
    "KERNEL_CACHE_MODES",
    "BlockKernelMatrix",
    "cross_products",
    "kernel_block",
    "kernel_cache_budget",
    "pair_products",
    "stored_pair_products",
]
