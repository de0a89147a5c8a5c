"""``kpca calibrate``: measure a :class:`~kpca_dask.cost.machine.Machine`'s constants.

One thread's GEMM and exp rates and memory bandwidth, a local zarr store's write and read
rates, and, on a cluster: the scheduler's seconds per task, the round trip of one graph,
the client-worker bandwidth and the block factors (the real block tasks on every core at
once against what the one-thread rates predict for them).
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .calibration_io import _disk_rates, _parquet_rate, _store_rates
from .io import store_scheme
from .machine import Machine
from .rates import _eval_seconds, _recompute_seconds, _stored_seconds

__all__ = ["calibrate"]


def _cpu_model() -> tuple[str, str]:
    cpu = platform.processor() or ""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    simd = next(
        (s for s in ("avx512f", "avx2", "avx", "sse4_2", "neon") if f" {s}" in flags), ""
    )
    try:
        from threadpoolctl import threadpool_info

        arch = sorted(
            {f"{i.get('internal_api')}:{i.get('architecture')}" for i in threadpool_info()}
        )
        simd = f"{simd} (BLAS {', '.join(arch)})" if arch else simd
    except Exception:  # pragma: no cover - threadpoolctl is a dependency
        pass
    return cpu, simd


def _best(fn, reps: int, min_seconds: float = 0.0) -> float:
    """The fastest of at least ``reps`` calls, repeated for at least ``min_seconds`` (a
    few calls of 15 ms measured 92-151 Gflop/s on the same idle core; a second of them
    settles within a few percent)."""
    best = math.inf
    end = time.perf_counter() + min_seconds
    i = 0
    while i < reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        i += 1
    return best


def _noop(x=None):
    return 0


def _measure_cluster(client: Any, tasks: int = 2000) -> tuple[float, float, float]:
    """(seconds per task, round trip of a one-task graph, client<->worker bytes/s) on
    ``client``'s cluster."""
    import dask

    rt = []
    for i in range(6):
        t0 = time.perf_counter()
        client.compute(dask.delayed(_noop)(i), sync=True)
        rt.append(time.perf_counter() - t0)
    roundtrip = float(np.median(rt[1:]))
    best = math.inf
    for rep in range(2):
        parts = [dask.delayed(_noop)(rep * tasks + i) for i in range(tasks)]
        total = dask.delayed(sum)(parts)
        t0 = time.perf_counter()
        client.compute(total, sync=True)
        best = min(best, time.perf_counter() - t0)
    per_task = max(1e-6, (best - roundtrip) / (tasks + 1))
    data = np.ones(32 << 17)  # 32 MiB
    t0 = time.perf_counter()
    fut = client.scatter(data, direct=True)
    back = fut.result()
    net = 2 * data.nbytes / max(1e-6, time.perf_counter() - t0)
    del fut, back
    return per_task, roundtrip, net


#: Blocks larger than this are the ``fill_large`` factor's (glibc's largest mmap
#: threshold: a larger buffer is always a fresh mapping). Measured and recorded, but the
#: pricing uses ``fill`` (reused memory) and ``Machine.page_touch`` (the new pages) for
#: every block (docs/scaling.md, "Re-checked a day later").
FILL_LARGE_BYTES = 32 << 20

#: The block shape the block factors are measured on: the exact solver's blocks at
#: n >= 50 000 (4 096 rows), d = 32, 16 components + 16 oversamples.
FACTOR_SHAPE = {"rows": 4096, "features": 32, "columns": 32}


