"""The dense solver's price: every upper block comes to the client, then ``eigh`` there."""

from __future__ import annotations

from .cluster import Cluster
from .pricing import TASK_GRAPH_BYTES, _Fit, _Priced
from .rates import EIGH_EFFICIENCY, _eval_seconds


def _price_dense(f: _Fit) -> _Priced:
    """Every upper block comes to the client, then ``eigh`` there."""
    cl, m, n, d, r, k, nb, item = f.cl, f.m, f.n, f.d, f.r, f.k, f.nb, f.item
    evals = n * (n + r) // 2
    block_tasks = nb * (nb + 1) // 2
    tasks = block_tasks
    to_client = n * n * item // 2 + n * r * item // 2
    w2w = int(f.remote * block_tasks * 2 * r * d * 8)
    t_comp = _eval_seconds(evals, d, f.elem, m, f.dtype) * m.factor("fill", f.dtype) / f.cores
    eig = (4 / 3 * n**3 + 2 * n**2 * k) / (m.gemm("float64") * EIGH_EFFICIENCY)
    local_cores = Cluster.local().cores if not cl.distributed else 1
    parts = {
        "compute": t_comp,
        "scheduler": tasks * f.ts + f.rt,
        "network": to_client / f.net if cl.distributed else 0.0,
        "client": eig / max(1, local_cores) + 3 * n * n * 8 / f.client_bw,
    }
    f.stage("kernel+eigh", parts)
    return _Priced(
        passes=1,
        passes_range=(1, 1),
        columns=f.c,
        tasks=tasks,
        block_tasks=block_tasks,
        waves=1,
        graph_bytes=tasks * TASK_GRAPH_BYTES,
        evals=evals,
        flops=evals * 2 * (d + 2),
        to_client=to_client,
        from_client=0,
        w2w=w2w,
        storage=0,
        mem_worker=f.x_bytes / f.W + cl.threads * (r * r * item + 2 * r * d * 8),
        mem_client=float(f.x_bytes) + 3 * n * n * 8,
    )
