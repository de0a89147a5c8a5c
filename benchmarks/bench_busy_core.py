"""Fit time with one core busy: defaults vs ``OPENBLAS_NUM_THREADS=1`` (issue 17).

Starts ``python -c 'while True: pass'`` beside the fits, then times
``KernelPCA(16, kernel="rbf", gamma=1/64, eigen_solver="randomized")`` on the
clustered data of bench_passes.py (each fit in a fresh process, so that the
BLAS thread count set in its environment is the one it starts with), and
scikit-learn's randomized solver for comparison. Eigenvalue errors are against
``scipy.linalg.eigh``.

    python benchmarks/bench_busy_core.py --n 5000
    PYTHONPATH=/path/to/old python benchmarks/bench_busy_core.py   # an older checkout
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_passes import GAMMA, K, cpu_model, data, reference


def child(which: str, n: int, dtype: str) -> None:
    X = data("clustered", n)
    if which == "sklearn":
        from sklearn.decomposition import KernelPCA

        m = KernelPCA(K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0)
    else:
        from kpca_dask import KernelPCA

        m = KernelPCA(
            K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0, dtype=dtype
        )
    t0 = time.perf_counter()
    m.fit(X)
    secs = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": round(secs, 1),
                "passes": getattr(m, "n_passes_", None),
                "eigenvalues": m.eigenvalues_.tolist(),
            }
        )
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--child", nargs=3, metavar=("WHICH", "N", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child[0], int(args.child[1]), args.child[2])
    wref, _ = reference(data("clustered", args.n))
    runs = [
        ("ours", "float64", None),
        ("ours", "float64", "1"),
        ("ours", "float32", None),
        ("sklearn", "float64", None),
    ]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows = []
    try:
        for which, dtype, blas in runs:
            env = dict(os.environ)
            if blas:
                env["OPENBLAS_NUM_THREADS"] = blas
            out = subprocess.run(
                [sys.executable, __file__, "--child", which, str(args.n), dtype],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            lam = np.asarray(r.pop("eigenvalues"))
            r.update(
                which=which,
                dtype=dtype,
                openblas_threads=blas or "default",
                max_eigenvalue_error=float(np.max(np.abs(lam - wref[:K]) / wref[:K])),
            )
            rows.append(r)
            print(json.dumps(r), flush=True)
    finally:
        busy.terminate()
        busy.wait()
    print(f"\nCPU: {cpu_model()}, one core busy, n = {args.n}, clustered\n")
    print("| solver | dtype | OPENBLAS_NUM_THREADS | seconds | passes | max eigenvalue error |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['which']} | {r['dtype']} | {r['openblas_threads']} | {r['seconds']} | "
            f"{r['passes']} | {r['max_eigenvalue_error']:.1e} |"
        )


if __name__ == "__main__":
    sys.exit(main())
