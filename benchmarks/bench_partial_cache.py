"""Pass times of the kernel cache tiers at one budget each, in one process (issue 29).

The partial tier keeps the upper kernel blocks that fit ``kpca.kernel-cache-budget`` and
evaluates the others at every pass. This builds one ``BlockKernelMatrix`` per budget on
the headline data (n = 20 000 clustered, d = 64, rbf, gamma = 1/64, the default mixed
precision: float32 blocks, kept ones evaluated in float64), fills each cache with a first
product, then times products of 32 columns round-robin over the tiers (so a shared
machine's load hits every tier alike) and reports the median and minimum seconds of a
pass per tier. Peak memory is a per-process figure: measure it with whole fits in fresh
processes (docs/tuning.md, "The partial kernel cache").

    python benchmarks/bench_partial_cache.py --budgets full 600MB 400MB 200MB 0 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import dask  # noqa: E402
import dask.array as da  # noqa: E402
from sklearn.datasets import make_blobs  # noqa: E402

from kpca_dask.gram import BlockKernelMatrix  # noqa: E402
from kpca_dask.kernels import RBFKernel  # noqa: E402
from kpca_dask.threads import blas_threads_for_dask  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rows", type=int, default=2000, help="block rows")
    ap.add_argument("--columns", type=int, default=32)
    ap.add_argument("--budgets", nargs="+", default=["full", "600MB", "400MB", "200MB", "0"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    X = make_blobs(args.n, n_features=64, centers=10, random_state=0)[0]
    Xd = da.from_array(X, chunks=(args.rows, -1)).persist(scheduler="threads")
    Z = np.random.default_rng(0).standard_normal((args.n, args.columns))
    kern = RBFKernel(1 / 64)
    mats, infos, first = {}, {}, {}
    with dask.config.set(scheduler="threads"), blas_threads_for_dask():
        for b in args.budgets:
            K = BlockKernelMatrix(Xd, kern, np.float32, cache_eval_dtype=np.float64)
            mode = {"full": "memory", "0": "recompute"}.get(b, "auto")
            with dask.config.set({"kpca.kernel-cache-budget": b} if mode == "auto" else {}):
                infos[b] = K.plan_cache(mode, "randomized")
            t = time.perf_counter()
            K.product(Z)
            first[b] = time.perf_counter() - t
            mats[b] = K
        times: dict[str, list[float]] = {b: [] for b in args.budgets}
        for _ in range(args.repeat):
            for b in args.budgets:
                t = time.perf_counter()
                mats[b].product(Z)
                times[b].append(time.perf_counter() - t)
    rows = []
    for b in args.budgets:
        i = infos[b]
        rows.append(
            {
                "budget": b,
                "tier": i["tier"],
                "blocks_cached": i["blocks_cached"],
                "blocks": i["blocks"],
                "cached_bytes": i["cached_bytes"],
                "first_pass": first[b],
                "pass_median": statistics.median(times[b]),
                "pass_min": min(times[b]),
                "passes": times[b],
            }
        )
        print(
            f"{b:>6} {i['tier']:<9} {i['blocks_cached']:>2}/{i['blocks']} blocks "
            f"{i['cached_bytes'] / 2**20:7.0f} MiB  first {first[b]:6.2f} s  later "
            f"median {statistics.median(times[b]):6.3f} s  min {min(times[b]):6.3f} s"
        )
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
