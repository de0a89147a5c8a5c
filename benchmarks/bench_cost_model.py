"""The cost model's predicted fit time against measured fits on this machine.

    python benchmarks/bench_cost_model.py --calibration /path/cal.json --exact 20000 \
        --nystroem 200000

Each fit runs on a LocalCluster of 2 one-thread worker processes (forced onto the
cluster); the prediction is re-priced at the passes the fit made (the spectrum decides
them). The load average before and after each fit is printed beside it: the ratio means
little on a machine other people are loading.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--exact", type=int, nargs="*", default=[20000])
    ap.add_argument("--nystroem", type=int, nargs="*", default=[200000])
    ap.add_argument("--d", type=int, default=32)
    args = ap.parse_args()

    import dask
    import numpy as np
    from distributed import Client, LocalCluster

    from kpca_dask import KernelPCA
    from kpca_dask.cost import EXECUTION_CONFIG, Cluster, load_machine

    m = load_machine(args.calibration)
    print(f"machine: {m.source}")
    rng = np.random.default_rng(0)
    runs = [("randomized", n) for n in args.exact] + [("nystroem", n) for n in args.nystroem]
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        ) as lc,
        Client(lc) as client,
        dask.config.set({EXECUTION_CONFIG: "cluster"}),
    ):
        cl = Cluster.from_client(client)
        for solver, n in runs:
            X = rng.normal(size=(n, args.d)).astype(np.float32)
            est = KernelPCA(16, kernel="rbf", eigen_solver=solver, dtype="float32")
            plan = est.plan(X)
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(X)
            sec = time.perf_counter() - t0
            load1 = os.getloadavg()[0]
            e = plan.estimate(cl, m, passes=int(est.n_passes_))
            print(
                f"{solver} n={n}: measured {sec:.1f} s, {est.n_passes_} passes; predicted "
                f"{e.seconds:.1f} s ({e.bound}); measured/predicted {sec / e.seconds:.2f}; "
                f"load {load0:.1f} -> {load1:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
