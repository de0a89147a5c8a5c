"""What sets the pass count of the default solve on clustered data (issue 17).

The randomized solver alone (``randomized_eigh``) on the dense centred float64
kernel matrix of the headline's data (``bench_headline.make_data("clustered",
n)``, rbf, gamma = 1/64, k = 16, tol = 1e-8 as the estimator's float64
default), so that only the algorithm is measured: passes, product columns
(what a pass costs with the kernel cache), and per pass the certificate's
largest eigenvalue bound on the 9 gapped eigenvalues and on the flat tail (the
10th-16th) next to the true errors against an ARPACK reference
(``eigsh(tol=1e-10)``).

Sweeps: ``n_oversamples`` (block size ``l = 16 + n_oversamples``),
``tail_tol`` (the relative Weyl bound the flat tail is certified to; default
0.01), and with ``--last-pass`` ``certification_pass=False`` (the last
iteration's certificate returned as is: one pass fewer, the same certified
levels). Needs ~2x the
dense matrix in memory (n = 20 000: 6.4 GB).

    python benchmarks/bench_solver_passes.py            # n = 20 000
    python benchmarks/bench_solver_passes.py --n 8000
    python benchmarks/bench_solver_passes.py --pass-counts 5000 10000 20000

``--pass-counts``: passes to a certified result with and without the
certification pass, clustered and standard normal rows, seeds 0-2, alternating in
one process (seconds side by side; no reference needed).

Writes ``benchmarks/results/solver-passes-<n>-<date>.json``.
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
from bench_headline import GAMMA, K, make_data  # noqa: E402

N_GAPPED = 9  # 10 clusters: 9 eigenvalues above the flat tail


def centred_kernel(n: int, kind: str = "clustered") -> np.ndarray:
    from sklearn.metrics.pairwise import rbf_kernel

    Kc = rbf_kernel(make_data(kind, n), gamma=GAMMA)
    mu = Kc.mean(axis=1)
    Kc -= mu[:, None]
    Kc -= mu[None, :]
    Kc += mu.mean()
    return Kc


class Dense:
    """The dense matrix as the solver's operator; counts product columns."""

    def __init__(self, A: np.ndarray):
        self.A, self.n, self.columns = A, A.shape[0], 0

    def matmul(self, Z: np.ndarray) -> np.ndarray:
        self.columns += Z.shape[1]
        return self.A @ Z


def run(A: np.ndarray, ref: np.ndarray, **kw) -> dict:
    import kpca_dask.solvers.randomized as R

    trace = []
    orig = R.certify

    def certify(theta, res, k, block_res, **ckw):
        c = orig(theta, res, k, block_res, **ckw)
        eb = np.asarray(c["eigenvalue_bounds"])
        err = np.abs(np.asarray(theta[:k]) - ref[:k]) / ref[:k]
        trace.append(
            {
                "bound_gapped": float(eb[:N_GAPPED].max()),
                "bound_tail": float(eb[N_GAPPED:].max()),
                "error_gapped": float(err[:N_GAPPED].max()),
                "error_tail": float(err[N_GAPPED:].max()),
                "ok": bool(c["ok"]),
            }
        )
        return c

    R.certify = certify
    try:
        op = Dense(A)
        t = time.perf_counter()
        r = R.randomized_eigh(op, K, tol=1e-8, random_state=0, warn=False, **kw)
        seconds = time.perf_counter() - t
    finally:
        R.certify = orig
    err = np.abs(r.eigenvalues[:K] - ref[:K]) / ref[:K]
    return {
        "params": kw,
        "passes": int(r.n_passes),
        "product_columns": int(op.columns),
        "converged": bool(r.converged),
        "error_gapped": float(err[:N_GAPPED].max()),
        "error_tail": float(err[N_GAPPED:].max()),
        "seconds": seconds,
        "per_pass": trace,
    }


def pass_counts(ns: list[int], cache_dir: Path | None) -> list[dict]:
    """Passes (and seconds, alternating) with and without the certification pass."""
    import kpca_dask.solvers.randomized as R

    rows = []
    for kind in ("clustered", "gaussian"):
        for n in ns:
            f = None if cache_dir is None else cache_dir / f"Kc_{kind}{n}.npy"
            if f is not None and f.exists():
                A = np.load(f)
            else:
                A = centred_kernel(n, kind)
                if f is not None:
                    np.save(f, A)
            for seed in (0, 1, 2):
                for cp in (True, False):
                    op = Dense(A)
                    t = time.perf_counter()
                    r = R.randomized_eigh(
                        op, K, tol=1e-8, random_state=seed, warn=False, certification_pass=cp
                    )
                    row = {
                        "kind": kind,
                        "n": n,
                        "seed": seed,
                        "certification_pass": cp,
                        "passes": int(r.n_passes),
                        "product_columns": int(op.columns),
                        "converged": bool(r.converged),
                        "max_bound": max(r.info["certificate"]["eigenvalue_bounds"]),
                        "seconds": time.perf_counter() - t,
                    }
                    rows.append(row)
                    print(row, flush=True)
            del A
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--oversamples", type=int, nargs="*", default=[8, 16, 24, 48])
    ap.add_argument("--tail-tols", type=float, nargs="*", default=[0.02, 0.05, 0.1])
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="keep the matrix and the reference as Kc<n>.npy and w<n>.npy here (reused)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--pass-counts", type=int, nargs="*", default=None, metavar="N")
    ap.add_argument(
        "--last-pass",
        action="store_true",
        help="add a run with certification_pass=False to the sweep",
    )
    args = ap.parse_args(argv)
    if args.pass_counts:
        rows = pass_counts(args.pass_counts, args.cache_dir)
        date = datetime.date.today().isoformat()
        out = args.out or fresh(HERE / "results" / f"solver-pass-counts-{date}.json")
        out.write_text(json.dumps({"date": date, "rows": rows}, indent=1))
        print(f"raw: {out}")
        return
    from scipy.sparse.linalg import eigsh

    d = args.cache_dir
    if d is not None and (d / f"Kc{args.n}.npy").exists():
        A = np.load(d / f"Kc{args.n}.npy")
    else:
        A = centred_kernel(args.n)
        if d is not None:
            np.save(d / f"Kc{args.n}.npy", A)
    if d is not None and (d / f"w{args.n}.npy").exists():
        ref = np.load(d / f"w{args.n}.npy")
    else:
        ref = eigsh(A, k=K + 4, which="LA", tol=1e-10, return_eigenvectors=False)
        ref = np.sort(ref)[::-1]
        if d is not None:
            np.save(d / f"w{args.n}.npy", ref)
    runs = [run(A, ref, n_oversamples=o) for o in args.oversamples]
    runs += [run(A, ref, tail_tol=t) for t in args.tail_tols]
    if args.last_pass:
        runs += [run(A, ref, certification_pass=False)]
    print(
        "| params | passes | product columns | certified | gapped error | tail error "
        "| tail bound at the stop |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        last = r["per_pass"][-1]
        print(
            f"| {r['params']} | {r['passes']} | {r['product_columns']} | "
            f"{'yes' if r['converged'] else 'no'} | {r['error_gapped']:.1e} | "
            f"{r['error_tail']:.1e} | {last['bound_tail']:.1e} |"
        )
    date = datetime.date.today().isoformat()
    out = args.out or fresh(HERE / "results" / f"solver-passes-{args.n}-{date}.json")
    out.write_text(
        json.dumps(
            {"n": args.n, "date": date, "reference": ref.tolist(), "runs": runs}, indent=1
        )
    )
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
