"""The exact block solvers' price (randomized, and ARPACK as passes of one column), as
:meth:`kpca_dask.gram.BlockKernelMatrix.product` runs them: per pass one task per upper
block, one sum task per row block of each wave, one accumulator task per row block of
each later wave, ``n_blocks`` tasks that persist the pass's block of Z; only final row
blocks come back to the client, where the Krylov basis lives."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .cluster import Cluster
from .pricing import (
    EXPECTED_PASSES,
    TASK_GRAPH_BYTES,
    _Fit,
    _kernel_evals,
    _Priced,
    exact_waves,
)
from .rates import _eff_skinny, _eval_seconds, _pass_compute, _stored_seconds


def _auto_cache(
    chunks: list[int], item: int, cl: Cluster, passes: int | None, notes: list[str]
) -> tuple[str, list[tuple[int, int]] | None]:
    """The kernel cache tier the estimator's ``kernel_cache="auto"`` picks, and the blocks
    the partial tier keeps (the rule of :meth:`kpca_dask.gram.BlockKernelMatrix.plan_cache`,
    with the memory the workers already use taken as none)."""
    from ..cache_tiers import blocks_to_cache
    from ..gram import CACHE_MEMORY_FRACTION, upper_block_bytes
    from ..resources import user_cache_budget

    upper = upper_block_bytes(chunks, item)
    if passes is not None and passes <= 1:
        return "recompute", None
    # the user's budget (dask config kpca.kernel-cache-budget) overrides the estimator's
    # on any scheduler, so it overrides the cluster's memory here
    user = user_cache_budget()
    if user is not None:
        budget = float(user)
        where = "the budget set by dask config kpca.kernel-cache-budget"
    elif cl.memory is None:
        return "recompute", None
    else:
        budget = CACHE_MEMORY_FRACTION * float(cl.memory) * max(1, cl.workers)
        where = "half of the workers' memory"
    if upper <= budget:
        notes.append(
            f"kernel cache 'auto': the upper blocks ({upper / 2**30:.2f} GiB) fit {where}: "
            "kept after pass 1"
        )
        return "memory", None
    if user is None:  # the partial tier only on a budget the user set
        return "recompute", None
    pairs = blocks_to_cache(chunks, item, budget)
    if not pairs:
        return "recompute", None
    notes.append(
        f"kernel cache 'auto': the upper blocks ({upper / 2**30:.2f} GiB) exceed {where}: "
        f"{len(pairs)} of {len(chunks) * (len(chunks) + 1) // 2} blocks kept after pass 1 "
        "(partial), the others evaluated at every pass"
    )
    return "partial", pairs


@dataclass
class _CacheSplit:
    """What a pass reads from the kernel cache and what it evaluates."""

    #: kernel evaluations a pass saves by reading kept blocks (all: the memory tier)
    cached_evals: int
    #: bytes of the kept blocks, on all workers together
    cached_bytes: int


def _cache_split(f: _Fit, tier: str, pairs: list[tuple[int, int]] | None, evals: int):
    from ..cache_tiers import block_evaluations

    if tier == "memory":
        return _CacheSplit(evals, evals * f.item)
    if tier != "partial" or not pairs:
        return _CacheSplit(0, 0)
    c, item = f.chunks, f.item
    return _CacheSplit(
        sum(block_evaluations(c[i], c[j], i == j, item) for i, j in pairs),
        sum(c[i] * c[j] * item for i, j in pairs),
    )


@dataclass
class _ExactGraph:
    """The tasks of one exact pass and what comes back to the client."""

    wave_tasks: int
    waves: list[tuple[int, int]]
    #: first row of each row block, and n
    offsets: np.ndarray
    block_tasks: int
    tasks: int
    rows_back: int


def _exact_passes(f: _Fit) -> tuple[int, int, tuple[int, int]]:
    """(columns, passes, range of passes) of an exact fit; ARPACK as single-column
    passes."""
    solver, k, c = f.plan.solver, f.k, f.c
    if solver == "arpack":
        c = 1
        f.assumptions.append("ARPACK priced as single-column passes (about 2k+1 of them)")
    p_exp = EXPECTED_PASSES.get(solver, 10)
    if f.plan.power_iter != "auto" and solver == "randomized":
        p_exp = int(f.plan.power_iter) + 2
    if solver == "arpack":
        p_exp = 2 * k + 1 + (f.passes or 0)
    p = int(f.passes or p_exp)
    p_range = (2, int(f.plan.max_passes) + 1) if solver == "randomized" else (k, 20 * k)
    return c, p, p_range


def _exact_graph(f: _Fit, kernel_cache: str) -> _ExactGraph:
    """One task per upper block, one sum task per row block of each wave, one accumulator
    task per row block of each later wave, ``n_blocks`` tasks persisting Z (and as many
    reading X when it is not in memory and the blocks are evaluated)."""
    cl, n, nb, chunks = f.cl, f.n, f.nb, f.chunks
    threads = cl.cores if cl.distributed else 1
    wave_tasks = max(128, 4 * threads)
    wv = exact_waves(chunks, wave_tasks) if cl.distributed else [(i, i + 1) for i in range(nb)]
    offsets = np.concatenate([[0], np.cumsum(chunks)])
    block_tasks = nb * (nb + 1) // 2
    sum_tasks = sum(nb - s for s, _ in wv)
    if cl.distributed:
        # each wave after the first adds its sums to the previous accumulator on the
        # workers (one task per row block from its first on); Z persisted (nb tasks),
        # and X's row blocks for the pass when they are not in memory already and the
        # blocks are evaluated (nb more); only final row blocks come to the client,
        # each once
        acc_tasks = sum(nb - s for s, _ in wv[1:])
        x_tasks = nb if not f.persisted and kernel_cache not in ("memory", "store") else 0
        tasks = block_tasks + sum_tasks + acc_tasks + nb + x_tasks
        rows_back = n
    else:
        tasks = block_tasks + sum_tasks
        rows_back = int(sum(n - offsets[s] for s, _ in wv))
    return _ExactGraph(wave_tasks, wv, offsets, block_tasks, tasks, rows_back)


def _exact_compute(
    f: _Fit, c: int, evals: int, block_tasks: int, kernel_cache: str, split: _CacheSplit
) -> tuple[float, float]:
    """Seconds of the block tasks of the first pass and of each later one. The partial
    tier: the kept blocks' share as the memory tier prices all of them, the rest as
    recomputed blocks."""
    m, d, elem, dtype, cores = f.m, f.d, f.elem, f.dtype, f.cores
    # tasks of similar size over the cores: the last round is as long as a full one
    rounds = block_tasks / cores
    imbalance = math.ceil(rounds) / rounds if rounds > 0 else 1.0
    t_comp = _pass_compute(evals, d, c, elem, m, dtype, cores) * imbalance

    def stored(values: float) -> float:
        return (
            _stored_seconds(values, c, m, dtype) * m.factor("stored", dtype) / cores * imbalance
        )

    if kernel_cache == "store":
        t_comp_later = stored(evals)
    elif kernel_cache in ("memory", "partial"):
        kept = split.cached_evals
        rest = _pass_compute(evals - kept, d, c, elem, m, dtype, cores) * imbalance
        t_comp_later = stored(kept) + rest
        # the first pass evaluates the kept blocks whole onto new pages (their first
        # touch priced apart: Machine.page_touch), then multiplies them as every later
        # pass does (mixed precision evaluates in float64 and keeps the blocks rounded to
        # float32); the others as recomputed
        fill = np.dtype(np.float64) if f.mixed else dtype
        t_comp = (
            _eval_seconds(kept, d, elem, m, fill) * m.factor("fill", fill) / cores * imbalance
            + split.cached_bytes / m.page_touch / cores * imbalance
            + t_comp_later
        )
    else:
        t_comp_later = t_comp
    return t_comp, t_comp_later


def _exact_client(f: _Fit, c: int, p: int, rows_back: int) -> tuple[int, float]:
    """(Krylov basis columns, the driver's seconds per pass): two projections against the
    basis, CholQR, Rayleigh-Ritz, adding each wave's partial sums (memory bound) -- one
    BLAS thread."""
    n = f.n
    basis = min(c * (p + 1), max(512, min(2048, (128 << 20) // (8 * max(1, n)))) + c)
    g64 = f.m.gemm("float64")
    seconds = (
        (4 * n * basis * c + 4 * n * c * c) / (g64 * _eff_skinny(c))
        + (rows_back * c * 8 * 2 + 4 * n * c * 8) / f.client_bw
        + 20 * basis**3 / g64
    )
    return basis, seconds


def _exact_memory(
    f: _Fit, c: int, g: _ExactGraph, split: _CacheSplit, kernel_cache: str, basis: int
) -> tuple[float, float]:
    """(bytes per worker, bytes on the client) of an exact fit."""
    n, r, d, item, nb, W = f.n, f.r, f.d, f.item, f.nb, f.W
    strip = 4 << 20
    per_task = 2 * r * d * 8 + 2 * r * c * item + strip + 2 * r * c * 8
    wave_partials = min(g.block_tasks, 2 * g.wave_tasks) * 2 * r * c * item
    mem_worker = (
        f.x_bytes / W + nb * r * c * item / W + f.cl.threads * per_task + wave_partials / W
    )
    if kernel_cache in ("memory", "partial"):
        mem_worker += split.cached_bytes / W
        f.assumptions.append(
            "kernel blocks cached in the workers' memory after pass 1"
            if kernel_cache == "memory"
            else f"{split.cached_bytes / 2**30:.2f} GiB of kernel blocks cached in the "
            "workers' memory after pass 1, the others evaluated at every pass"
        )
    mem_client = float(f.x_bytes)  # X_fit kept on the client (training rows)
    mem_client += 8 * n * (basis + 4 * c) + 2 * max(
        (n - g.offsets[s]) * c * 8 for s, _ in g.waves
    )
    return mem_worker, mem_client


def _price_exact(f: _Fit, kernel_cache: str) -> _Priced:
    """Per pass: the block tasks, the waves' sums and accumulators, Z persisted; final row
    blocks come back to the client; the Krylov basis lives on the client."""
    cl, m, n, d, r, nb, item, W = f.cl, f.m, f.n, f.d, f.r, f.nb, f.item, f.W
    pairs = None
    if kernel_cache == "auto":
        kernel_cache, pairs = _auto_cache(f.chunks, item, cl, f.passes, f.assumptions)
    c, p, p_range = _exact_passes(f)
    g = _exact_graph(f, kernel_cache)
    evals = _kernel_evals(f.chunks, item)
    split = _cache_split(f, kernel_cache, pairs, evals)
    to_client = g.rows_back * c * 8
    from_client = n * c * item
    # partials to their sum tasks, X and Z blocks to the block tasks (each task needs
    # two row blocks; a worker fetches a row block once per pass at most)
    partials = (2 * g.block_tasks - nb) * r * c * item
    inputs = min(2 * g.block_tasks, W * nb) * r * (d * 8 + c * item)
    w2w = int(f.remote * (partials + inputs))
    if kernel_cache == "store":
        storage = evals * item
        f.assumptions.append("kernel blocks read from a kernel store at every pass")
    else:
        storage = 0
    t_comp, t_comp_later = _exact_compute(f, c, evals, g.block_tasks, kernel_cache, split)
    basis, client_per_pass = _exact_client(f, c, p, g.rows_back)

    def pass_parts(t_c: float) -> dict[str, float]:
        return {
            "compute": t_c,
            "memory bandwidth": 0.0,
            "scheduler": g.tasks * f.ts + (len(g.waves) + 1) * f.rt,
            "network": max(to_client, w2w / W) / f.net if cl.distributed else 0.0,
            "storage": storage / (m.storage * W),
            "client": client_per_pass,
        }

    f.stage("first pass", pass_parts(t_comp))
    # mixed precision: the last of the p passes is the float64 certifying pass (the
    # float32 iteration has no certification pass of its own; kpca_dask._solve_mixed)
    on_blocks = p - 1 if f.mixed else p
    if on_blocks > 1:
        f.stage("passes", pass_parts(t_comp_later), count=on_blocks - 1)
    if f.mixed:
        # the pairs are certified on the kernel evaluated afresh in float64 (one pass on
        # the k vectors and a column of ones; kpca_dask.mixed)
        t_cert = _pass_compute(evals, d, f.k + 1, f.elem, m, np.float64, f.cores)
        f.stage("certifying pass (float64)", pass_parts(t_cert))
        f.assumptions.append(
            "mixed precision: float32 kernel blocks, certified by one float64 pass"
        )
    mem_worker, mem_client = _exact_memory(f, c, g, split, kernel_cache, basis)
    return _Priced(
        passes=p,
        passes_range=p_range,
        columns=c,
        tasks=g.tasks,
        block_tasks=g.block_tasks,
        waves=len(g.waves),
        graph_bytes=g.tasks * TASK_GRAPH_BYTES + from_client,
        evals=evals,
        flops=float(evals) * (2 * (d + 2) + 4 * c),
        to_client=to_client,
        from_client=from_client,
        w2w=w2w,
        storage=storage,
        mem_worker=mem_worker,
        mem_client=mem_client,
        kernel_cache=kernel_cache,
        kernel_cache_bytes=split.cached_bytes,
        kernel_cache_share=split.cached_evals / evals if evals else 0.0,
    )
