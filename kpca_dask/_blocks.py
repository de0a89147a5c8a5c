"""The block-rows rule: how many rows each block of the kernel partition has
(``chunk_size="auto"``), for the estimator and the pipeline alike.

Re-exported by :mod:`kpca_dask.plan`, where :func:`auto_block_rows` is documented.
"""

from __future__ import annotations

import math

__all__ = ["auto_block_rows"]

#: Rows per block of the Nyström passes when ``chunk_size="auto"``: each task
#: computes ``rows x m`` kernel values in strips, so larger blocks only mean
#: fewer tasks (and fewer partial sums to add).
NYSTROEM_BLOCK_ROWS = 8192

#: Rows per block of the exact solvers' kernel partition below ``LARGE_BLOCK_MIN_SAMPLES``:
#: a 16 MB float32 block, tens of ms of work per task.
EXACT_BLOCK_ROWS = 2048

#: From this many samples the exact blocks have ``LARGE_BLOCK_ROWS`` rows: measured at
#: n = 100 000 (pipeline, 2 workers), 63.2 s against 72.5 s for the solve with 4096-row
#: blocks (README, "the exact solve against the roofline").
LARGE_BLOCK_MIN_SAMPLES = 50_000
LARGE_BLOCK_ROWS = 4096

#: Upper bound on the block tasks of one pass ("low thousands"): beyond it the blocks
#: grow instead. At ~1 ms of scheduler time a task (``kpca calibrate`` measures it) a
#: pass then costs seconds of scheduling, not minutes (measured: 119 805 tasks at
#: n = 1M with 2 045-row blocks). A cluster with more threads than this gets one task
#: per thread instead (no idle core), never more than ``MAX_TASKS_PER_PASS``.
TASKS_PER_PASS = 4000
MAX_TASKS_PER_PASS = 20_000

#: Largest block a worker allocates whole (a stored or read kernel block, the
#: ``memory`` cache's blocks) without glibc's mmap path: the workers'
#: ``MALLOC_MMAP_THRESHOLD_`` (pipeline.cluster.WORKER_MALLOC_ENV), whose ceiling on
#: 64-bit glibc is 32 MiB. A buffer above it is a fresh mmap whose pages fault in one by
#: one (docs/tuning.md: 76.5 ms against 38.4 ms a stored block).
STORED_BLOCK_BYTES = 32 << 20


def _upper_tasks(nb: int) -> int:
    return nb * (nb + 1) // 2


def auto_block_rows(
    n: int,
    solver: str = "randomized",
    *,
    threads: int | None = None,
    stored_itemsize: int | None = None,
    min_rows: int = 256,
) -> int:
    """Rows per block of the kernel partition (``chunk_size="auto"``): the one rule the
    estimator and the pipeline use.

    Exact solvers: about ``EXACT_BLOCK_ROWS`` rows, ``LARGE_BLOCK_ROWS`` from
    ``LARGE_BLOCK_MIN_SAMPLES`` rows on; larger blocks when a pass would have more than
    ``TASKS_PER_PASS`` upper-block tasks (or one per thread of a ``threads``-thread
    cluster, at most ``MAX_TASKS_PER_PASS``); at least 6 row blocks (21 tasks) when n
    allows, so that a pass balances over the cores. ``stored_itemsize``: the blocks are
    materialised whole (kernel store) in that many bytes per value: at most
    ``STORED_BLOCK_BYTES`` a block. Nyström: about ``NYSTROEM_BLOCK_ROWS`` rows, and at
    most ``TASKS_PER_PASS`` blocks (a task holds a strip, not its block).
    """
    n = int(n)
    if solver == "nystroem":
        nb = max(1, math.ceil(n / NYSTROEM_BLOCK_ROWS))
        nb = min(nb, TASKS_PER_PASS)
    else:
        target = LARGE_BLOCK_ROWS if n >= LARGE_BLOCK_MIN_SAMPLES else EXACT_BLOCK_ROWS
        if stored_itemsize:
            target = min(target, int(math.isqrt(STORED_BLOCK_BYTES // int(stored_itemsize))))
        nb = max(1, math.ceil(n / target))
        cap = max(TASKS_PER_PASS, int(threads or 0))
        cap = min(cap, MAX_TASKS_PER_PASS)
        if _upper_tasks(nb) > cap and not stored_itemsize:
            nb = max(1, (math.isqrt(8 * cap + 1) - 1) // 2)
    if nb < 6:
        nb = max(nb, min(6, n // min_rows))
    return math.ceil(n / nb)
