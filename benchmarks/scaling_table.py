"""The prediction tables of docs/scaling.md, from a calibration file (``kpca calibrate``).

    python benchmarks/scaling_table.py --calibration ~/.cache/kpca/calibration.json

Node assumed: ``--threads`` cores (16) with ``--memory`` (128 GiB) and ``--network``
Gbit/s (25), the per-core rates of the calibrated machine. Exact fits at n = 100k and
1M, Nyström at 10M and 100M (d = 64, 16 components, float32, rbf), on 8, 32 and 128
nodes; the exact passes at the expected number (10), Nyström's randomized method at 6.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--memory", type=float, default=128 * 2**30)
    ap.add_argument("--network", type=float, default=25.0)
    args = ap.parse_args()

    import dask.array as da

    from kpca_dask import KernelPCA
    from kpca_dask.cost import Cluster, load_machine

    m = load_machine(args.calibration)
    print(f"machine: {m.source}; {m.cpu} [{m.simd}]")
    print(
        "| fit | nodes | blocks x rows | tasks/pass | to client/pass | memory/worker | "
        "client memory | time | bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for solver, n in (("randomized", 100_000), ("randomized", 1_000_000)) + (
        ("nystroem", 10**7),
        ("nystroem", 10**8),
    ):
        for nodes in (8, 32, 128):
            cl = Cluster(
                workers=nodes,
                threads=args.threads,
                memory=args.memory,
                network=args.network * 1e9 / 8,
            )
            est = KernelPCA(16, kernel="rbf", eigen_solver=solver, dtype="float32")
            X = da.zeros((n, 64), chunks=(min(n, 1 << 20), 64))
            plan = est.set_params(chunk_size="auto").plan(X, kernel=False)
            if nodes * args.threads != 16:  # the block rule sees the cluster's threads
                from kpca_dask.plan import auto_block_rows

                r = auto_block_rows(n, solver, threads=nodes * args.threads)
                plan = est.set_params(chunk_size=r).plan(X, kernel=False)
            e = plan.estimate(cl, m, input_in_memory=False, persist=True)
            print(
                f"| {solver} n={n:,} | {nodes} | {e.n_blocks} x {e.block_rows} | "
                f"{e.tasks_per_pass:,} | {e.bytes_to_client_per_pass / 1e9:.3g} GB | "
                f"{e.memory_per_worker / 2**30:.2f} GiB | {e.memory_client / 2**30:.2f} GiB | "
                f"{e.seconds:,.0f} s | {e.bound} |"
            )


if __name__ == "__main__":
    main()
