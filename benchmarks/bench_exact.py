"""Exact kernel PCA: kpca_dask against scikit-learn's KernelPCA, side by side.

Runs every solver on the same data in its own fresh process (so peak memory is
the process's own high-water mark, imports included) and prints wall time,
peak memory and accuracy against an ARPACK reference (tol=0 on the centred
float64 kernel matrix), with ratios to scikit-learn's randomized solver. It
also measures this machine's GEMM and exp throughput and reports our kernel
passes as a fraction of that roofline.

    python benchmarks/bench_exact.py                 # n = 5k, 10k, 20k; 3 repeats
    python benchmarks/bench_exact.py --n 20000 --repeat 1

Data: standard normal rows, d = 64, rbf with gamma = 1/d, 16 components. Its
spectrum is flat (the top 16 eigenvalues lie within 5% of each other), the
hard case for randomized solvers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

HERE = Path(__file__).resolve().parent
K = 16
D = 64


def make_data(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, D))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --------------------------------------------------------------------- children
def child_reference(n: int) -> dict:
    from scipy.sparse.linalg import eigsh
    from sklearn.metrics.pairwise import rbf_kernel

    X = make_data(n)
    Kc = rbf_kernel(X, gamma=1.0 / D)
    mu = Kc.mean(axis=1)
    Kc -= mu[:, None]
    Kc -= mu[None, :]
    Kc += mu.mean()
    t = time.perf_counter()
    w = eigsh(Kc, k=K + 4, which="LA", tol=0, return_eigenvectors=False)
    return {
        "eigenvalues": sorted(w.tolist(), reverse=True)[:K],
        "seconds": time.perf_counter() - t,
    }


def warm_up() -> None:
    """One-time costs every long-running process pays once, outside the timings:
    dask imports distributed at its first compute (~0.35 s here)."""
    import dask.array as da

    da.ones(4, chunks=2).sum().compute()


def child_ours(n: int, dtype: str) -> dict:
    from kpca_dask import KernelPCA

    X = make_data(n)
    warm_up()
    t = time.perf_counter()
    m = KernelPCA(
        K, kernel="rbf", gamma=1.0 / D, eigen_solver="randomized", random_state=0, dtype=dtype
    )
    m.fit(X)
    seconds = time.perf_counter() - t
    import dask.array as da

    from kpca_dask.gram import BlockKernelMatrix

    evals = BlockKernelMatrix(
        da.from_array(X, chunks=(m.chunk_size_, -1)), m.kernel_, dtype
    ).kernel_evaluations_per_pass()
    return {
        "eigenvalues": m.eigenvalues_.tolist(),
        "seconds": seconds,
        "peak_mb": peak_mb(),
        "passes": m.n_passes_,
        "pass_seconds": m.solver_info_["pass_seconds"],
        "evaluations_per_pass": evals,
        "block_columns": m.solver_info_["block_columns"],
        "max_residual": float(np.max(m.residuals_)),
    }


def child_sklearn(n: int, solver: str) -> dict:
    from sklearn.decomposition import KernelPCA

    X = make_data(n)
    warm_up()
    t = time.perf_counter()
    m = KernelPCA(K, kernel="rbf", gamma=1.0 / D, eigen_solver=solver, random_state=0).fit(X)
    return {
        "eigenvalues": m.eigenvalues_.tolist(),
        "seconds": time.perf_counter() - t,
        "peak_mb": peak_mb(),
    }


def child_roofline() -> dict:
    """GEMM (float32, 2 threads) and exp (float32, per thread) throughput here."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3000, 3000)).astype(np.float32)
    a @ a
    t = time.perf_counter()
    for _ in range(3):
        a @ a
    gemm = 3 * 2 * 3000**3 / (time.perf_counter() - t)
    x = -rng.random(8_000_000).astype(np.float32)
    y = np.empty_like(x)
    np.exp(x, out=y)
    t = time.perf_counter()
    for _ in range(5):
        np.exp(x, out=y)
    exp_rate = 5 * x.size / (time.perf_counter() - t)
    return {
        "gemm_flops": gemm,
        "exp_per_s_per_thread": exp_rate,
        "threads": len(os.sched_getaffinity(0)),
    }


