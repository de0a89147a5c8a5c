"""The Nyström solver's price (:mod:`kpca_dask.solvers.nystroem`): one task per row block
(or per 8 blocks when fused), a tree of sums with fan-in 8, one m x c (randomized) or
m x m (covariance) result to the client per pass; the landmarks chosen on the client."""

from __future__ import annotations

import math

from .pricing import EXPECTED_PASSES, TASK_GRAPH_BYTES, _Fit, _Priced
from .rates import EIGH_EFFICIENCY, _eff_inner, _eff_skinny


def _nystroem_tree(nb: int, cores: int, split_every: int) -> tuple[int, int]:
    """(leaf tasks, sum tasks) of one Nyström pass: one leaf per row block, or per
    ``split_every`` blocks when fused (the driver's :func:`_fuse_leaves` rule), and a tree
    of sums with fan-in ``split_every``."""
    fused = nb // split_every >= 2 * cores
    leaves = math.ceil(nb / split_every) if fused else nb
    sums, lv, first = 0, leaves, True
    while lv > 1 or (first and not fused):
        lv = math.ceil(lv / split_every)
        sums += lv
        first = False
    return leaves, sums


def _nystroem_compute(f: _Fit, method: str, mp: int, evals: int) -> float:
    """Seconds of one Nyström pass's tasks on the cluster's cores."""
    m, n, d, c, dtype = f.m, f.n, f.d, f.c, f.dtype
    g = m.gemm(dtype)
    return (
        (
            evals * 2 * (d + 2) / (g * _eff_inner(d))
            + (
                n * mp * mp / g
                if method == "covariance"
                else evals * 4 * c / (g * _eff_skinny(c))
            )
            + evals * f.elem / m.exp(dtype)
        )
        * m.factor("recompute", dtype)
        / f.cores
    )


def _landmark_parts(f: _Fit, mp: int) -> tuple[int, dict[str, float]]:
    """(sample rows, parts) of choosing the landmarks: RPCholesky on a sample of the rows,
    on the client."""
    n, d, m = f.n, f.d, f.m
    s_land = min(n, max(20000, 5 * mp))
    parts = {
        "compute": 0.0,
        "client": (s_land * mp * (2 * (d + 2) + 2 * mp)) / m.gemm("float64")
        + 4 * mp**3 / (m.gemm("float64") * EIGH_EFFICIENCY),
        "scheduler": 3 * f.rt,
        "network": s_land * d * 8 / f.net if f.cl.distributed else 0.0,
    }
    return s_land, parts


def _price_nystroem(f: _Fit) -> _Priced:
    """One task per row block (or per 8 blocks when fused), a tree of sums, one m x c
    (randomized) or m x m (covariance) result to the client per pass."""
    from ..solvers.nystroem import SPLIT_EVERY, choose_method

    cl, m, n, d, c, k, W = f.cl, f.m, f.n, f.d, f.c, f.k, f.W
    mp = int(f.plan.n_landmarks or min(n, 2048))
    method = (f.params or {}).get("nystroem_method", "auto")
    if method == "auto":
        method = choose_method(mp, d, k, c)
    p_exp = 1 if method == "covariance" else EXPECTED_PASSES["nystroem"]
    p = int(f.passes or p_exp)
    p_range = (1, 1) if method == "covariance" else (3, int(f.plan.max_passes) + 1)
    leaves, sums = _nystroem_tree(f.nb, f.cores, SPLIT_EVERY)
    tasks = leaves + sums
    acc_cols = mp if method == "covariance" else c
    part = mp * acc_cols * 8 + mp * 8
    evals = n * mp
    flops = evals * 2 * (d + 2) + (n * mp * mp if method == "covariance" else evals * 4 * c)
    storage = 0 if f.persisted else f.x_bytes
    w2w = int(f.remote * (leaves + sums - 1) * part)
    consts = mp * d * 8 + mp * c * 8
    to_client = part
    parts = {
        "compute": _nystroem_compute(f, method, mp, evals),
        "scheduler": tasks * f.ts + f.rt,
        "network": (w2w / W + consts * W + to_client) / f.net if cl.distributed else 0.0,
        "storage": storage / (m.storage * W),
        "client": (4 * mp * c * c) / m.gemm(f.dtype),
    }
    s_land, lm_parts = _landmark_parts(f, mp)
    f.stage("landmarks", lm_parts)
    f.stage("passes", parts, count=p)
    if method == "covariance":
        # the finish on the client: the m x m covariance's eigendecomposition and the
        # statistics kept for updates (measured at m = 2048: 2.3 s of client time)
        g64 = m.gemm("float64")
        f.stage("finish", {"client": 4 * mp**3 / (g64 * EIGH_EFFICIENCY) + 4 * mp**3 / g64})
    mem_worker = (f.x_bytes / W if f.persisted else 0) + cl.threads * (
        f.r * d * 8 + min(f.r, 8192) * mp * f.item + SPLIT_EVERY * part
    )
    # the landmark sample, RPCholesky's s x m factor, the m x m matrices
    mem_client = float(s_land * d * 8 + s_land * mp * 8 + 5 * mp * mp * 8)
    f.assumptions.append(f"Nyström {method} method, {mp} landmarks")
    return _Priced(
        passes=p,
        passes_range=p_range,
        columns=c,
        tasks=tasks,
        block_tasks=leaves,
        waves=1,
        graph_bytes=tasks * TASK_GRAPH_BYTES + consts,
        evals=evals,
        flops=flops,
        to_client=to_client,
        from_client=consts,
        w2w=w2w,
        storage=storage,
        mem_worker=mem_worker,
        mem_client=mem_client,
    )
