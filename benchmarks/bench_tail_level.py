"""What the flat tail's certified level costs: the clustered headline fit (n = 20 000,
10 blobs, d = 64, rbf gamma = 1/64, 16 components, defaults) with the tail certified to
1 % (the default, decision 1 of issue 29) and to 5 %, alternating, each fit in its own
process. A measurement only: the 5 % run patches ``default_tail_tol`` in its process; the
estimator has no such setting.

    python benchmarks/bench_tail_level.py --repeat 3

Errors are against the ARPACK reference of the newest clustered headline result
(``benchmarks/results/headline-clustered-20000-*.json``), as bench_headline.py computes it.
"""

from __future__ import annotations

import argparse
import glob
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def child(level: str) -> None:
    if level != "default":
        import kpca_dask.solvers as solvers
        import kpca_dask.solvers.randomized as rz
        import kpca_dask.solvers.randomized_setup as rs

        def fixed(tol: float) -> float:
            return float(level)

        rs.default_tail_tol = rz.default_tail_tol = solvers.default_tail_tol = fixed
    from sklearn.datasets import make_blobs

    from kpca_dask import KernelPCA

    X, _ = make_blobs(n_samples=20000, n_features=64, centers=10, random_state=0)
    t = time.perf_counter()
    m = KernelPCA(16, kernel="rbf", gamma=1 / 64).fit(X)
    seconds = time.perf_counter() - t
    cert = m.solver_info_["certificate"]
    out = {
        "seconds": seconds,
        "passes": int(m.n_passes_),
        "eigenvalues": m.eigenvalues_.tolist(),
        "tail_level": cert["eigenvalue_levels"][-1],
        "certified": bool(cert["ok"]),
        "block_dtype": m.block_dtype_,
    }
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    files = sorted(glob.glob(str(HERE / "results" / "headline-clustered-20000-*.json")))
    ref = None
    for f in reversed(files):
        h = json.load(open(f)).get("headline", {}).get("clustered-quiet")
        if h and "reference" in h:
            ref = np.asarray(h["reference"])
            break
    rows = []
    for _ in range(args.repeat):
        for level in ("default", "0.05"):
            res = subprocess.run(
                [sys.executable, __file__, "--child", level],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(res.stdout.strip().splitlines()[-1])
            if ref is not None:
                err = np.abs(np.asarray(r["eigenvalues"]) - ref) / ref
                r["max_error"], r["gapped_error"] = float(err.max()), float(err[:9].max())
            rows.append({"level": level, **r})
            nan = float("nan")
            print(
                f"tail level {r['tail_level']:.2f}: {r['seconds']:.2f} s, "
                f"{r['passes']} passes, certified {r['certified']}, "
                f"{r['block_dtype']} blocks, largest error {r.get('max_error', nan):.1e}, "
                f"gapped {r.get('gapped_error', nan):.1e}",
                flush=True,
            )
    for level in ("default", "0.05"):
        t = [r["seconds"] for r in rows if r["level"] == level]
        print(f"{level}: median {np.median(t):.2f} s over {len(t)} fits")


if __name__ == "__main__":
    main()
