"""One pass of products over cached kernel blocks: strips against whole-block GEMMs (issue 17).

The kernel cache tier (and a kernel store) multiplies every upper block twice per pass,
``K_IJ Z_J`` and ``K_IJ^T Z_I``. ``gram.stored_pair_products`` does both strip by strip
(``STORED_STRIP_BYTES`` of it at a time), so each strip is read from memory once; the previous
version ran two GEMMs over the whole block. This times one pass over the 55 upper
blocks of n = 20 000 (2 000-row blocks, 40 columns) on a pool of two threads with one
BLAS thread each (the threaded scheduler's layout on 2 cores), alternating the two
versions in one process.

    python benchmarks/bench_stored_products.py --dtype float32
    python benchmarks/bench_stored_products.py --dtype float64 --repeat 9
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_passes import cpu_model  # noqa: E402

from kpca_dask.gram import _aligned, stored_pair_products  # noqa: E402
from kpca_dask.threads import cpu_count  # noqa: E402


def whole_block(block, zi, zj, dtype):
    """The previous version: two GEMMs over the whole block."""
    dtype = np.dtype(dtype)
    blk = _aligned(block, dtype)
    zi_c = _aligned(zi, dtype)
    yi = blk @ (zi_c if zj is None else _aligned(zj, dtype))
    yj = None if zj is None else np.ascontiguousarray((zi_c.T @ blk).T)
    return yi, yj


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--block-rows", type=int, default=2000)
    ap.add_argument(
        "--blocks", type=int, default=10, help="row blocks (n = blocks x block rows)"
    )
    ap.add_argument("--columns", type=int, default=40)
    ap.add_argument("--threads", type=int, default=min(2, cpu_count()))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", help="JSON results file (default: print only)")
    args = ap.parse_args()

    dt, r, nb, c = np.dtype(args.dtype), args.block_rows, args.blocks, args.columns
    rng = np.random.default_rng(0)
    pairs = [(i, j) for i in range(nb) for j in range(i, nb)]
    blocks = [rng.random((r, r), dtype=np.float32).astype(dt) for _ in pairs]
    Z = [rng.standard_normal((r, c)) for _ in range(nb)]

    def one_pass(fn, ex):
        def job(t):
            (i, j), b = t
            return fn(b, Z[i], None if i == j else Z[j], dt)

        t0 = time.perf_counter()
        with threadpool_limits(1, "blas"):
            parts = list(ex.map(job, zip(pairs, blocks)))
        return time.perf_counter() - t0, parts

    times: dict[str, list[float]] = {"whole": [], "strips": []}
    with ThreadPoolExecutor(args.threads) as ex:
        _, a = one_pass(whole_block, ex)
        _, b = one_pass(stored_pair_products, ex)
        diff = max(
            float(np.abs(x[1] - y[1]).max() / np.abs(x[1]).max())
            for x, y in zip(a, b)
            if x[1] is not None
        )
        for _ in range(args.repeat):
            times["whole"].append(one_pass(whole_block, ex)[0])
            times["strips"].append(one_pass(stored_pair_products, ex)[0])
    med = {k: float(np.median(v)) for k, v in times.items()}
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": cpu_count(),
        "dtype": dt.name,
        "n": nb * r,
        "block_rows": r,
        "columns": c,
        "threads": args.threads,
        "pass_seconds_median": med,
        "pass_seconds": times,
        "speedup": med["whole"] / med["strips"],
        "max_relative_difference": diff,
    }
    print(
        f"{dt.name}, n = {nb * r}, {len(pairs)} blocks of {r} rows, {c} columns, "
        f"{args.threads} threads: whole-block GEMMs {med['whole']:.3f} s a pass, strips "
        f"{med['strips']:.3f} s ({result['speedup']:.2f}x); results differ by "
        f"{diff:.1e} (summation order); {result['cpu']}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
