"""The price of the per-worker drivers (issue 38): a pass is a few tasks per worker, each
doing its worker's share with multithreaded BLAS on rows (and kept kernel blocks) resident
there, reduced on the workers by a tree; the Krylov basis lives on the workers, in row
panels next to the rows, so the client holds O(L^2) numbers.

Chosen by ``estimate(..., driver="workers")``; ``driver="blocks"`` (the default) prices
the block drivers as they run today (:mod:`.price_exact`, :mod:`.price_nystroem`).

The counts are those of the exact solver's per-worker driver (kpca_dask/worker_passes.py,
``kpca.exact-driver: workers``, with ``kpca.worker-basis``): :data:`WORKER_TASKS` task a
worker a pass and a tree of sums with fan-in 4 over the workers' partials, and around them
a publish and a store task a row panel of the basis and a level of cut tasks, a task per
4 panels (``basis_pass_tasks``), and
:data:`BASIS_ROUND_TRIPS` ``Client.run`` round trips -- independent of n. Nyström's
per-worker driver (kpca_dask/solvers/nystroem/worker_passes.py, ``kpca.nystroem-driver:
workers``) runs the same share and tree counts, ``W + R(W)`` a pass (fewer shares when
there are fewer row blocks than workers: ``min(W, nb)`` shares), and is priced with them
alone.

The arithmetic a pass does is the block drivers' (each upper block evaluated, or read
from the kept blocks, and used twice); what changes is what surrounds it: the
scheduler's share, the client's, and what moves.

Per pass, for the exact solver: the current block of the basis Z (n x c) reaches every
worker (an all-gather: ``n c`` values into each) and each worker's partial products of
its upper blocks, ``n c`` values at most, go through the tree; the orthogonalisation
(CholQR2 on row panels) and Rayleigh-Ritz reduce ``L x L`` Gram matrices the same way,
and only those come to the client. For Nyström: the landmarks (m x d) and the small
factors reach each worker, and each worker's m x c (or m x m) partial goes up the tree.
"""

from __future__ import annotations

import math

from .pricing import TASK_GRAPH_BYTES, _Fit, _kernel_evals, _Priced
from .rates import EIGH_EFFICIENCY

__all__ = ["BASIS_ROUND_TRIPS", "WORKER_TASKS", "worker_pass_tasks"]

#: Tasks a worker runs in one pass of the per-worker driver (kpca_dask/worker_passes.py:
#: one share task a worker, its threads splitting the share inside the task).
WORKER_TASKS = 1

#: ``Client.run`` round trips a Krylov pass of the basis on the workers makes
#: (kpca_dask/worker_basis.py: centring and ``W^T Y``, CGS2, CholQR2, the residual's
#: ``Q_next^T Y``); measured 7 a pass on 3 and 5 workers, at n = 1000 and 4000
#: (tests/kpca_dask/test_worker_passes.py checks it)
BASIS_ROUND_TRIPS = 7


def worker_pass_tasks(workers: int, per_worker: int = WORKER_TASKS) -> tuple[int, int]:
    """(the workers' tasks, the reduction tasks) of one pass of the per-worker driver on
    ``workers`` workers: ``per_worker`` each, and the driver's tree of sums over them
    (:func:`kpca_dask.worker_passes.reduction_tasks`, fan-in 4). The counts of a pass
    after the first, when every worker holds a share (n large against the cluster)."""
    from ..worker_passes import reduction_tasks

    w = max(1, int(workers))
    return per_worker * w, reduction_tasks(per_worker * w)


def _tree_depth(workers: int) -> int:
    """Levels of the driver's tree of sums over ``workers`` partials."""
    from ..worker_passes import REDUCE_FAN_IN

    depth, m = 0, max(2, int(workers))
    while m > 1:
        m = math.ceil(m / REDUCE_FAN_IN)
        depth += 1
    return depth


