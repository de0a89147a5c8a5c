"""Exact models and a new batch: the warm-started refit against a cold one (issue 18).

    python benchmarks/bench_warm_refit.py --n 20000 --fractions 0.005 0.01 0.02 0.05 0.1

An exact model cannot add rows (its model is the n x n kernel matrix's eigenvectors): a
nightly update refits it on every row. The refit starts the randomized solver from the
old eigenvectors, extended to the batch by the Nyström extension
(``kpca_dask.update.warm_start_vectors``; ``fit(X, v0=...)``). For each data set and
batch size b = fraction * n, in one process, side by side:

1. the base model: ``KernelPCA(16, kernel="rbf", gamma=1/64, eigen_solver=
   "randomized")`` on the n rows (defaults otherwise: float64, kernel cache "auto");
2. ``cold``: the same on the n + b rows;
3. ``warm``: the same on the n + b rows with ``v0 = warm_start_vectors(base, batch)``
   (the time to build v0 is counted in the warm column).

Reported: passes (the certification pass included), seconds, the speed-up, whether both
are certified, and the largest relative difference of their eigenvalues (gapped ones:
above the largest relative gap of the top 16; the flat tail: certified to 1 % either
way). Data: ``clustered`` (10 Gaussian blobs in d = 64, the headline data; a flat tail
after the 9th eigenvalue) and ``gaussian`` (standard normal rows). The CPU model and its
SIMD level are printed with the results; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)
from bench_passes import cpu_model, data  # noqa: E402

K, D = 16, 64


def _fit(X, dtype, v0=None):
    from kpca_dask import KernelPCA

    est = KernelPCA(K, kernel="rbf", gamma=1 / D, eigen_solver="randomized", dtype=dtype)
    t = time.perf_counter()
    est.fit(X, v0=v0)
    return est, time.perf_counter() - t


def _gapped(lam: np.ndarray) -> int:
    """How many leading eigenvalues sit above the largest relative gap."""
    rel = (lam[:-1] - lam[1:]) / lam[:-1]
    return int(np.argmax(rel)) + 1


def run(kind: str, n: int, fraction: float, dtype: str) -> dict:
    from kpca_dask.update import warm_start_vectors

    b = max(1, int(round(n * fraction)))
    X = data(kind, n + b)
    base, _ = _fit(X[:n], dtype)
    cold, t_cold = _fit(X, dtype)
    t = time.perf_counter()
    v0 = warm_start_vectors(base, X[n:])
    t_v0 = time.perf_counter() - t
    warm, t_warm = _fit(X, dtype, v0)
    g = _gapped(cold.eigenvalues_)
    diff = np.abs(warm.eigenvalues_ / cold.eigenvalues_ - 1)
    return {
        "data": kind,
        "n": n,
        "batch": b,
        "dtype": dtype,
        "cold_passes": int(cold.n_passes_),
        "warm_passes": int(warm.n_passes_),
        "cold_s": t_cold,
        "warm_s": t_warm + t_v0,
        "v0_s": t_v0,
        "certified": bool(cold.converged_ and warm.converged_),
        "gapped": g,
        "gapped_diff": float(diff[:g].max()),
        "tail_diff": float(diff[g:].max()) if g < K else 0.0,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument(
        "--fractions", type=float, nargs="+", default=[0.005, 0.01, 0.02, 0.05, 0.1]
    )
    ap.add_argument("--data", nargs="+", default=["clustered", "gaussian"])
    ap.add_argument("--dtypes", nargs="+", default=["float64"])
    ap.add_argument("--out", default=None, help="JSON results (default: benchmarks/results)")
    a = ap.parse_args(argv)
    today = datetime.date.today().isoformat()
    print(f"# warm-started exact refit, n = {a.n}, {today}")
    print(f"# CPU: {cpu_model()}")
    print(
        "| data | batch | dtype | passes cold / warm | seconds cold / warm | speed-up "
        "| certified | eigenvalue diff. gapped / tail |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for kind in a.data:
        for dtype in a.dtypes:
            for f in a.fractions:
                r = run(kind, a.n, f, dtype)
                rows.append(r)
                print(
                    f"| {kind} | {r['batch']} ({100 * f:g} %) | {dtype} "
                    f"| {r['cold_passes']} / {r['warm_passes']} "
                    f"| {r['cold_s']:.1f} / {r['warm_s']:.1f} "
                    f"| {r['cold_s'] / r['warm_s']:.2f}x | {'yes' if r['certified'] else 'NO'} "
                    f"| {r['gapped_diff']:.1e} / {r['tail_diff']:.1e} |",
                    flush=True,
                )
    out = Path(a.out) if a.out else fresh(HERE / "results" / f"warm-refit-{a.n}-{today}.json")
    out.write_text(json.dumps({"cpu": cpu_model(), "date": today, "rows": rows}, indent=1))
    print(f"raw results: {out}")


if __name__ == "__main__":
    main()
