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
    python benchmarks/bench_passes.py --sklearn   # and scikit-learn's randomized solver

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


def head(wref, rtol=0.05) -> int:
    """Components before the reference's flat tail: the run of eigenvalues ending at
    the K-th with relative gaps below ``rtol`` (the solver's default tail_tol), if
    the K-th is cut from the next by less than that too."""

    def close(i):
        return wref[i] - wref[i + 1] <= rtol * wref[i]

    if not close(K - 1):
        return K
    t = K - 1
    while t > 0 and close(t - 1):
        t -= 1
    return t


def max_angle(V, w, Vref, wref, rtol=1e-2) -> float:
    """Largest principal angle, per cluster of nearly equal reference eigenvalues,
    over the components before the flat tail (whose vectors are not defined)."""
    worst, a = 0.0, 0
    k = min(V.shape[1], head(wref))
    for i in range(1, len(wref) + 1):
        if i == len(wref) or wref[i - 1] - wref[i] > rtol * wref[i - 1]:
            if a < k:
                B = Vref[:, a:i]
                part = V[:, a : min(i, k)]
                resid = part - B @ (B.T @ part)
                worst = max(worst, float(np.linalg.norm(resid, 2)))
            a = i
    return worst


def run_sklearn(kind: str, n: int, ref) -> dict:
    """scikit-learn's KernelPCA, randomized solver, defaults (its fixed schedule)."""
    from sklearn.decomposition import KernelPCA as SkKernelPCA

    X = data(kind, n)
    m = SkKernelPCA(K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0)
    t0 = time.perf_counter()
    m.fit(X)
    secs = time.perf_counter() - t0
    wref, Vref = ref
    err = np.abs(m.eigenvalues_ - wref[:K]) / wref[:K]
    return {
        "data": kind,
        "n": n,
        "dtype": "float64 (scikit-learn)",
        "passes": None,
        "converged": None,
        "seconds": round(secs, 2),
        "max_eigenvalue_error": float(err.max()),
        "gapped_eigenvalue_error": float(err[: head(wref)].max()) if head(wref) else None,
        "max_subspace_angle": (
            max_angle(m.eigenvectors_, m.eigenvalues_, Vref, wref) if head(wref) else None
        ),
        "tail_start": None,
        "warnings": [],
    }


def run(kind: str, n: int, dtype: str, ref) -> dict:
    from kpca_dask import KernelPCA

    X = data(kind, n)
    m = KernelPCA(
        K, kernel="rbf", gamma=GAMMA, eigen_solver="randomized", random_state=0, dtype=dtype
    )
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
        "data": kind,
        "n": n,
        "dtype": dtype,
        "passes": int(m.n_passes_),
        "converged": bool(m.converged_),
        "seconds": round(secs, 2),
        "max_eigenvalue_error": float(err.max()),
        "gapped_eigenvalue_error": float(err[: head(wref)].max()) if head(wref) else None,
        "max_subspace_angle": (
            max_angle(m.eigenvectors_, m.eigenvalues_, Vref, wref) if head(wref) else None
        ),
        "cluster_sizes": cert.get("cluster_sizes"),
        "tail_start": cert.get("tail_start"),
        "warnings": sorted({w.category.__name__ for w in caught}),
    }


def _e(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    ap.add_argument(
        "--sklearn",
        action="store_true",
        help="also scikit-learn's randomized solver (its accuracy, for comparison)",
    )
    ap.add_argument(
        "--data",
        choices=("clustered", "gaussian"),
        action="append",
        help="data sets to run (default both)",
    )
    args = ap.parse_args(argv)
    rows = []
    for kind in args.data or ("clustered", "gaussian"):
        ref = reference(data(kind, args.n))
        for dtype in ("float64", "float32"):
            rows.append(run(kind, args.n, dtype, ref))
            print(json.dumps(rows[-1]), flush=True)
        if args.sklearn:
            rows.append(run_sklearn(kind, args.n, ref))
            print(json.dumps(rows[-1]), flush=True)
    cpu = cpu_model()
    print(f"\nCPU: {cpu}\n")
    print(
        "| data | dtype | passes | converged | tail from | seconds | max eigenvalue error "
        "| error before the tail | max subspace angle before the tail |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['data']} | {r['dtype']} | {r['passes']} | {r['converged']} | "
            f"{r['tail_start']} | {r['seconds']} | {r['max_eigenvalue_error']:.1e} | "
            f"{_e(r['gapped_eigenvalue_error'])} | {_e(r['max_subspace_angle'])} |"
        )
    if args.out:
        args.out.write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
