"""Where the time of one default fit goes (issue 17): n = 20 000 clustered, rbf, k = 16.

One ``KernelPCA(16, kernel="rbf", gamma=1/64).fit(X)`` (the headline's data,
``bench_headline.make_data``), instrumented from outside (the library is not
changed): every block task and every step of the solver's driver is timed.

Per pass:

* ``wall``: the pass (``CentredKernel._product``: graph build, dask, sums);
* ``kernel_eval_cs``: core-seconds inside ``Kernel.evaluate`` (the GEMM with the
  appended norm columns, plus ``exp``), in recomputing tasks;
* ``cache_fill_cs``: core-seconds of the cache-filling tasks (``cache_block``, their
  kernel evaluation included: ``cache_fill_other_cs`` is the rest);
* ``product_cs``: core-seconds of the ``K_IJ Z`` GEMMs (recomputing tasks: the task
  less its kernel evaluation; cached tasks: the whole task);
* ``overhead``: ``wall - (task core-seconds) / threads``: scheduling, the sums of the
  partial products, idle cores at the end of a wave;
* ``driver``: the solver's algebra after the pass (``_next_block``: CGS2 + CholQR2,
  Rayleigh-Ritz, certificate), with the basis width.

    python benchmarks/profile_headline.py                       # n = 20 000, float64
    python benchmarks/profile_headline.py --n 20000 --dtype float32 --kernel-cache recompute

Writes ``benchmarks/results/profile-<n>-<dtype>-<cache>-<date>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)
from bench_headline import GAMMA, K, make_data, peak_mb, warm_up  # noqa: E402


class Clock:
    """Accumulates seconds per (pass, name); thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acc: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.current = 0

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.acc[self.current][name] += seconds

    def timed(self, name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.add(name, time.perf_counter() - t)

        return wrapper


def instrument(clock: Clock) -> None:
    from kpca_dask import (
        block_matrix,
        block_products,
        centering,
        gram,
        kernels,
        precomputed_matrix,
    )
    from kpca_dask.solvers import randomized

    # tasks: kernel evaluation (inside recomputing tasks and cache fills), the tasks
    local = threading.local()
    orig_eval = kernels.RBFKernel.evaluate

    def evaluate(self, A, B, out=None):
        t = time.perf_counter()
        try:
            return orig_eval(self, A, B, out)
        finally:
            where = getattr(local, "where", "recompute")
            clock.add(f"kernel_eval_{where}_cs", time.perf_counter() - t)

    kernels.RBFKernel.evaluate = evaluate
    orig_block = block_products.cache_block  # the memory tier's fill (not kernel_block)

    def cache_block(*a, **kw):
        local.where = "fill"
        try:
            return orig_block(*a, **kw)
        finally:
            local.where = "recompute"

    timed = {
        "pair_products": clock.timed("recompute_task_cs", gram.pair_products),
        "stored_pair_products": clock.timed("cached_task_cs", gram.stored_pair_products),
        "cache_block": clock.timed("cache_fill_cs", cache_block),
        "_sum_parts": clock.timed("sums_cs", gram._sum_parts),
    }
    # each name where the tasks and the matrix look it up (gram.py only re-exports them)
    for module in (gram, block_products, block_matrix, precomputed_matrix):
        for name, fn in timed.items():
            if hasattr(module, name):
                setattr(module, name, fn)

    # the pass
    orig_product = centering.CentredKernel._product

    def product(self, Z):
        clock.current += 1
        t = time.perf_counter()
        try:
            return orig_product(self, Z)
        finally:
            clock.add("wall", time.perf_counter() - t)
            clock.add("columns", Z.shape[1])

    centering.CentredKernel._product = product
    # the driver's algebra (charged to the pass that precedes it)
    randomized._next_block = clock.timed("driver_next_block", randomized._next_block)
    randomized._rayleigh_ritz = clock.timed("driver_rayleigh_ritz", randomized._rayleigh_ritz)
    randomized.certify = clock.timed("driver_certify", randomized.certify)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--data", default="clustered", choices=["clustered", "gaussian"])
    ap.add_argument("--dtype", default=None, help="estimator dtype (default: its default)")
    ap.add_argument("--kernel-cache", default=None, help="estimator kernel_cache")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    X = make_data(args.data, args.n)
    warm_up()
    clock = Clock()
    instrument(clock)
    from bench_passes import cpu_model

    from kpca_dask import KernelPCA
    from kpca_dask.threads import cpu_count

    kw = {}
    if args.dtype:
        kw["dtype"] = args.dtype
    if args.kernel_cache:
        kw["kernel_cache"] = args.kernel_cache
    t0 = time.perf_counter()
    m = KernelPCA(K, kernel="rbf", gamma=GAMMA, **kw).fit(X)
    fit_s = time.perf_counter() - t0
    info = m.solver_info_ or {}
    threads = cpu_count()
    rows = []
    for p in sorted(k for k in clock.acc if k > 0):
        a = clock.acc[p]
        ev = a["kernel_eval_recompute_cs"] + a["kernel_eval_fill_cs"]
        tasks = a["recompute_task_cs"] + a["cached_task_cs"] + a["cache_fill_cs"] + a["sums_cs"]
        rows.append(
            {
                "pass": p,
                "columns": int(a["columns"]),
                "wall": a["wall"],
                "kernel_eval_cs": ev,
                "cache_fill_cs": a["cache_fill_cs"],
                "cache_fill_other_cs": a["cache_fill_cs"] - a["kernel_eval_fill_cs"],
                "product_cs": a["recompute_task_cs"]
                - a["kernel_eval_recompute_cs"]
                + a["cached_task_cs"],
                "sums_cs": a["sums_cs"],
                "overhead": a["wall"] - tasks / threads,
                "driver": a["driver_next_block"]
                + a["driver_rayleigh_ritz"]
                + a["driver_certify"],
                "driver_next_block": a["driver_next_block"],
                "driver_rayleigh_ritz": a["driver_rayleigh_ritz"],
                "driver_certify": a["driver_certify"],
            }
        )
    before = clock.acc.get(0, {})
    total = {
        key: float(sum(r[key] for r in rows))
        for key in (
            "wall",
            "kernel_eval_cs",
            "cache_fill_cs",
            "product_cs",
            "overhead",
            "driver",
        )
    }
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": threads,
        "n": args.n,
        "data": args.data,
        "params": kw,
        "fit_seconds": fit_s,
        "peak_mb": peak_mb(),
        "passes": int(m.n_passes_),
        "converged": bool(m.converged_),
        "kernel_cache": info.get("kernel_cache"),
        "basis_columns": info.get("basis_columns"),
        "before_first_pass": dict(before),
        "rest_of_fit": fit_s - total["wall"] - total["driver"],
        "totals": total,
        "per_pass": rows,
    }
    print(
        f"# {result['cpu']}, {threads} cores; n = {args.n} {args.data}, {kw or 'defaults'}: "
        f"fit {fit_s:.2f} s, {result['passes']} passes, peak {result['peak_mb']:.0f} MB, "
        f"cache {(info.get('kernel_cache') or {}).get('tier')}"
    )
    print(
        "| pass | cols | wall s | kernel eval core-s | cache fill core-s | products core-s "
        "| overhead s | driver s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['pass']} | {r['columns']} | {r['wall']:.3f} | {r['kernel_eval_cs']:.3f} | "
            f"{r['cache_fill_cs']:.3f} | {r['product_cs']:.3f} | {r['overhead']:.3f} | "
            f"{r['driver']:.3f} |"
        )
    t = total
    print(
        f"| total | | {t['wall']:.2f} | {t['kernel_eval_cs']:.2f} | {t['cache_fill_cs']:.2f} | "
        f"{t['product_cs']:.2f} | {t['overhead']:.2f} | {t['driver']:.2f} |"
    )
    print(f"rest of the fit (validation, trace, gather, model): {result['rest_of_fit']:.2f} s")
    tag = f"{args.dtype or 'default'}-{args.kernel_cache or 'default'}"
    out = args.out or fresh(HERE / "results" / f"profile-{args.n}-{tag}-{result['date']}.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
