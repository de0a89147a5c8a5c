"""Nyström kernel PCA: accuracy against exact, scale to a million rows, and the
crossover with the exact randomized solver; side by side with scikit-learn's
``Nystroem`` + ``PCA``.

Every case runs in its own fresh process, so peak memory is the process's own
high-water mark (max RSS, imports included). Results go to
``benchmarks/results/nystroem-<part>-<date>.json`` and a markdown table is printed.

    python benchmarks/bench_nystroem.py accuracy      # n = 20k, m = 256..4096, every method
    python benchmarks/bench_nystroem.py scale         # n = 1M, d = 64, m = 2048, 16 components
    python benchmarks/bench_nystroem.py crossover     # exact randomized vs Nyström over n
    python benchmarks/bench_nystroem.py report        # markdown tables of the saved results

Data (rbf kernel, gamma = 1/d, d = 64, 16 components):

* ``gaussian``: standard normal rows (as benchmarks/bench_exact.py). The top
  eigenvalues lie within a few percent of each other: the hard case for any
  low-rank approximation.
* ``imbalanced``: one large cluster that is smooth at the kernel's scale (4
  strong directions, the other 60 small) and 100 small tight clusters of
  0.05-0.5 % of the rows each, far apart. The largest small clusters make up
  most of the top-16 spectrum; uniform landmarks miss some of them, RPCholesky
  cannot keep missing them once the large cluster is explained.
* ``clustered``: one large standard normal cluster (about 3/4 of the rows, as
  rough at the kernel's scale as ``gaussian``) and 60 small tight clusters of
  0.5-1.5 % of the rows each. The large cluster's residual never drops, so
  RPCholesky keeps spending landmarks on it: a case where it does not help.

The scale run reads X from a zarr store on disk (float64, chunks of 65536
rows, written once to ``--cache``), so the data are never in memory as a
whole, fits in float32, and writes the embedding to a zarr store block by
block. scikit-learn runs with an address-space cap (``--sklearn-cap-gb``) so
that a MemoryError, not the machine, stops it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

HERE = Path(__file__).resolve().parent
D = 64
K = 16
GAMMA = 1.0 / D
METHODS = ("uniform", "kmeans++", "rpcholesky")


# ------------------------------------------------------------------- data
def make_data(kind: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return rng.standard_normal((n, D))
    if kind == "clustered":
        n_small = 60
        sizes = np.maximum(1, (rng.uniform(0.005, 0.015, size=n_small) * n).astype(int))
        parts = [rng.standard_normal((n - int(sizes.sum()), D))]
        centres = rng.normal(scale=3.0, size=(n_small, D))
        parts += [c + 0.2 * rng.standard_normal((s, D)) for c, s in zip(centres, sizes)]
        X = np.vstack(parts)
        return X[rng.permutation(n)]
    if kind == "imbalanced":
        # A large cluster that is smooth at the kernel's scale (4 strong directions, the
        # rest small: a few dozen landmarks capture it) and 100 small tight clusters of
        # 0.05-0.5 % of the rows each, far apart: the largest of them make up most of
        # the top-16 spectrum, and uniform landmarks miss some of them.
        n_small = 100
        sizes = np.maximum(1, (rng.uniform(0.0005, 0.005, size=n_small) * n).astype(int))
        scale = np.r_[np.ones(4), np.full(D - 4, 0.1)]
        parts = [rng.standard_normal((n - int(sizes.sum()), D)) * scale]
        centres = rng.normal(scale=3.0, size=(n_small, D))
        parts += [c + 0.2 * rng.standard_normal((s, D)) for c, s in zip(centres, sizes)]
        X = np.vstack(parts)
        return X[rng.permutation(n)]
    raise ValueError(kind)


def zarr_data(cache: Path, n: int) -> Path:
    """Gaussian n x 64 float64 in a zarr store (written once, chunk by chunk)."""
    import zarr

    path = cache / f"gaussian-{n}x{D}.zarr"
    if (path / "done").exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    chunk = 65536
    z = zarr.create_array(str(path), shape=(n, D), chunks=(chunk, D), dtype="f8")
    for i, a in enumerate(range(0, n, chunk)):
        b = min(n, a + chunk)
        z[a:b] = np.random.default_rng([0, i]).standard_normal((b - a, D))
    (path / "done").write_text("ok")
    return path


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def warm_up() -> None:
    import dask.array as da

    da.ones(4, chunks=2).sum().compute()


# ---------------------------------------------------------------- metrics
def errors(w, ref) -> dict:
    w = np.asarray(w, dtype=float)[: len(ref)]
    rel = np.abs(w - ref) / ref
    return {"max_rel_eig_error": float(rel.max()), "mean_rel_eig_error": float(rel.mean())}


def angles(emb, ref_vecs) -> dict:
    import scipy.linalg

    a = scipy.linalg.subspace_angles(np.asarray(emb, dtype=float), ref_vecs)
    return {
        "max_angle": float(a.max()),
        "max_angle_top8": float(
            scipy.linalg.subspace_angles(
                np.asarray(emb, dtype=float)[:, :8], ref_vecs[:, :8]
            ).max()
        ),
    }


# --------------------------------------------------------------- children
def child_reference(kind: str, n: int, out: str) -> dict:
    """Exact top-16 eigenpairs (randomized float64, tight tol, certified residuals)."""
    from kpca_dask import KernelPCA

    X = make_data(kind, n)
    t = time.perf_counter()
    m = KernelPCA(
        K,
        kernel="rbf",
        gamma=GAMMA,
        eigen_solver="randomized",
        random_state=0,
        tol=1e-12,
        max_iter=30,
    ).fit(X)
    np.savez(out, eigenvalues=m.eigenvalues_, eigenvectors=m.eigenvectors_)
    return {
        "seconds": time.perf_counter() - t,
        "max_residual": float(m.residuals_.max()),
        "eigenvalues": m.eigenvalues_.tolist(),
    }


def child_accuracy(kind: str, n: int, m: int, method: str, ref: str, seeds: int) -> dict:
    ref_d = np.load(ref)
    X = make_data(kind, n)
    warm_up()
    rows = []
    for seed in range(seeds):
        t = time.perf_counter()
        if method == "sklearn":
            from sklearn.decomposition import PCA
            from sklearn.kernel_approximation import Nystroem

            F = Nystroem(
                kernel="rbf", gamma=GAMMA, n_components=m, random_state=seed
            ).fit_transform(X)
            pca = PCA(K, random_state=seed).fit(F)
            emb, w = pca.transform(F), pca.explained_variance_ * (n - 1)
        else:
            from kpca_dask import KernelPCA

            est = KernelPCA(
                K,
                kernel="rbf",
                gamma=GAMMA,
                eigen_solver="nystroem",
                n_landmarks=m,
                landmark_method=method,
                random_state=seed,
                dtype="float32",
            )
            emb = est.fit_transform(X)
            w = est.eigenvalues_
        rows.append(
            {
                "seconds": time.perf_counter() - t,
                **errors(w, ref_d["eigenvalues"]),
                **angles(emb, ref_d["eigenvectors"]),
            }
        )
    agg = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    return {**agg, "per_seed": rows, "peak_mb": peak_mb()}


def child_scale(n: int, m: int, method: str, nys_method: str, cache: str, solver: str) -> dict:
    import dask.array as da
    import zarr

    src = zarr.open_array(str(zarr_data(Path(cache), n)), mode="r")
    warm_up()
    out = Path(cache) / f"emb-{os.getpid()}.zarr"
    t0 = time.perf_counter()
    res: dict = {}
    if solver == "sklearn":
        from sklearn.decomposition import PCA
        from sklearn.kernel_approximation import Nystroem

        X = src[...]
        t0 = time.perf_counter()
        try:
            F = Nystroem(
                kernel="rbf", gamma=GAMMA, n_components=m, random_state=0
            ).fit_transform(X)
            pca = PCA(K, random_state=0).fit(F)
            emb = pca.transform(F)
            res["eigenvalues"] = (pca.explained_variance_ * (n - 1)).tolist()
            res["fit_seconds"] = res["total_seconds"] = time.perf_counter() - t0
            del emb
        except MemoryError as exc:
            res["error"] = f"MemoryError after {time.perf_counter() - t0:.0f} s ({exc})"
    else:
        from kpca_dask import KernelPCA

        est = KernelPCA(
            K,
            kernel="rbf",
            gamma=GAMMA,
            eigen_solver=solver,
            n_landmarks=m,
            landmark_method=method,
            nystroem_method=nys_method,
            random_state=0,
            dtype="float32",
        )
        emb = est.fit_transform(src)  # lazy: nothing computed past the fit
        res["fit_seconds"] = time.perf_counter() - t0
        da.to_zarr(emb, str(out), overwrite=True)
        res["total_seconds"] = time.perf_counter() - t0
        info = est.solver_info_
        res.update(
            {
                "eigenvalues": est.eigenvalues_.tolist(),
                "passes": est.n_passes_,
                "nystroem_method": est.nystroem_method_ if solver == "nystroem" else None,
                "landmark_seconds": info.get("landmark_seconds"),
                "pass_seconds": info.get("pass_seconds"),
                "max_residual": float(est.residuals_.max()),
                "n_landmarks": getattr(est, "n_landmarks_", None),
            }
        )
        shutil.rmtree(out, ignore_errors=True)
    res["peak_mb"] = peak_mb()
    return res


def child_crossover(n: int, solver: str, dtype: str, ref: str | None) -> dict:
    from kpca_dask import KernelPCA

    X = make_data("gaussian", n)
    warm_up()
    t = time.perf_counter()
    est = KernelPCA(
        K, kernel="rbf", gamma=GAMMA, eigen_solver=solver, random_state=0, dtype=dtype
    )
    emb = est.fit_transform(X)
    res = {
        "seconds": time.perf_counter() - t,
        "peak_mb": peak_mb(),
        "passes": est.n_passes_,
        "eigenvalues": est.eigenvalues_.tolist(),
    }
    if solver == "randomized":
        np.savez(ref, eigenvalues=est.eigenvalues_, eigenvectors=est.eigenvectors_)
    elif ref is not None:
        ref_d = np.load(ref)
        res.update(errors(est.eigenvalues_, ref_d["eigenvalues"]))
        res.update(angles(emb, ref_d["eigenvectors"]))
    return res


def run_child(spec: dict, cap_gb: float | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    if cap_gb:
        cmd += ["--cap-gb", str(cap_gb)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr or "").strip().splitlines()[-3:]
        return {"error": f"exit {out.returncode}: " + " | ".join(tail), "peak_mb": None}
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict:
    return {
        "processor": platform.processor() or platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_before": os.getloadavg(),
    }


def save(part: str, results: dict, tag: str = "") -> None:
    out = fresh(HERE / "results" / f"nystroem-{part}{tag}-{results['date']}.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"\nraw results: {out.relative_to(HERE.parent)}")


# ------------------------------------------------------------------ parts
def part_accuracy(args) -> None:
    n = args.n or 20000
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "n": n,
        "m": args.m,
        "seeds": args.seeds,
        "data": {},
    }
    tmp = Path(tempfile.mkdtemp(prefix="kpca-nys-ref-"))
    try:
        for kind in args.data:
            ref = str(tmp / f"{kind}.npz")
            r0 = run_child({"kind": "reference", "data": kind, "n": n, "out": ref})
            rows = {}
            for method in [*METHODS, "sklearn"]:
                for m in args.m:
                    spec = {
                        "kind": "accuracy",
                        "data": kind,
                        "n": n,
                        "m": m,
                        "method": method,
                        "ref": ref,
                        "seeds": args.seeds,
                    }
                    rows[f"{method}-{m}"] = r = run_child(spec)
                    print(
                        f"  {kind} {method} m={m}: "
                        + (
                            r.get("error")
                            or f"eig err {r['max_rel_eig_error']:.2e}, "
                            f"angle {r['max_angle']:.3f}, {r['seconds']:.1f} s"
                        ),
                        flush=True,
                    )
            results["data"][kind] = {
                "reference": r0,
                "runs": rows,
                "m_for_1e-2": m_for_target(rows, args.m, 1e-2),
            }
            print_accuracy(
                kind, n, rows, args.m, results["data"][kind]["m_for_1e-2"], args.seeds
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save("accuracy", results, "-" + "-".join(args.data))


def m_for_target(rows: dict, ms: list[int], target: float) -> dict:
    """Smallest m reaching ``target`` max relative eigenvalue error per method (grid and
    log-log interpolation between the grid points around it)."""
    out = {}
    for method in [*METHODS, "sklearn"]:
        errs = [rows[f"{method}-{m}"].get("max_rel_eig_error", np.inf) for m in ms]
        grid = next((m for m, e in zip(ms, errs) if e <= target), None)
        interp = None
        for (m0, e0), (m1, e1) in zip(zip(ms, errs), zip(ms[1:], errs[1:])):
            if e0 > target >= e1 and np.isfinite(e0):
                t = (np.log(e0) - np.log(target)) / (np.log(e0) - np.log(e1))
                interp = float(np.exp(np.log(m0) + t * (np.log(m1) - np.log(m0))))
                break
        if errs and errs[0] <= target:
            interp = float(ms[0])
        out[method] = {"grid": grid, "interpolated": interp}
    return out


def print_accuracy(kind, n, rows, ms, target_m, seeds) -> None:
    print(f"\n## {kind}: n = {n}, d = {D}, rbf gamma = 1/{D}, top-{K}, mean of {seeds} seeds")
    print("| landmarks | " + " | ".join(f"m = {m}" for m in ms) + " |")
    print("|---|" + "---|" * len(ms))
    for method in [*METHODS, "sklearn"]:
        cells = []
        for m in ms:
            r = rows[f"{method}-{m}"]
            cells.append(
                r.get("error", "")[:20]
                if "error" in r
                else f"{r['max_rel_eig_error']:.1e} / {r['max_angle']:.2f} / "
                f"{r['seconds']:.1f} s"
            )
        name = "sklearn Nystroem+PCA (uniform)" if method == "sklearn" else f"ours {method}"
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(
        "(cells: max relative error of the top-16 eigenvalues / largest principal angle "
        "(rad) between the training embedding and the exact top-16 eigenvectors / fit time)"
    )
    print("m reaching 1e-2:", {k: v["interpolated"] for k, v in target_m.items()})


def part_scale(args) -> None:
    n = args.n or 1_000_000
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    zarr_data(cache, n)
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "n": n,
        "runs": {},
    }
    cases = [
        ("ours", m, meth, nm)
        for m in args.m
        for meth in args.methods
        for nm in args.nystroem_methods
    ]
    caps = (
        args.sklearn_cap_gb * len(args.sklearn_m)
        if len(args.sklearn_cap_gb) == 1
        else args.sklearn_cap_gb
    )
    cap_of = dict(zip(args.sklearn_m, caps))
    cases += [("sklearn", m, "uniform", "-") for m in args.sklearn_m]
    results["sklearn_cap_gb"] = cap_of
    for solver, m, meth, nm in cases:
        spec = {
            "kind": "scale",
            "n": n,
            "m": m,
            "method": meth,
            "nys_method": nm,
            "cache": str(cache),
            "solver": "sklearn" if solver == "sklearn" else "nystroem",
        }
        reps = [
            run_child(spec, cap_gb=cap_of[m] if solver == "sklearn" else None)
            for _ in range(args.repeat if solver == "ours" else 1)
        ]
        ok = [r for r in reps if "error" not in r]
        r = dict(ok[0] if ok else reps[0])
        if ok:
            r["all_total_seconds"] = [x["total_seconds"] for x in ok]
            r["total_seconds"] = statistics.median(r["all_total_seconds"])
            r["fit_seconds"] = statistics.median(x["fit_seconds"] for x in ok)
            r["peak_mb"] = max(x["peak_mb"] for x in ok)
        key = f"{solver}-{meth}-{nm}-{m}"
        results["runs"][key] = r
        print(
            f"  {key}: "
            + (
                r.get("error")
                or f"fit {r['fit_seconds']:.1f} s, total "
                f"{r['total_seconds']:.1f} s, peak {r['peak_mb']:.0f} MB"
            ),
            flush=True,
        )
    print(f"\n## scale: n = {n}, d = {D}, rbf, {K} components, X read from zarr (float64)")
    print(
        "| solver | m | landmarks | method | fit s | fit + embedding to zarr s | s per 1M rows "
        "| peak MB | passes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for key, r in results["runs"].items():
        solver, meth, nm, m = key.split("-", 3)[0], *key.split("-")[1:3], key.split("-")[-1]
        if "error" in r:
            print(f"| {solver} | {m} | {meth} | {nm} | {r['error']} | | | | |")
            continue
        print(
            f"| {solver} | {m} | {meth} | {r.get('nystroem_method') or nm} | "
            f"{r['fit_seconds']:.1f} | {r['total_seconds']:.1f} | "
            f"{r['total_seconds'] * 1e6 / n:.1f} | {r['peak_mb']:.0f} | {r.get('passes', '')} |"
        )
    save("scale", results)


def part_crossover(args) -> None:
    ns = args.ns
    results = {"date": datetime.date.today().isoformat(), "machine": machine(), "runs": {}}
    tmp = Path(tempfile.mkdtemp(prefix="kpca-nys-x-"))
    try:
        for dtype in args.dtypes:
            for n in ns:
                ref = str(tmp / f"{n}-{dtype}.npz")
                ex = run_child(
                    {
                        "kind": "crossover",
                        "n": n,
                        "solver": "randomized",
                        "dtype": dtype,
                        "ref": ref,
                    }
                )
                ny = run_child(
                    {
                        "kind": "crossover",
                        "n": n,
                        "solver": "nystroem",
                        "dtype": dtype,
                        "ref": ref,
                    }
                )
                results["runs"][f"{dtype}-{n}"] = {"randomized": ex, "nystroem": ny}
                print(
                    f"  {dtype} n={n}: exact randomized "
                    f"{ex.get('seconds', float('nan')):.1f} s, "
                    f"nystroem {ny.get('seconds', float('nan')):.1f} s, "
                    f"eig err {ny.get('max_rel_eig_error', float('nan')):.1e}",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\n## crossover: gaussian d = {D}, rbf, {K} components, default Nyström "
        "(m = 2048, rpcholesky) vs exact randomized"
    )
    print(
        "| dtype | n | exact randomized s | Nyström s | speed-up | Nyström max rel. eig. error "
        "| angle top-8 |"
    )
    print("|---|---|---|---|---|---|---|")
    for key, r in results["runs"].items():
        dtype, n = key.split("-")
        ex, ny = r["randomized"], r["nystroem"]
        print(
            f"| {dtype} | {n} | {ex['seconds']:.1f} | {ny['seconds']:.1f} | "
            f"{ex['seconds'] / ny['seconds']:.1f}x | {ny['max_rel_eig_error']:.1e} | "
            f"{ny['max_angle_top8']:.2f} |"
        )
    save("crossover", results)


def part_report(args) -> None:
    """Markdown tables of the saved results (for docs/nystroem.md)."""
    res = HERE / "results"
    for f in sorted(res.glob("nystroem-accuracy-*.json")):
        r = json.loads(f.read_text())
        print(f"<!-- {f.name} -->")
        for kind, dat in r["data"].items():
            print_accuracy(kind, r["n"], dat["runs"], r["m"], dat["m_for_1e-2"], r["seeds"])
            print()
    for f in sorted(res.glob("nystroem-crossover-*.json")):
        print(f"<!-- {f.name} -->")
        print(
            json.dumps(
                {
                    k: {
                        s: {a: b for a, b in v.items() if a != "eigenvalues"}
                        for s, v in d.items()
                    }
                    for k, d in json.loads(f.read_text())["runs"].items()
                },
                indent=1,
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("part", nargs="?", choices=["accuracy", "scale", "crossover", "report"])
    ap.add_argument("--n", type=int, help="rows (accuracy: 20000, scale: 1000000)")
    ap.add_argument("--m", type=int, nargs="+", help="landmarks")
    ap.add_argument("--data", nargs="+", default=["gaussian", "imbalanced", "clustered"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["rpcholesky"])
    ap.add_argument("--nystroem-methods", nargs="+", default=["auto"])
    ap.add_argument("--sklearn-m", type=int, nargs="*", default=[2048])
    ap.add_argument(
        "--sklearn-cap-gb",
        type=float,
        nargs="+",
        default=[12.0],
        help="address-space cap of each scikit-learn run (one per --sklearn-m, or one for all)",
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--ns", type=int, nargs="+", default=[10000, 20000, 50000])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "kpca-dask-bench"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cap-gb", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.cap_gb:
            cap = int(args.cap_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        s = json.loads(args.child)
        fn = {
            "reference": lambda: child_reference(s["data"], s["n"], s["out"]),
            "accuracy": lambda: child_accuracy(
                s["data"], s["n"], s["m"], s["method"], s["ref"], s["seeds"]
            ),
            "scale": lambda: child_scale(
                s["n"], s["m"], s["method"], s["nys_method"], s["cache"], s["solver"]
            ),
            "crossover": lambda: child_crossover(s["n"], s["solver"], s["dtype"], s["ref"]),
        }[s["kind"]]
        print(json.dumps(fn()))
        return
    if args.part is None:
        ap.error("choose a part: accuracy, scale or crossover")
    if args.part == "report":
        part_report(args)
    elif args.part == "accuracy":
        args.m = args.m or [256, 512, 1024, 2048, 4096]
        part_accuracy(args)
    elif args.part == "scale":
        args.m = args.m or [2048]
        part_scale(args)
    else:
        part_crossover(args)


if __name__ == "__main__":
    main()