def _client_threads(client: Any) -> int:
    """Worker threads of ``client``'s cluster, all workers together."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    return max(1, sum(int(w.get("nthreads", 1)) for w in workers))


def _page_touch_rate(nbytes: int = 2 << 30, chunk: int = 64 << 20) -> float:
    """Bytes per second this thread takes new pages into use while it keeps them, as the
    memory tier's first pass keeps every block it fills: one write per page of fresh
    anonymous mappings of ``chunk`` bytes, all held until ``nbytes`` are touched, the
    median rate of the last quarter (:attr:`Machine.page_touch`).

    Held, and the last quarter: a virtual machine gives back pages its guest freed a
    moment ago far faster than pages it has to fault in from its host. Here (AMD EPYC
    VM with a free-page-reporting balloon, 2026-11-29) mappings touched and freed in
    turn ran at 1.6-1.9 GB/s throughout; mappings held ran at that rate for their first
    0.6-1.3 GB (what had been freed just before) and at 0.35-0.37 GB/s after. The
    memory tier of an n = 50 000 fit (2.7 GB of blocks a worker) filled at the second
    rate (docs/scaling.md). On a machine without that difference every quarter agrees;
    where more was freed just before than ``nbytes``, this measures the faster rate."""
    import mmap

    page = mmap.PAGESIZE
    maps, rates = [], []
    for _ in range(max(2, nbytes // chunk)):
        maps.append(mmap.mmap(-1, chunk))
        a = np.frombuffer(maps[-1], dtype=np.uint8)
        t0 = time.perf_counter()
        a[::page] = 1
        rates.append(chunk / max(1e-9, time.perf_counter() - t0))
        del a  # the mapping stays: its pages are held
    for buf in maps:
        buf.close()
    return float(np.median(rates[-max(1, len(rates) // 4) :]))


def _page_touch_on_every_core(client: Any, nbytes: int) -> float:
    """:func:`_page_touch_rate` of one core while every core of ``client``'s cluster
    takes new pages at once, as the workers of a first pass do (the median core)."""
    import dask
    import psutil

    threads = _client_threads(client)
    # at most a quarter of the memory free here, shared by the cores
    nbytes = max(128 << 20, min(nbytes, psutil.virtual_memory().available // (4 * threads)))
    runs = [dask.delayed(_page_touch_rate, pure=False)(nbytes) for _ in range(threads)]
    return float(np.median(client.compute(runs, sync=True)))


def _block_task_seconds(kind: str, rows: int, d: int, c: int, dtype: str, reps: int) -> float:
    """Median seconds of one kind of block task at one shape, on one thread: run as a task
    on every core of a cluster at once, one kind at a time (:func:`calibrate`).
    ``recompute``: a block evaluated strip by strip and multiplied; ``fill`` /
    ``fill_large``: a whole block of ``rows / 2`` / ``rows`` rows evaluated into fresh
    memory, by :func:`~kpca_dask.block_products.cache_block`, the function the kernel
    cache's first pass runs (it flushes float32 subnormals). ``fill`` keeps one block at
    a time, so that the allocator reuses its memory: whether a block landed on new pages
    depended on what the tasks measured before had freed (a 16 MB block took twice as
    long on new pages here), and the new pages are priced apart (:func:`_page_touch_rate`).
    ``fill_large`` keeps every block (recorded; above glibc's largest mmap threshold each
    is a new mapping). ``stored``: a kept block multiplied."""
    from threadpoolctl import threadpool_limits

    from ..gram import cache_block, kernel_block, pair_products, stored_pair_products
    from ..kernels import make_kernel

    rng = np.random.default_rng()
    kern = make_kernel("rbf", gamma=1.0 / d)
    xi, xj = rng.standard_normal((rows, d)), rng.standard_normal((rows, d))
    zi, zj = rng.standard_normal((rows, c)), rng.standard_normal((rows, c))
    if kind == "fill":
        xi, xj = xi[: rows // 2], xj[: rows // 2]
    times, kept = [], []
    with threadpool_limits(1):
        K = kernel_block(kern, xi, xj, dtype) if kind == "stored" else None
        for _ in range(2 if kind == "fill" else 0):  # the allocator settles (mmap, heap)
            kept.clear()
            kept.append(cache_block(kern, xi, xj, dtype))
        for _ in range(reps):
            if kind == "fill":
                kept.clear()  # its memory is the next block's
            t0 = time.perf_counter()
            if kind == "recompute":
                pair_products(kern, xi, xj, zi, zj, dtype)
            elif kind == "stored":
                stored_pair_products(K, zi, zj, dtype)
            else:
                kept.append(cache_block(kern, xi, xj, dtype))
            times.append(time.perf_counter() - t0)
    del kept, K
    return float(np.median(times))


def _block_factors(
    client: Any, m: Machine, reps: int, rows: int | None = None
) -> dict[str, dict[str, float]]:
    """Measured over predicted time of the block tasks with every core of ``client``'s
    cluster running one of the same kind at once (:attr:`Machine.block_factors`)."""
    import dask

    threads = _client_threads(client)
    r, d, c = rows or FACTOR_SHAPE["rows"], FACTOR_SHAPE["features"], FACTOR_SHAPE["columns"]
    evals = float(r * r)
    factors = {}
    for dt in ("float32", "float64"):
        ev = _eval_seconds(evals, d, 1.0, m, dt)
        predicted = {
            "recompute": _recompute_seconds(evals, d, c, 1.0, m, dt),
            "fill": _eval_seconds(float((r // 2) ** 2), d, 1.0, m, dt),
            "fill_large": ev,
            "stored": _stored_seconds(evals, c, m, dt),
        }
        factors[dt] = {}
        for kind, pred in predicted.items():
            runs = [
                dask.delayed(_block_task_seconds, pure=False)(kind, r, d, c, dt, reps)
                for _ in range(threads)
            ]
            factors[dt][kind] = float(np.median(client.compute(runs, sync=True))) / pred
    return factors


#: Row chunks of the rates' measurement: the pipeline's default ingest chunk (64 MB).
ZARR_CHUNK_BYTES = 64 << 20


def _zarr_rates(chunks: int) -> tuple[float, float]:
    """Bytes per second of writing and reading a chunk of normal float64 rows (d = 64,
    :data:`ZARR_CHUNK_BYTES`) through a zarr store in a temporary folder, one thread,
    zarr's default codec, with a BLAKE2b digest of every chunk as written and as read
    (what the pipeline's stages pay per byte: its stores record and check one): the
    median time of one chunk over ``chunks`` chunks."""
    import hashlib
    import tempfile

    import zarr

    rows = ZARR_CHUNK_BYTES // (64 * 8)
    X = np.random.default_rng(0).standard_normal((rows * chunks, 64))
    w, r = [], []
    with tempfile.TemporaryDirectory() as tmp:
        z = zarr.create_array(f"{tmp}/x.zarr", shape=X.shape, dtype=X.dtype, chunks=(rows, 64))
        for i in range(chunks):
            t0 = time.perf_counter()
            part = X[i * rows : (i + 1) * rows]
            hashlib.blake2b(part.data, digest_size=16).digest()
            z[i * rows : (i + 1) * rows] = part
            w.append(time.perf_counter() - t0)
        za = zarr.open_array(f"{tmp}/x.zarr", mode="r")
        for i in range(chunks):
            t0 = time.perf_counter()
            got = np.asarray(za[i * rows : (i + 1) * rows])  # fresh memory, as a task's
            hashlib.blake2b(got.data, digest_size=16).digest()
            r.append(time.perf_counter() - t0)
            del got
    # a chunk's median time: the sum of three let one slow chunk set the rate (three
    # calibrations minutes apart measured the write at 101, 131 and 108 MB/s)
    per_chunk = X.nbytes / chunks
    return tuple(per_chunk / max(1e-6, float(np.median(t))) for t in (w, r))


def _store_rates_on_a_worker(
    client: Any, store: str | None, storage_options: dict | None, quick: bool
) -> dict | None:
    """:func:`_store_rates` of ``store`` measured in a task on one of ``client``'s
    workers, with objects of a stage's chunk (:data:`ZARR_CHUNK_BYTES`; 8 MiB
    ``quick``): where and at the size the stages move their chunks. Measured in the
    calibrating process with 32 MiB objects, the S3 server read at 330-500 MB/s a
    stream, while 64 MiB objects read at 110-180 MB/s, in a worker or not, and a 1M-row
    ingest was priced 1.34-1.41x under what it took (docs/scaling.md). The streams of
    the aggregate: two a core, at most a GiB of objects at once. None without ``store``."""
    if not store:
        return None
    from ..threads import cpu_count

    nbytes = 8 << 20 if quick else ZARR_CHUNK_BYTES
    streams = max(2, min(2 * cpu_count(), (1 << 30) // nbytes))
    worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[:1]
    rates = client.submit(
        _store_rates, store, storage_options or {}, nbytes, streams, workers=worker, pure=False
    ).result()
    return {**rates, "object_bytes": nbytes, "streams": streams}


def _scheduler_task_seconds(tasks: int) -> tuple[float, float]:
    """(seconds a task, round trip of a one-task graph) with the scheduler in its own
    process and two one-thread worker processes (distributed's SubprocessCluster): what a
    deployed cluster's client sees, the scheduler not sharing the client's interpreter."""
    import warnings

    from distributed import Client
    from distributed.deploy.subprocess import SubprocessCluster

    with (
        warnings.catch_warnings(),
        SubprocessCluster(
            host="127.0.0.1", n_workers=2, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        warnings.simplefilter("ignore")
        c.wait_for_workers(2, timeout=60)
        per_task, roundtrip, _ = _measure_cluster(c, tasks)
    return per_task, roundtrip


def _one_core_rates(quick: bool) -> tuple[dict, dict, float]:
    """GEMM flops and exp evaluations per second on one thread (BLAS limited to one
    thread), by dtype, and the bandwidth of a memory copy."""
    from threadpoolctl import threadpool_limits

    reps = 2 if quick else 4
    size = 512 if quick else 1024
    settle = 0.2 if quick else 1.0
    rng = np.random.default_rng(0)
    gemm, exps = {}, {}
    with threadpool_limits(1):
        for dt in ("float64", "float32"):
            A = rng.standard_normal((size, size)).astype(dt)
            B = rng.standard_normal((size, size)).astype(dt)
            C = np.empty_like(A)
            gemm[dt] = (
                2 * size**3 / _best(lambda A=A, B=B, C=C: np.matmul(A, B, out=C), reps, settle)
            )
            v = -np.abs(rng.standard_normal(1 << 21)).astype(dt)
            w = np.empty_like(v)
            exps[dt] = v.size / _best(lambda v=v, w=w: np.exp(v, out=w), reps, settle)
    a = np.ones(32 << 20 >> 3)  # 32 MiB, beyond most L2
    b = np.empty_like(a)
    bw = 2 * a.nbytes / _best(lambda: np.copyto(b, a), reps + 2, settle / 2)
    return gemm, exps, bw


def _on_a_cluster(client: Any, measure: Callable[[Any], Any]) -> Any:
    """``measure(client)``, or on a LocalCluster of one worker process per core started
    (and stopped) here when ``client`` is None."""
    if client is not None:
        return measure(client)
    import warnings

    from distributed import Client, LocalCluster

    from ..threads import cpu_count

    with (
        warnings.catch_warnings(),  # "port 8787 in use" and the like: not ours to say
        LocalCluster(
            n_workers=cpu_count(),  # one per core: the block factors load every core
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        warnings.simplefilter("ignore")
        return measure(c)


def calibrate(
    client: Any = None,
    *,
    quick: bool = False,
    store: str | None = None,
    storage_options: dict | None = None,
) -> Machine:
    """Measure this machine's constants (under about 30 s; ``quick``: a few seconds).

    GEMM and exp on one thread (BLAS limited to one thread), a memory copy, and, on
    ``client``'s cluster or on a LocalCluster of one worker process per core started
    (and stopped) here: the scheduler's seconds per task, the round trip of one graph,
    the client-worker bandwidth, and the block factors (the real block tasks run on
    every core at once, against what the one-thread rates predict for them). The
    network bandwidth measured on one machine is the loopback's: pass a cluster's real
    figure to :func:`~kpca_dask.cost.estimate` (``kpca plan --network``).

    Without ``client``, the scheduler's seconds per task and the round trip are measured
    again with the scheduler in its own process (a LocalCluster's runs in this one), and
    those are the ones kept. The I/O rates: the local disk (one stream, cold reads; the
    time to open a small file), Parquet's encoding on one core and, with ``store`` (an
    object-store URL, e.g. ``s3://bucket/tmp``, with its ``storage_options``), that
    store's request latency and stream and aggregate bandwidths, under its URL scheme,
    measured in a task on a worker with objects of a stage's chunk (written below
    ``store`` and removed again). New pages (``page_touch``) are measured held, as the
    kept kernel blocks are (:func:`_page_touch_rate`).
    """
    reps = 2 if quick else 4
    gemm, exps, bw = _one_core_rates(quick)
    rates = Machine(gemm_flops=gemm, exp_rate=exps, mem_bandwidth=bw)
    zw, zr = _zarr_rates(1 if quick else 5)

    def on(c: Any) -> tuple[float, float, float, dict, float]:
        # quick: blocks of 2 048 rows (a quarter of the work; its "fill_large" is then a
        # 16 MiB block, below the mmap threshold, and under-states a large block's fill)
        factors = _block_factors(c, rates, reps, 2048 if quick else None)
        touch = _page_touch_on_every_core(c, 256 << 20 if quick else 2 << 30)
        measured = (*_measure_cluster(c, 500 if quick else 2000), factors, touch)
        return (*measured, _store_rates_on_a_worker(c, store, storage_options, quick))

    per_task, roundtrip, net, factors, touch, store_rates = _on_a_cluster(client, on)
    in_process = {"task_seconds": per_task, "roundtrip_seconds": roundtrip}
    if client is None:
        per_task, roundtrip = _scheduler_task_seconds(500 if quick else 2000)
    disk, disk_latency = _disk_rates(64 << 20 if quick else 256 << 20)
    stores = dict(Machine().object_stores)
    if store:
        stores[store_scheme(store)] = store_rates
    cpu, simd = _cpu_model()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return Machine(
        gemm_flops=gemm,
        exp_rate=exps,
        mem_bandwidth=bw,
        page_touch=touch,
        task_seconds=per_task,
        roundtrip_seconds=roundtrip,
        network=net,
        block_factors=factors,
        zarr_write=zw,
        zarr_read=zr,
        storage=disk,
        disk_latency=disk_latency,
        object_stores=stores,
        parquet_write=_parquet_rate(1 << 18 if quick else 1 << 20),
        scheduler_in_client=in_process,
        cpu=cpu,
        simd=simd,
        source=(
            f"kpca calibrate on {platform.node()} at "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} (load {load:.2f})"
        ),
    )
