"""Materialise the kernel matrix or recompute it every pass? The crossover in n_features.

One off-diagonal block of an exact pass (2000 x 2000, float32, rbf, a 40-column
block of the randomized solver, one thread, as one task on a Dask worker does it),
three ways, for several numbers of features d:

* recompute -- evaluate k(X_I, X_J) in strips and multiply (``pair_products``),
  what every pass costs when K is not stored;
* stored    -- read the block back from a real zarr kernel store (page cache warm,
  checked against its CRC-32C marker) and multiply (``KernelBlockReader`` +
  ``stored_pair_products``), what every pass costs when K is materialised;
* build     -- evaluate the whole block, checksum and write it to the store
  (``_ensure_block``), paid once when K is materialised.

Materialising pays when ``build + p * stored < p * recompute`` for a solve of p
passes. The table gives the per-block times, the store's write and read rates and
the break-even number of passes for each d.

    python benchmarks/bench_kernel_store.py                 # d = 16 ... 2048
    python benchmarks/bench_kernel_store.py --d 32 1024     # just these

The store is written under a temporary folder (``--workdir`` to choose: put it on
the disk the real store would use). Results go to
``benchmarks/results/kernel-store-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The worker settings pipeline.runtime.cluster gives a local cluster's worker processes; glibc
# reads them at start-up, so set them and re-execute before numpy is imported.
from pipeline.runtime.cluster import WORKER_MALLOC_ENV  # noqa: E402  (imports no numpy user code)

if any(os.environ.get(k) != str(v) for k, v in WORKER_MALLOC_ENV.items()):
    os.environ.update({k: str(v) for k, v in WORKER_MALLOC_ENV.items()})
    os.execv(sys.executable, [sys.executable, *sys.argv])

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)
from threadpoolctl import threadpool_limits  # noqa: E402

from kpca_dask.gram import pair_products, stored_pair_products  # noqa: E402
from kpca_dask.kernels import RBFKernel  # noqa: E402
from pipeline.model.kernel_store import _OPENED, KernelBlockReader, _crc, _ensure_block  # noqa: E402
from pipeline.output.store import Location  # noqa: E402

R = 2000  # rows per block, what chunk_size="auto" picks at n = 100k
L = 40  # block columns of the randomized solver for 16 components


def median_ms(fn, repeat: int) -> float:
    fn()  # warm: first touch of buffers, BLAS init
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def measure(d: int, workdir: Path, n_blocks: int, repeat: int) -> dict:
    import zarr

    rng = np.random.default_rng(d)
    X = rng.standard_normal((n_blocks * R, d))
    kernel = RBFKernel(1.0 / d)
    z = rng.standard_normal((R, L))
    path = workdir / f"k-{d}.zarr"
    g = zarr.open_group(str(path), mode="w")
    from zarr.codecs import Crc32cCodec

    n = n_blocks * R
    g.create_array(
        "K",
        shape=(n, n),
        chunks=(R, R),
        dtype="float32",
        compressors=[Crc32cCodec()],
        fill_value=0,
    )
    g.create_array(
        "done", shape=(n_blocks, n_blocks), chunks=(1, 1), dtype="uint64", fill_value=0
    )
    g.attrs.update({"block_rows": R, "build_id": f"bench-{d}"})
    url = Location(str(path)).url
    blocks = [(0, j) for j in range(1, n_blocks)]
    xs = [X[j * R : (j + 1) * R] for j in range(n_blocks)]
    with threadpool_limits(1):
        t = time.perf_counter()
        for i, j in blocks:  # the build: evaluate, checksum, write, mark done
            _ensure_block(url, {}, f"bench-{d}", i, j, xs[i], xs[j], kernel, "float32", False)
        build = (time.perf_counter() - t) / len(blocks) * 1e3
        reader = KernelBlockReader(url, build_id=f"bench-{d}")
        it = iter(range(10**9))

        def stored():
            i, j = blocks[next(it) % len(blocks)]
            stored_pair_products(reader(i, j), z, z, "float32")

        def read_only():
            i, j = blocks[next(it) % len(blocks)]
            reader(i, j)

        Kz = g["K"]
        blk = reader(0, 1)

        def write_only():  # block row 1 is not used by the other measurements
            j = 2 + next(it) % (n_blocks - 2)
            Kz[R : 2 * R, j * R : (j + 1) * R] = blk
            _crc(blk)

        def recompute():
            j = 1 + next(it) % (n_blocks - 1)
            pair_products(kernel, xs[0], xs[j], z, z, "float32")

        res = {
            "d": d,
            "build_ms": build,
            "stored_ms": median_ms(stored, repeat),
            "read_ms": median_ms(read_only, repeat),
            "write_ms": median_ms(write_only, max(3, repeat // 3)),
            "recompute_ms": median_ms(recompute, repeat),
        }
    _OPENED.clear()
    block_gb = R * R * 4 / 1e9
    res["write_gb_s"] = block_gb / (res["write_ms"] / 1e3)
    res["read_gb_s"] = block_gb / (res["read_ms"] / 1e3)
    saving = res["recompute_ms"] - res["stored_ms"]
    res["break_even_passes"] = (res["build_ms"] / saving) if saving > 0 else None
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--d", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024, 2048])
    ap.add_argument("--blocks", type=int, default=9, help="row blocks of the test store")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--workdir", help="where the test stores go (default: a temp dir)")
    args = ap.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="kpca-kstore-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    print(
        "| d | recompute a block | stored: read + multiply (read alone) | build once: "
        "evaluate + write (write alone) | passes to break even |\n|---|---|---|---|---|"
    )
    for d in args.d:
        r = measure(d, root, args.blocks, args.repeat)
        rows.append(r)
        be = "never" if r["break_even_passes"] is None else f"{r['break_even_passes']:.1f}"
        print(
            f"| {d} | {r['recompute_ms']:.1f} ms | {r['stored_ms']:.1f} ms "
            f"({r['read_ms']:.1f} ms, {r['read_gb_s']:.2f} GB/s) | {r['build_ms']:.1f} ms "
            f"({r['write_ms']:.1f} ms, {r['write_gb_s']:.2f} GB/s) | {be} |",
            flush=True,
        )
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "block_rows": R,
        "block_columns": L,
        "dtype": "float32",
        "kernel": "rbf",
        "threads": 1,
        "rows": rows,
    }
    (HERE / "results").mkdir(exist_ok=True)
    out = fresh(HERE / "results" / f"kernel-store-{result['date']}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"\nresults: {out}")
    if not args.workdir:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
