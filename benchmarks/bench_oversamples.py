"""Which ``n_oversamples`` default (issue 17): whole fits, timed, over seeds.

The block of the randomized solver has ``l = 16 + n_oversamples`` columns. A larger
block converges in fewer passes, but every pass multiplies more columns and the
driver's algebra grows with the basis (``O(n L l)`` a pass for ``L`` basis columns).
This times ``KernelPCA(16, kernel="rbf", gamma=1/64, n_oversamples=o, random_state=s)``
on the headline's data (``bench_headline.make_data``, n = 20 000) for each ``o`` and
seed, alternating the values of ``o`` within each seed, all in one process (the data
and imports are shared; every fit builds its own kernel cache).

    python benchmarks/bench_oversamples.py --data clustered --dtype float32
    python benchmarks/bench_oversamples.py --data clustered --dtype float64
    python benchmarks/bench_oversamples.py --data clustered --kernel-cache recompute
    python benchmarks/bench_oversamples.py --data gaussian --dtype float32
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_headline import GAMMA, K, make_data  # noqa: E402
from bench_passes import cpu_model  # noqa: E402

from kpca_dask import KernelPCA  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--data", default="clustered", choices=["clustered", "gaussian"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--kernel-cache", default="auto")
    ap.add_argument("--oversamples", type=int, nargs="+", default=[8, 16, 24])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", type=Path, help="JSON results file")
    args = ap.parse_args()

    X = make_data(args.data, args.n)
    kw = dict(kernel="rbf", gamma=GAMMA, dtype=args.dtype, kernel_cache=args.kernel_cache)
    KernelPCA(K, random_state=0, **kw).fit(X[:3000])  # imports and thread pools warm
    runs: dict[int, list[dict]] = {o: [] for o in args.oversamples}
    for seed in range(args.seeds):
        for o in args.oversamples:
            t = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                m = KernelPCA(K, n_oversamples=o, random_state=seed, **kw).fit(X)
            runs[o].append(
                {
                    "seed": seed,
                    "seconds": time.perf_counter() - t,
                    "passes": int(m.n_passes_),
                    "basis_columns": m.solver_info_.get("basis_columns"),
                    "converged": bool(m.converged_),
                    "warnings": [str(w.message)[:200] for w in caught],
                }
            )
            r = runs[o][-1]
            print(
                f"seed {seed}, n_oversamples {o}: {r['seconds']:.2f} s, {r['passes']} passes, "
                f"{r['basis_columns']} basis columns, certified {r['converged']}",
                flush=True,
            )
    med = {o: float(np.median([r["seconds"] for r in v])) for o, v in runs.items()}
    best = min(med.values())
    print(
        f"\n{args.data}, {args.dtype}, kernel_cache={args.kernel_cache}, n = {args.n}; "
        f"{cpu_model()}"
    )
    print("| n_oversamples | median s | vs fastest | passes |")
    print("|---|---|---|---|")
    for o in args.oversamples:
        print(
            f"| {o} | {med[o]:.2f} | {med[o] / best:.2f} | {[r['passes'] for r in runs[o]]} |"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "date": datetime.date.today().isoformat(),
                    "cpu": cpu_model(),
                    "n": args.n,
                    "data": args.data,
                    "dtype": args.dtype,
                    "kernel_cache": args.kernel_cache,
                    "median_seconds": {str(o): v for o, v in med.items()},
                    "runs": {str(o): v for o, v in runs.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