def _price_exact_workers(f: _Fit, kernel_cache: str) -> _Priced:
    """The exact (randomized) solver on the per-worker driver."""
    from .price_exact import _auto_cache, _cache_split, _exact_compute, _exact_passes

    cl, m, n, d, item, W = f.cl, f.m, f.n, f.d, f.item, f.W
    pairs = None
    if kernel_cache == "auto":
        kernel_cache, pairs = _auto_cache(f.chunks, item, cl, f.passes, f.assumptions)
    from ..worker_passes import basis_pass_tasks

    c, p, p_range = _exact_passes(f)
    work, reduce = worker_pass_tasks(W)
    # the basis on the workers (kpca.worker-basis): a publish and a store task a row panel
    # and the cut tasks (one per 4 panels) around the shares and their tree (the count
    # the driver runs)
    tasks = basis_pass_tasks(f.chunks, W)
    evals = _kernel_evals(f.chunks, item)
    split = _cache_split(f, kernel_cache, pairs, evals)
    # the block tasks' arithmetic as the block drivers do it, on every core, no last round
    # of idle cores (a worker's share is split over its threads by BLAS)
    t_comp, t_comp_later = _exact_compute(f, c, evals, f.cores, kernel_cache, split)
    basis = min(c * (p + 1), 2048 + c)
    depth = _tree_depth(W)
    # Z to every worker, the partial products up the tree (n c each at most), the Gram
    # matrices of CholQR2 and Rayleigh-Ritz (L x L) up the tree and to the client
    w2w = int(f.remote * W * 2 * n * c * item)
    to_client = 3 * basis * basis * 8
    g64 = m.gemm("float64")
    # the workers' share of the orthogonalisation: their row panels of the basis
    ortho = 6 * n * basis * c / (g64 * f.cores)
    storage = evals * item if kernel_cache == "store" else 0

    def pass_parts(t_c: float) -> dict[str, float]:
        return {
            "compute": t_c + ortho,
            "scheduler": tasks * f.ts + (depth + 1 + BASIS_ROUND_TRIPS) * f.rt,
            "network": (2 * n * c * item + depth * 2 * n * c * item / W) / f.net
            if cl.distributed
            else 0.0,
            "storage": storage / (m.storage * W),
            # Rayleigh-Ritz and the small factors: O(L^3), independent of n
            "client": 20 * basis**3 / g64 + 4 * basis**3 / (g64 * EIGH_EFFICIENCY),
        }

    f.stage("first pass", pass_parts(t_comp))
    if p > 1:
        f.stage("passes", pass_parts(t_comp_later), count=p - 1)
    mem_worker = (
        f.x_bytes  # the rows a worker's blocks need (its own and, in the first pass, all)
        + split.cached_bytes / W
        + n * basis * 8 / W  # its row panel of the basis
        + 2 * n * c * item  # Z gathered, its partial products
    )
    mem_client = float(6 * basis * basis * 8)
    f.assumptions.append(
        f"per-worker driver with the basis on the workers: {tasks} tasks a pass ({work} "
        f"share, {reduce} reduction, the rest the basis's row panels: "
        "kpca_dask/worker_passes.py's basis_pass_tasks) and "
        f"{BASIS_ROUND_TRIPS} Client.run round trips"
    )
    return _Priced(
        passes=p,
        passes_range=p_range,
        columns=c,
        tasks=tasks,
        block_tasks=work,
        waves=1,
        graph_bytes=tasks * TASK_GRAPH_BYTES,
        evals=evals,
        flops=float(evals) * (2 * (d + 2) + 4 * c),
        to_client=to_client,
        from_client=0,
        w2w=w2w,
        storage=storage,
        mem_worker=mem_worker,
        mem_client=mem_client,
        kernel_cache=kernel_cache,
        kernel_cache_bytes=split.cached_bytes,
        kernel_cache_share=split.cached_evals / evals if evals else 0.0,
    )


def _price_nystroem_workers(f: _Fit) -> _Priced:
    """Nyström on the per-worker driver (kpca_dask/solvers/nystroem/worker_passes.py): the
    block driver's passes with a task a worker and a tree of sums with fan-in 4."""
    from .price_nystroem import _price_nystroem

    priced = _price_nystroem(f)
    # a share a worker, or a block a share when there are fewer blocks than workers (the
    # driver's split_blocks: min(W, nb) shares)
    shares = max(1, min(int(f.W), int(f.nb)))
    work, reduce = worker_pass_tasks(shares)
    tasks = work + reduce
    passes = f.stages[-1] if f.stages[-1].name == "passes" else None
    if passes is None:  # the covariance method's finish is last
        passes = next(s for s in f.stages if s.name == "passes")
    per = {k: v / passes.count for k, v in passes.parts.items()}
    per["scheduler"] = tasks * f.ts + (_tree_depth(shares) + 1) * f.rt
    part = priced.to_client
    per["network"] = (
        (priced.from_client + _tree_depth(shares) * part) / f.net if f.cl.distributed else 0.0
    )
    i = f.stages.index(passes)
    f.stages.pop(i)
    f.stage("passes", per, count=passes.count)
    f.stages.insert(i, f.stages.pop())
    priced.tasks, priced.block_tasks, priced.waves = tasks, work, 1
    priced.graph_bytes = tasks * TASK_GRAPH_BYTES + priced.from_client
    priced.w2w = int(f.remote * max(0, tasks - 1) * part)
    f.assumptions.append(
        f"per-worker driver: {WORKER_TASKS} task a worker and {reduce} reduction tasks a "
        "pass (kpca_dask/solvers/nystroem/worker_passes.py, kpca.nystroem-driver: workers)"
    )
    return priced
