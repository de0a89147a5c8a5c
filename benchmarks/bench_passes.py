"""Passes to a certified result: Gaussian vs clustered data, default settings.

The randomized solver stops when its a-posteriori certificate holds
(docs/solvers.md). This measures how many passes over the kernel blocks that
takes with the defaults a user runs (``KernelPCA(16, kernel="rbf", gamma=1/64,
eigen_solver="randomized")``, float64 and float32), on

* ``gaussian``: standard normal rows, d = 64 (flat top spectrum, gapped);
* ``clustered``: 10 Gaussian clusters in d = 64 (``make_blobs``), whose 11th
  to 16th eigenvalues sit in a flat tail (issue 17),

and checks every result against ``scipy.linalg.eigh`` of the float64 centred
kernel matrix (scikit-learn's rbf kernel): largest relative eigenvalue error
and largest principal angle per cluster of nearly equal eigenvalues.

    python benchmarks/bench_passes.py                # n = 5000
    python benchmarks/bench_passes.py --n 3000 --out results/passes.json

Only public attributes are used (``n_passes_``, ``converged_``,
``eigenvalues_``, ``eigenvectors_``), so the same script measures an older
checkout with ``PYTHONPATH=/path/to/old``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.linalg
from sklearn.datasets import make_blobs
from sklearn.metrics.pairwise import rbf_kernel

K, D = 16, 64
GAMMA = 1.0 / D


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    name = info.get("Model name", "unknown").strip()
    flags = info.get("Flags", "")
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name} ({simd}, {info.get('CPU(s)', '?').strip()} CPUs)"


def data(kind: str, n: int) -> np.ndarray:
    if kind == "gaussian":
        return np.random.default_rng(0).standard_normal((n, D))
    return make_blobs(n, n_features=D, centers=10, random_state=0)[0]


def reference(X: np.ndarray):
    Kx = rbf_kernel(X, gamma=GAMMA)
    mu = Kx.mean(axis=1)
    Kx -= mu[:, None]
    Kx -= mu[None, :]
    Kx += mu.mean()
    n = Kx.shape[0]
    w, V = scipy.linalg.eigh(Kx, subset_by_index=(n - K - 8, n - 1))
    return w[::-1], V[:, ::-1]


def max_angle(V, w, Vref, wref, rtol=1e-2) -> float:
    """Largest principal angle, per cluster of nearly equal reference eigenvalues."""
    worst, a = 0.0, 0
    k = V.shape[1]
    for i in range(1, len(wref) + 1):
        if i == len(wref) or wref[i - 1] - wref[i] > rtol * wref[i - 1]:
            if a < k:
                B = Vref[:, a:i]
                part = V[:, a:min(i, k)]
                resid = part - B @ (B.T @ part)
                worst = max(worst, float(np.linalg.norm(resid, 2)))
            a = i
    return worst


def run(kind: str, n: int, dtype: str, ref) -> dict:
    from kpca_dask import KernelPCA

    X = data(kind, n)
    m = KernelPCA(K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0,
                  dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        m.fit(X)
        secs = time.perf_counter() - t0
    wref, Vref = ref
    k = m.eigenvalues_.shape[0]
    err = np.abs(m.eigenvalues_ - wref[:k]) / wref[:k]
    info = getattr(m, "solver_info_", {}) or {}
    cert = info.get("certificate") or {}
    return {
        "data": kind, "n": n, "dtype": dtype, "passes": int(m.n_passes_),
        "converged": bool(m.converged_), "seconds": round(secs, 2),
        "max_eigenvalue_error": float(err.max()),
        "gapped_eigenvalue_error": float(err[:10].max()),
        "max_subspace_angle": max_angle(m.eigenvectors_, m.eigenvalues_, Vref, wref),
        "cluster_sizes": cert.get("cluster_sizes"),
        "warnings": sorted({w.category.__name__ for w in caught}),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    for kind in ("clustered", "gaussian"):
        ref = reference(data(kind, args.n))
        for dtype in ("float64", "float32"):
            rows.append(run(kind, args.n, dtype, ref))
            print(json.dumps(rows[-1]), flush=True)
    cpu = cpu_model()
    print(f"\nCPU: {cpu}\n")
    print("| data | dtype | passes | converged | seconds | max eigenvalue error "
          "| top-10 eigenvalue error | max subspace angle |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['data']} | {r['dtype']} | {r['passes']} | {r['converged']} | "
              f"{r['seconds']} | {r['max_eigenvalue_error']:.1e} | "
              f"{r['gapped_eigenvalue_error']:.1e} | {r['max_subspace_angle']:.1e} |")
    if args.out:
        args.out.write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