def run_child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------- parent
def rel_errors(w, ref) -> np.ndarray:
    return np.abs(np.asarray(w) - ref) / ref


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, nargs="+", default=[5000, 10000, 20000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-arpack", action="store_true", help="skip scikit-learn's arpack runs")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        fn = {
            "reference": lambda: child_reference(int(rest[0])),
            "ours": lambda: child_ours(int(rest[0]), rest[1]),
            "sklearn": lambda: child_sklearn(int(rest[0]), rest[1]),
            "roofline": child_roofline,
        }[kind]
        print(json.dumps(fn()))
        return

    roof = run_child("roofline")
    print(
        f"# machine: {platform.processor() or platform.machine()}, {roof['threads']} cores; "
        f"GEMM float32 {roof['gemm_flops'] / 1e9:.0f} GFLOP/s, exp float32 "
        f"{roof['exp_per_s_per_thread'] / 1e9:.2f} G/s per thread"
    )
    results = {"date": datetime.date.today().isoformat(), "roofline": roof, "runs": {}}
    configs = [("ours", "float32"), ("ours", "float64"), ("sklearn", "randomized")]
    if not args.no_arpack:
        configs.append(("sklearn", "arpack"))
    for n in args.n:
        ref = np.array(run_child("reference", str(n))["eigenvalues"])
        rows = {}
        for kind, variant in configs:
            reps = [run_child(kind, str(n), variant) for _ in range(args.repeat)]
            med = statistics.median(r["seconds"] for r in reps)
            rows[f"{kind}-{variant}"] = {
                "seconds": med,
                "all_seconds": [r["seconds"] for r in reps],
                "peak_mb": max(r["peak_mb"] for r in reps),
                "errors": rel_errors(reps[0]["eigenvalues"], ref).tolist(),
                **{
                    k: v
                    for k, v in reps[0].items()
                    if k not in ("seconds", "peak_mb", "eigenvalues")
                },
            }
        results["runs"][n] = rows
        base = rows["sklearn-randomized"]
        print(f"\n## n = {n}, d = {D}, rbf, {K} components (median of {args.repeat})")
        print(
            "| solver | wall s | peak MB | max rel. eig. error "
            "| speed-up vs sklearn randomized "
            "| memory vs sklearn randomized | every top-16 eigenvalue at least as accurate |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, r in rows.items():
            err = np.array(r["errors"])
            better = bool(np.all(err <= np.array(base["errors"])))
            print(
                f"| {name} | {r['seconds']:.2f} | {r['peak_mb']:.0f} | {err.max():.1e} | "
                f"{base['seconds'] / r['seconds']:.1f}x | "
                f"{r['peak_mb'] / base['peak_mb']:.2f} | "
                f"{'yes' if better else 'no'} |"
            )
        for dtype in ("float32", "float64"):
            r = rows[f"ours-{dtype}"]
            evals, l = r["evaluations_per_pass"], r["block_columns"]
            gemm_flops = 2.0 * evals * (D + 2) + 2 * 2.0 * evals * l  # kernel GEMM + K Z, K^T Z
            scale = 1.0 if dtype == "float32" else 2.0  # float64 GEMM runs at half rate
            t_roof = scale * gemm_flops / roof["gemm_flops"] + evals / (
                roof["exp_per_s_per_thread"]
                * roof["threads"]
                / (scale if dtype == "float64" else 1)
            )
            t_pass = statistics.median(r["pass_seconds"][1:-1] or r["pass_seconds"])
            print(
                f"- ours {dtype}: {r['passes']} passes of {l} columns, median pass "
                f"{t_pass:.3f} s; roofline {t_roof:.3f} s -> {100 * t_roof / t_pass:.0f}% of "
                f"roofline; max residual {r['max_residual']:.1e}"
            )
    out = fresh(HERE / "results" / f"exact-{results['date']}.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nraw results: {out.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
