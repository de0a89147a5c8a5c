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
import datetime
import json
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--exact", type=int, nargs="*", default=[20000])
    ap.add_argument("--nystroem", type=int, nargs="*", default=[200000])
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import dask
    import numpy as np
    from distributed import Client, LocalCluster

    from kpca_dask import KernelPCA
    from kpca_dask.cost import EXECUTION_CONFIG, Cluster, _cpu_model, load_machine

    m = load_machine(args.calibration)
    print(f"machine: {m.source}")
    rng = np.random.default_rng(0)
    rows = []
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
        # one small fit first: the workers' first tasks import numpy, scipy and kpca_dask
        # (about 2 s here), a cost a long-lived cluster pays once, not per fit
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            KernelPCA(4, kernel="rbf", eigen_solver="randomized").fit(
                rng.normal(size=(3000, args.d))
            )
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
            # priced before the fit's own choices are known: the kernel cache by the
            # estimator's rule ("auto"), then checked against the tier the fit took
            e = plan.estimate(cl, m, passes=int(est.n_passes_))
            tier = (est.solver_info_.get("kernel_cache") or {}).get("tier")
            row = {
                "solver": solver,
                "n": n,
                "d": args.d,
                "passes": int(est.n_passes_),
                "kernel_cache": tier,
                "kernel_cache_predicted": e.kernel_cache,
                "measured_s": sec,
                "predicted_s": e.seconds,
                "bound": e.bound,
                "measured_over_predicted": sec / e.seconds,
                "stages": {s.name: s.seconds for s in e.stages},
                # what each pass took (the first: kernel blocks evaluated, kept ones
                # filled), to set beside the predicted stages
                "measured_pass_seconds": list(est.solver_info_.get("pass_seconds") or []),
                "load": [load0, load1],
            }
            rows.append(row)
            print(
                f"{solver} n={n}: measured {sec:.1f} s, {est.n_passes_} passes, kernel cache "
                f"{tier} (predicted {row['kernel_cache_predicted']}); predicted "
                f"{e.seconds:.1f} s ({e.bound}); measured/predicted {sec / e.seconds:.2f}; "
                f"load {load0:.1f} -> {load1:.1f}",
                flush=True,
            )
    out = {
        "date": datetime.date.today().isoformat(),
        "cpu": " ".join(_cpu_model()),
        "machine": m.to_dict(),
        "cluster": "LocalCluster, 2 worker processes x 1 thread",
        "runs": rows,
    }
    path = args.out or fresh(
        Path(__file__).resolve().parent / "results" / f"cost-model-{out['date']}.json"
    )
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
