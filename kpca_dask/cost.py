"""A cost model of a fit: passes, tasks, flops, bytes moved, memory and predicted time.

:func:`estimate` prices a :class:`~kpca_dask.plan.FitPlan` on a cluster
(:class:`Cluster`: workers x threads, memory, network) with the constants of a
:class:`Machine` (GEMM and exp rates per core, memory bandwidth, scheduler
seconds per task, the round trip of one graph, network bandwidth), measured by
:func:`calibrate` (``kpca calibrate``) or given for a cluster. It models the
drivers as they are written (docs/scaling.md):

* exact randomized solver (:meth:`kpca_dask.gram.BlockKernelMatrix.product`):
  per pass, one task per upper block, one sum task per row block of each *wave*
  (``wave_tasks = max(128, 4 x threads)`` block tasks), one accumulator task per
  row block of each later wave (the waves' sums are added on the workers),
  and ``n_blocks`` tasks that persist the pass's block of Z; only final row
  blocks come back to the client: ``n x c x 8`` bytes per pass for ``c``
  columns (on the threaded scheduler every wave's partial sums from its first
  row to n are added in the caller). The Krylov basis (n x L) and its
  orthogonalisation live on the client.
* Nyström (:mod:`kpca_dask.solvers.nystroem`): one task per row block (or per
  8 blocks when fused), a tree of sums with fan-in 8, one m x c (randomized)
  or m x m (covariance) result to the client per pass.
* dense: every upper block comes to the client, then ``eigh`` there.

Nothing here runs a pass: the model reads the plan and the cluster only. The
number of passes of ``n_power_iter="auto"`` depends on the spectrum; it is an
input (``passes``), with a default taken from the fits measured in this project
(:data:`EXPECTED_PASSES`), and a finished fit can be re-priced with its own
``n_passes_`` (the manifest records both).

:func:`choose_execution` uses the model to run a small fit on the client's
threads when a distributed client is active but the cluster's per-task cost
exceeds what its cores would save (issue 27, item 9).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Cluster",
    "Estimate",
    "Execution",
    "Machine",
    "calibrate",
    "choose_execution",
    "embed_seconds",
    "estimate",
    "exact_waves",
    "load_machine",
]

#: Passes of an ``n_power_iter="auto"`` fit when the caller does not say: the exact
#: fits measured here took 4-13 passes (README: 13 at n = 20 000 with a flat tail,
#: 6-7 on well separated spectra) and Nyström's randomized method about 6
#: (nystroem.estimated_cost). The certification pass is included.
EXPECTED_PASSES = {"randomized": 10, "nystroem": 6, "arpack": 10}

#: Bytes of the graph per block task (its key, function reference and argument keys
#: as pickled by distributed; measured from ``len(pickle.dumps(task))``).
TASK_GRAPH_BYTES = 250


#: Efficiency of the two GEMM shapes of a kernel block against a square GEMM, as
#: measured on one block (README, "the exact solve against the roofline"): the
#: distance GEMM with a short inner dimension ``d + 2`` runs at about half the rate
#: at d = 32; the skinny products with ``c`` columns at 55-75 % of it.
def _eff_inner(d: int) -> float:
    return (d + 2) / (d + 2 + 32)


def _eff_skinny(c: int) -> float:
    return c / (c + 16)


#: Efficiency of LAPACK's symmetric eigensolver (tridiagonal reduction: half of its
#: flops are matrix-vector products, memory bound) against a square GEMM.
EIGH_EFFICIENCY = 0.25


# ------------------------------------------------------------------ machine
@dataclass(frozen=True)
class Machine:
    """Measured constants of one node (per core unless said otherwise).

    The built-in values are one quiet ``kpca calibrate`` of this project's 2-core
    AVX-512 machine (OpenBLAS SkylakeX kernels), 2026-11-26, rounded:
    benchmarks/results/calibration-2026-11-26.json. ``kpca calibrate`` replaces them
    with the machine at hand's (``storage`` and ``run_start_seconds`` are given, not
    measured).
    """

    #: GEMM flops per second on one core, by dtype name.
    gemm_flops: dict = field(default_factory=lambda: {"float64": 5.5e10, "float32": 1.5e11})
    #: exp evaluations per second on one core (numpy's, in place), by dtype name.
    exp_rate: dict = field(default_factory=lambda: {"float64": 1.2e9, "float32": 1.9e9})
    #: Streaming memory bandwidth of one core (bytes/s; a copy counts read + write).
    mem_bandwidth: float = 2.5e10
    #: Scheduler (and worker bookkeeping) seconds per task of a large graph.
    task_seconds: float = 2.0e-3
    #: Seconds from submitting a one-task graph to having its result on the client.
    roundtrip_seconds: float = 0.012
    #: Network bandwidth of a node, each direction (bytes/s): 10 Gbit/s.
    network: float = 1.25e9
    #: Storage read/write bandwidth of a node (bytes/s); not calibrated (given).
    storage: float = 5.0e8
    #: Bytes per second one core writes into / reads from a local zarr store with zarr's
    #: default codec, in 64 MB chunks with a digest each (what a pipeline's ingest,
    #: scaling and embedding stages pay per byte of rows beyond the storage itself).
    zarr_write: float = 1.9e8  # benchmarks/results/calibration-2026-11-26-2.json
    zarr_read: float = 1.7e8
    #: Fixed start of a pipeline run (``kpca run``: imports, the Prefect API, starting
    #: the cluster), priced by ``kpca plan``; not calibrated (given). Measured on the
    #: development machine as the command's wall time less its stages' total: 17-18 s
    #: (benchmarks/bench_pipeline.py exact, 2026-11-26).
    run_start_seconds: float = 17.5
    #: Measured time of the real block tasks, run on every core at once, over the time
    #: the rates above predict for them (:func:`_block_factors`): ``recompute`` (a block
    #: evaluated strip by strip and multiplied), ``fill`` (a whole block evaluated into
    #: fresh memory: the kernel cache's first pass, page faults included) and ``stored``
    #: (a kept block multiplied). Above 1 when cores slow each other down (shared
    #: caches, memory bandwidth, clock) or a kernel misses the rates' shapes (repeated
    #: calibrations here spread 1.4-2.0 for ``recompute``; the predicted time of the
    #: exact 100k pipeline's solve from them, 64-86 s).
    block_factors: dict = field(
        default_factory=lambda: {
            "float32": {"recompute": 2.0, "fill": 2.7, "fill_large": 6.1, "stored": 2.8},
            "float64": {"recompute": 1.8, "fill": 3.6, "fill_large": 5.4, "stored": 2.8},
        }
    )
    cpu: str = ""
    simd: str = ""
    source: str = "built-in defaults (quiet 2-core AVX-512 node, kpca calibrate 2026-11-26)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Machine:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})

    def gemm(self, dtype: Any) -> float:
        return float(self.gemm_flops.get(np.dtype(dtype).name, self.gemm_flops["float64"]))

    def exp(self, dtype: Any) -> float:
        return float(self.exp_rate.get(np.dtype(dtype).name, self.exp_rate["float64"]))

    def factor(self, kind: str, dtype: Any = "float64") -> float:
        f = (self.block_factors or {}).get(np.dtype(dtype).name) or {}
        return float(f.get(kind, 1.0))


#: Where ``kpca calibrate`` writes and the estimator looks (``KPCA_CALIBRATION`` wins).
def default_calibration_path() -> Path:
    env = os.environ.get("KPCA_CALIBRATION")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kpca" / "calibration.json"


def load_machine(path: str | os.PathLike | None = None) -> Machine:
    """The calibrated machine at ``path`` (default :func:`default_calibration_path`), else
    the built-in defaults (their ``source`` says so). A file that cannot be read is an
    error only when ``path`` was given."""
    p = Path(path) if path is not None else default_calibration_path()
    try:
        return Machine.from_dict(json.loads(p.read_text()))
    except (OSError, ValueError, TypeError):
        if path is not None:
            raise
        return Machine()


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


#: Blocks larger than this are priced with the ``fill_large`` factor (glibc's largest
#: mmap threshold: a larger buffer is always a fresh mapping).
FILL_LARGE_BYTES = 32 << 20

#: The block shape the block factors are measured on: the exact solver's blocks at
#: n >= 50 000 (4 096 rows), d = 32, 16 components + 16 oversamples.
FACTOR_SHAPE = {"rows": 4096, "features": 32, "columns": 32}


def _block_task_seconds(kind: str, rows: int, d: int, c: int, dtype: str, reps: int) -> float:
    """Median seconds of one kind of block task at one shape, on one thread: run as a task
    on every core of a cluster at once, one kind at a time (:func:`calibrate`).
    ``recompute``: a block evaluated strip by strip and multiplied; ``fill`` /
    ``fill_large``: a whole block of ``rows / 2`` / ``rows`` rows evaluated into fresh
    memory and kept, as the kernel cache's first pass keeps every block (new pages each
    time: kept blocks of 64 MB cost 2.5x the time of blocks evaluated into reused memory
    here); ``stored``: a kept block multiplied."""
    from threadpoolctl import threadpool_limits

    from .gram import kernel_block, pair_products, stored_pair_products
    from .kernels import make_kernel

    rng = np.random.default_rng()
    kern = make_kernel("rbf", gamma=1.0 / d)
    xi, xj = rng.standard_normal((rows, d)), rng.standard_normal((rows, d))
    zi, zj = rng.standard_normal((rows, c)), rng.standard_normal((rows, c))
    if kind == "fill":
        xi, xj = xi[: rows // 2], xj[: rows // 2]
    times, kept = [], []
    with threadpool_limits(1):
        K = kernel_block(kern, xi, xj, dtype) if kind == "stored" else None
        for _ in range(reps):
            t0 = time.perf_counter()
            if kind == "recompute":
                pair_products(kern, xi, xj, zi, zj, dtype)
            elif kind == "stored":
                stored_pair_products(K, zi, zj, dtype)
            else:
                kept.append(kernel_block(kern, xi, xj, dtype))
            times.append(time.perf_counter() - t0)
    del kept, K
    return float(np.median(times))


def _block_factors(
    client: Any, m: Machine, reps: int, rows: int | None = None
) -> dict[str, dict[str, float]]:
    """Measured over predicted time of the block tasks with every core of ``client``'s
    cluster running one of the same kind at once (:attr:`Machine.block_factors`)."""
    import dask

    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    threads = max(1, sum(int(w.get("nthreads", 1)) for w in workers))
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
    """Bytes per second of writing and reading ``chunks`` chunks of normal float64 rows
    (d = 64, :data:`ZARR_CHUNK_BYTES` each) through a zarr store in a temporary folder,
    one thread, zarr's default codec, with a BLAKE2b digest of every chunk as written and
    as read (what the pipeline's stages pay per byte: its stores record and check one)."""
    import hashlib
    import tempfile

    import zarr

    rows = ZARR_CHUNK_BYTES // (64 * 8)
    X = np.random.default_rng(0).standard_normal((rows * chunks, 64))
    w = r = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        z = zarr.create_array(f"{tmp}/x.zarr", shape=X.shape, dtype=X.dtype, chunks=(rows, 64))
        for i in range(chunks):
            t0 = time.perf_counter()
            part = X[i * rows : (i + 1) * rows]
            hashlib.blake2b(part.data, digest_size=16).digest()
            z[i * rows : (i + 1) * rows] = part
            w += time.perf_counter() - t0
        za = zarr.open_array(f"{tmp}/x.zarr", mode="r")
        for i in range(chunks):
            t0 = time.perf_counter()
            got = np.asarray(za[i * rows : (i + 1) * rows])  # fresh memory, as a task's
            hashlib.blake2b(got.data, digest_size=16).digest()
            r += time.perf_counter() - t0
            del got
    return X.nbytes / max(1e-6, w), X.nbytes / max(1e-6, r)


def calibrate(client: Any = None, *, quick: bool = False) -> Machine:
    """Measure this machine's constants (under about 30 s; ``quick``: a few seconds).

    GEMM and exp on one thread (BLAS limited to one thread), a memory copy, and, on
    ``client``'s cluster or on a LocalCluster of one worker process per core started
    (and stopped) here: the scheduler's seconds per task, the round trip of one graph,
    the client-worker bandwidth, and the block factors (the real block tasks run on
    every core at once, against what the one-thread rates predict for them). The
    network bandwidth measured on one machine is the loopback's: pass a cluster's real
    figure to :func:`estimate` (``kpca plan --network``).
    """
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
    rates = Machine(gemm_flops=gemm, exp_rate=exps, mem_bandwidth=bw)
    zw, zr = _zarr_rates(1 if quick else 3)

    def on(c: Any) -> tuple[float, float, float, dict]:
        # quick: blocks of 2 048 rows (a quarter of the work; its "fill_large" is then a
        # 16 MiB block, below the mmap threshold, and under-states a large block's fill)
        factors = _block_factors(c, rates, reps, 2048 if quick else None)
        return (*_measure_cluster(c, 500 if quick else 2000), factors)

    if client is None:
        import warnings

        from distributed import Client, LocalCluster

        from .threads import cpu_count

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
            per_task, roundtrip, net, factors = on(c)
    else:
        per_task, roundtrip, net, factors = on(client)
    cpu, simd = _cpu_model()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return Machine(
        gemm_flops=gemm,
        exp_rate=exps,
        mem_bandwidth=bw,
        task_seconds=per_task,
        roundtrip_seconds=roundtrip,
        network=net,
        block_factors=factors,
        zarr_write=zw,
        zarr_read=zr,
        cpu=cpu,
        simd=simd,
        source=(
            f"kpca calibrate on {platform.node()} at "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} (load {load:.2f})"
        ),
    )


# ------------------------------------------------------------------ cluster
@dataclass(frozen=True)
class Cluster:
    """The cluster a fit runs on: ``workers`` processes of ``threads`` threads, each with
    ``memory`` bytes; ``network`` bytes/s per node (None: the machine's)."""

    workers: int = 1
    threads: int = 1
    memory: float | None = None
    network: float | None = None
    #: False for the threaded scheduler (tasks in the client's process: no transfers).
    distributed: bool = True

    @property
    def cores(self) -> int:
        return max(1, int(self.workers) * int(self.threads))

    @classmethod
    def from_client(cls, client: Any) -> Cluster:
        info = client.scheduler_info(n_workers=-1)["workers"]
        threads = [int(w.get("nthreads", 1)) for w in info.values()] or [1]
        mem = [float(w.get("memory_limit") or 0) for w in info.values()]
        return cls(
            workers=len(threads),
            threads=max(1, round(sum(threads) / len(threads))),
            memory=min(mem) if mem and all(mem) else None,
        )

    @classmethod
    def local(cls) -> Cluster:
        """The threaded scheduler in this process."""
        import psutil

        from .threads import cpu_count

        return cls(
            workers=1,
            threads=cpu_count(),
            memory=float(psutil.virtual_memory().available),
            distributed=False,
        )


# ------------------------------------------------------------------ estimate
@dataclass
class Stage:
    name: str
    seconds: float
    bound: str
    #: seconds by resource (compute, memory bandwidth, network, scheduler, client)
    parts: dict[str, float]
    count: int = 1


@dataclass
class Estimate:
    """What :func:`estimate` predicts for one fit (per pass figures for the main pass)."""

    solver: str
    n_samples: int
    n_features: int
    block_rows: int
    n_blocks: int
    passes: int
    passes_range: tuple[int, int]
    columns: int
    tasks_per_pass: int
    block_tasks_per_pass: int
    waves_per_pass: int
    graph_bytes_per_pass: int
    kernel_evaluations_per_pass: int
    flops_per_pass: float
    bytes_to_client_per_pass: int
    bytes_from_client_per_pass: int
    worker_to_worker_bytes_per_pass: int
    storage_bytes_per_pass: int
    memory_per_worker: int
    memory_client: int
    stages: list[Stage]
    seconds: float
    bound: str
    cluster: dict
    machine: dict
    assumptions: list[str]
    #: Where an exact solver's kernel blocks come from after the first pass ("memory",
    #: "recompute", "store"; None for Nyström and dense).
    kernel_cache: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passes_range"] = list(self.passes_range)
        return d

    def summary(self) -> str:
        """A few lines for a terminal."""
        gb = 1e9
        c = self.cluster
        lines = [
            f"{self.solver} solver, n={self.n_samples}, d={self.n_features}: "
            f"{self.n_blocks} blocks of {self.block_rows} rows, {self.passes} passes "
            f"(range {self.passes_range[0]}-{self.passes_range[1]}), {self.columns} columns",
            f"cluster: {c['workers']} workers x {c['threads']} threads"
            + (f", {c['memory'] / gb:.1f} GB each" if c.get("memory") else ""),
            f"per pass: {self.tasks_per_pass} tasks ({self.block_tasks_per_pass} block "
            f"tasks, {self.waves_per_pass} waves), {self.flops_per_pass / 1e12:.3g} Tflop, "
            f"to client {self.bytes_to_client_per_pass / gb:.3g} GB, from client "
            f"{self.bytes_from_client_per_pass / gb:.3g} GB, worker to worker "
            f"{self.worker_to_worker_bytes_per_pass / gb:.3g} GB, storage "
            f"{self.storage_bytes_per_pass / gb:.3g} GB",
            f"memory: {self.memory_per_worker / gb:.3g} GB per worker, "
            f"{self.memory_client / gb:.3g} GB on the client",
        ]
        for s in self.stages:
            each = f" ({s.count} x {s.seconds / max(1, s.count):.3g} s)" if s.count > 1 else ""
            lines.append(f"  {s.name:<12} {s.seconds:10.3g} s{each}  bound: {s.bound}")
        lines.append(f"  {'total':<12} {self.seconds:10.3g} s  bound: {self.bound}")
        return "\n".join(lines)


def exact_waves(row_chunks: Any, wave_tasks: int) -> list[tuple[int, int]]:
    """The waves of one exact product: the driver's own rule
    (:func:`kpca_dask.gram.exact_waves`, imported here on use: this module loads no dask)."""
    from .gram import exact_waves as waves

    return waves(row_chunks, wave_tasks)


def _row_chunks(n: int, r: int) -> list[int]:
    return [min(r, n - a) for a in range(0, n, r)]


def _kernel_evals(chunks: list[int], itemsize: int) -> int:
    from .gram import _strip_rows

    total = sum(chunks)
    off = sum(ci * (total - s - ci) for ci, s in zip(chunks, np.cumsum([0, *chunks[:-1]])))
    diag = 0
    for r in chunks:
        step = _strip_rows(r, itemsize)
        diag += sum((min(a + step, r) - a) * (r - a) for a in range(0, r, step))
    return int(off + diag)


def _elementwise(kernel_name: str) -> float:
    """Elementwise cost of a kernel value in exp evaluations (clip + exp for rbf)."""
    return {"linear": 0.0, "cosine": 0.0, "poly": 0.5, "polynomial": 0.5}.get(kernel_name, 1.0)


def _kernel_name(plan: Any, params: dict | None) -> str:
    k = getattr(plan, "kernel", None)
    name = getattr(k, "name", None)
    if isinstance(name, str):
        return name
    kp = (params or {}).get("kernel", "rbf")
    return kp if isinstance(kp, str) else "callable"


def _eval_seconds(evals: float, d: int, elem: float, m: Machine, dtype) -> float:
    """Core-seconds the rates give for evaluating ``evals`` kernel values (distance GEMM
    and the elementwise part)."""
    g = m.gemm(dtype)
    return evals * 2 * (d + 2) / (g * _eff_inner(d)) + evals * elem / m.exp(dtype)


def _stored_seconds(evals: float, c: int, m: Machine, dtype) -> float:
    """Core-seconds the rates give for multiplying ``evals`` kept kernel values by two
    ``c``-column blocks (GEMM or memory bound, whichever is slower)."""
    g = m.gemm(dtype)
    return max(
        evals * 4 * c / (g * _eff_skinny(c)), evals * np.dtype(dtype).itemsize / m.mem_bandwidth
    )


def embed_seconds(
    rows: float, cols: float, d: int, k: int, m: Machine, dtype: Any, cores: int
) -> float:
    """Seconds to embed ``rows`` rows against ``cols`` kernel columns (training rows or
    landmarks) on ``cores`` cores: the kernel values and their product with the ``cols x k``
    projection, at the machine's block-task rate."""
    g = m.gemm(dtype)
    per_value = _eval_seconds(1.0, d, 1.0, m, dtype) + 2 * k / (g * _eff_skinny(k))
    return rows * cols * per_value * m.factor("recompute", dtype) / max(1, cores)


def _recompute_seconds(evals: float, d: int, c: int, elem: float, m: Machine, dtype) -> float:
    """Core-seconds the rates give for evaluating ``evals`` kernel values and multiplying
    them by two ``c``-column blocks (a recomputed block task)."""
    g = m.gemm(dtype)
    return _eval_seconds(evals, d, elem, m, dtype) + evals * 4 * c / (g * _eff_skinny(c))


def _pass_compute(evals: float, d: int, c: int, elem: float, m: Machine, dtype, cores: int):
    """Seconds of one exact pass's block tasks on ``cores`` cores (recompute tier)."""
    return (
        _recompute_seconds(evals, d, c, elem, m, dtype) * m.factor("recompute", dtype) / cores
    )


def _auto_cache(
    chunks: list[int], item: int, cl: Cluster, passes: int | None, notes: list[str]
) -> str:
    """The kernel cache tier the estimator's ``kernel_cache="auto"`` picks (the rule of
    :meth:`kpca_dask.gram.BlockKernelMatrix.plan_cache`, with the memory the workers
    already use taken as none)."""
    from .gram import CACHE_MEMORY_FRACTION, upper_block_bytes

    upper = upper_block_bytes(chunks, item)
    if cl.memory is None or (passes is not None and passes <= 1):
        return "recompute"
    budget = CACHE_MEMORY_FRACTION * float(cl.memory) * max(1, cl.workers)
    if upper <= budget:
        notes.append(
            f"kernel cache 'auto': the upper blocks ({upper / 2**30:.2f} GiB) fit half of the "
            "workers' memory: kept after pass 1"
        )
        return "memory"
    return "recompute"


def estimate(
    plan: Any,
    cluster: Cluster | None = None,
    machine: Machine | None = None,
    *,
    n_components: int | None = None,
    n_oversamples: int = 16,
    passes: int | None = None,
    kernel_cache: str = "auto",
    params: dict | None = None,
    input_in_memory: bool = True,
    persist: bool | None = None,
) -> Estimate:
    """Predict the cost of the fit ``plan`` describes (see the module docstring).

    ``n_components`` and ``n_oversamples`` set the block width ``c = k + oversamples``;
    ``passes`` overrides the expected number of passes; ``kernel_cache``: "recompute"
    (evaluate every block at every pass), "memory" (cached after the first pass),
    "store" (read from a kernel store at the machine's storage bandwidth) or "auto"
    (the estimator's rule, :meth:`kpca_dask.gram.BlockKernelMatrix.plan_cache`:
    "memory" when the upper blocks fit half of the workers' memory and the fit makes
    more than one pass; the cluster's ``memory`` unknown: "recompute").
    ``input_in_memory``: numpy rows on the client (sent to the workers once); False:
    a dask/zarr source the workers read (Nyström re-reads it at every pass above
    256 MB, as :meth:`FitPlan.persists` decides; ``persist`` overrides: the pipeline
    reads the rows into the workers' memory when they fit).
    """
    cl = cluster or Cluster()
    m = machine or Machine()
    net = float(cl.network or m.network)
    n, d = int(plan.n_samples), int(plan.n_features)
    r = int(plan.block_rows)
    dtype = np.dtype(plan.dtype)
    item = dtype.itemsize
    k = int(n_components or min(n, 8))
    c = min(n, k + int(n_oversamples))
    elem = _elementwise(_kernel_name(plan, params))
    W = max(1, cl.workers)
    cores = cl.cores
    remote = 1.0 - 1.0 / W if cl.distributed else 0.0
    assumptions: list[str] = []
    stages: list[Stage] = []
    chunks = _row_chunks(n, r)
    nb = len(chunks)
    rt = m.roundtrip_seconds if cl.distributed else 0.0
    ts = m.task_seconds if cl.distributed else 5e-5  # the threaded scheduler's own cost
    client_bw = m.mem_bandwidth  # the driver's one thread

    def stage(name: str, parts: dict[str, float], count: int = 1, serial: str = "client"):
        # network and storage overlap the tasks; the scheduler's time adds to the
        # compute (with dask's queuing a worker thread gets its next task when it
        # reports one finished: measured here, passes of 75 tasks took compute plus
        # the scheduler's time, not the larger of the two); the client's serial work
        # between passes adds to everything
        busy = parts.get("compute", 0.0) + parts.get("scheduler", 0.0)
        rest = [v for k_, v in parts.items() if k_ not in (serial, "compute", "scheduler")]
        sec = max([busy, *rest]) + parts.get(serial, 0.0)
        bound = max(parts, key=parts.get) if parts else serial
        stages.append(
            Stage(name, sec * count, bound, {k_: v * count for k_, v in parts.items()}, count)
        )

    # reading the input once (persist / rechunk): from the client (numpy input: through
    # its network link) or by the workers from storage
    x_bytes = n * d * 8
    solver = plan.solver
    from_storage = not input_in_memory
    if persist is not None:
        persisted = bool(persist)
    elif from_storage and solver == "nystroem":
        persisted = x_bytes <= (256 << 20)
    else:
        persisted = True
    read = {
        "network": (x_bytes / net) if cl.distributed and not from_storage else 0.0,
        # a zarr source: the storage's bandwidth, or decoding on the cores, the slower
        "storage": (
            max(x_bytes / (m.storage * W), x_bytes / (m.zarr_read * cores))
            if from_storage
            else 0.0
        ),
        "scheduler": 3 * rt + nb * ts,
    }
    if solver != "nystroem":  # the training rows come to the client after the solve
        read["client"] = x_bytes / net if cl.distributed else x_bytes / client_bw
    if not persisted:
        read = {"scheduler": rt}
        assumptions.append("rows re-read from storage at every pass (above 256 MB)")
    mem_worker = 0.0
    mem_client = float(x_bytes)  # X_fit kept on the client (training rows)
    if solver == "nystroem":
        mp = int(plan.n_landmarks or min(n, 2048))
        from .solvers.nystroem import SPLIT_EVERY, choose_method

        method = (params or {}).get("nystroem_method", "auto")
        if method == "auto":
            method = choose_method(mp, d, k, c)
        p_exp = 1 if method == "covariance" else EXPECTED_PASSES["nystroem"]
        p = int(passes or p_exp)
        p_range = (1, 1) if method == "covariance" else (3, int(plan.max_passes) + 1)
        fused = nb // SPLIT_EVERY >= 2 * cores
        leaves = math.ceil(nb / SPLIT_EVERY) if fused else nb
        sums, lv, first = 0, leaves, True
        while lv > 1 or (first and not fused):
            lv = math.ceil(lv / SPLIT_EVERY)
            sums += lv
            first = False
        tasks = leaves + sums
        acc_cols = mp if method == "covariance" else c
        part = mp * acc_cols * 8 + mp * 8
        evals = n * mp
        flops = evals * 2 * (d + 2) + (n * mp * mp if method == "covariance" else evals * 4 * c)
        g = m.gemm(dtype)
        t_comp = (
            (
                evals * 2 * (d + 2) / (g * _eff_inner(d))
                + (
                    n * mp * mp / g
                    if method == "covariance"
                    else evals * 4 * c / (g * _eff_skinny(c))
                )
                + evals * elem / m.exp(dtype)
            )
            * m.factor("recompute", dtype)
            / cores
        )
        storage = 0 if persisted else x_bytes
        w2w = int(remote * (leaves + sums - 1) * part)
        consts = mp * d * 8 + mp * c * 8
        to_client = part
        from_client = consts
        parts = {
            "compute": t_comp,
            "scheduler": tasks * ts + rt,
            "network": (w2w / W + consts * W + to_client) / net if cl.distributed else 0.0,
            "storage": storage / (m.storage * W),
            "client": (4 * mp * c * c) / g,
        }
        s_land = min(n, max(20000, 5 * mp))
        lm_parts = {
            "compute": 0.0,
            "client": (s_land * mp * (2 * (d + 2) + 2 * mp)) / m.gemm("float64")
            + 4 * mp**3 / (m.gemm("float64") * EIGH_EFFICIENCY),
            "scheduler": 3 * rt,
            "network": s_land * d * 8 / net if cl.distributed else 0.0,
        }
        stage("read", read)
        stage("landmarks", lm_parts)
        stage("passes", parts, count=p)
        if method == "covariance":
            # the finish on the client: the m x m covariance's eigendecomposition and the
            # statistics kept for updates (measured at m = 2048: 2.3 s of client time)
            g64 = m.gemm("float64")
            stage("finish", {"client": 4 * mp**3 / (g64 * EIGH_EFFICIENCY) + 4 * mp**3 / g64})
        mem_worker = (x_bytes / W if persisted else 0) + cl.threads * (
            r * d * 8 + min(r, 8192) * mp * item + SPLIT_EVERY * part
        )
        # the landmark sample, RPCholesky's s x m factor, the m x m matrices
        mem_client = float(s_land * d * 8 + s_land * mp * 8 + 5 * mp * mp * 8)
        block_tasks, waves = leaves, 1
        graph_bytes = tasks * TASK_GRAPH_BYTES + consts
        assumptions.append(f"Nyström {method} method, {mp} landmarks")
    elif solver == "dense":
        evals = n * (n + r) // 2
        p, p_range = 1, (1, 1)
        block_tasks = nb * (nb + 1) // 2
        tasks = block_tasks
        waves = 1
        flops = evals * 2 * (d + 2)
        to_client = n * n * item // 2 + n * r * item // 2
        from_client = 0
        w2w = int(remote * block_tasks * 2 * r * d * 8)
        storage = 0
        g = m.gemm(dtype)
        t_comp = _eval_seconds(evals, d, elem, m, dtype) * m.factor("fill", dtype) / cores
        eig = (4 / 3 * n**3 + 2 * n**2 * k) / (m.gemm("float64") * EIGH_EFFICIENCY)
        local_cores = Cluster.local().cores if not cl.distributed else 1
        parts = {
            "compute": t_comp,
            "scheduler": tasks * ts + rt,
            "network": to_client / net if cl.distributed else 0.0,
            "client": eig / max(1, local_cores) + 3 * n * n * 8 / client_bw,
        }
        stage("read", read)
        stage("kernel+eigh", parts)
        mem_worker = x_bytes / W + cl.threads * (r * r * item + 2 * r * d * 8)
        mem_client += 3 * n * n * 8
        graph_bytes = tasks * TASK_GRAPH_BYTES
    else:  # randomized (and arpack, priced as block passes of one column)
        if kernel_cache == "auto":
            kernel_cache = _auto_cache(chunks, item, cl, passes, assumptions)
        if solver == "arpack":
            c = 1
            assumptions.append("ARPACK priced as single-column passes (about 2k+1 of them)")
        p_exp = EXPECTED_PASSES.get(solver, 10)
        if plan.power_iter != "auto" and solver == "randomized":
            p_exp = int(plan.power_iter) + 2
        if solver == "arpack":
            p_exp = 2 * k + 1 + (passes or 0)
        p = int(passes or p_exp)
        p_range = (2, int(plan.max_passes) + 1) if solver == "randomized" else (k, 20 * k)
        threads = cl.cores if cl.distributed else 1
        wave_tasks = max(128, 4 * threads)
        wv = (
            exact_waves(chunks, wave_tasks)
            if cl.distributed
            else [(i, i + 1) for i in range(nb)]
        )
        offsets = np.concatenate([[0], np.cumsum(chunks)])
        block_tasks = nb * (nb + 1) // 2
        sum_tasks = sum(nb - s for s, _ in wv)
        if cl.distributed:
            # each wave after the first adds its sums to the previous accumulator on the
            # workers (one task per row block from its first on); Z persisted (nb tasks),
            # and X's row blocks for the pass when they are not in memory already and the
            # blocks are evaluated (nb more); only final row blocks come to the client,
            # each once
            acc_tasks = sum(nb - s for s, _ in wv[1:])
            x_tasks = nb if not persisted and kernel_cache not in ("memory", "store") else 0
            tasks = block_tasks + sum_tasks + acc_tasks + nb + x_tasks
            rows_back = n
        else:
            tasks = block_tasks + sum_tasks
            rows_back = int(sum(n - offsets[s] for s, _ in wv))
        waves = len(wv)
        evals = _kernel_evals(chunks, item)
        flops = float(evals) * (2 * (d + 2) + 4 * c)
        to_client = rows_back * c * 8
        from_client = n * c * item
        # partials to their sum tasks, X and Z blocks to the block tasks (each task needs
        # two row blocks; a worker fetches a row block once per pass at most)
        partials = (2 * block_tasks - nb) * r * c * item
        inputs = min(2 * block_tasks, W * nb) * r * (d * 8 + c * item)
        w2w = int(remote * (partials + inputs))
        if kernel_cache == "store":
            storage = evals * item
            assumptions.append("kernel blocks read from a kernel store at every pass")
        else:
            storage = 0
        # tasks of similar size over the cores: the last round is as long as a full one
        rounds = block_tasks / cores
        imbalance = math.ceil(rounds) / rounds if rounds > 0 else 1.0
        t_comp = _pass_compute(evals, d, c, elem, m, dtype, cores) * imbalance
        if kernel_cache in ("memory", "store"):
            t_comp_later = (
                _stored_seconds(evals, c, m, dtype)
                * m.factor("stored", dtype)
                / cores
                * imbalance
            )
        else:
            t_comp_later = t_comp
        if kernel_cache == "memory":
            # the first pass evaluates every block whole into fresh memory, then
            # multiplies the kept blocks as every later pass does
            t_comp = (
                _eval_seconds(evals, d, elem, m, dtype)
                * m.factor("fill", dtype)
                / cores
                * imbalance
                + t_comp_later
            )
        basis = min(c * (p + 1), max(512, min(2048, (128 << 20) // (8 * max(1, n)))) + c)
        g64 = m.gemm("float64")
        # the driver per pass: two projections against the basis, CholQR, Rayleigh-Ritz,
        # adding each wave's partial sums (memory bound) -- one BLAS thread
        client_per_pass = (
            (4 * n * basis * c + 4 * n * c * c) / (g64 * _eff_skinny(c))
            + (rows_back * c * 8 * 2 + 4 * n * c * 8) / client_bw
            + 20 * basis**3 / g64
        )

        def pass_parts(t_c: float) -> dict[str, float]:
            return {
                "compute": t_c,
                "memory bandwidth": 0.0,
                "scheduler": tasks * ts + (waves + 1) * rt,
                "network": max(to_client, w2w / W) / net if cl.distributed else 0.0,
                "storage": storage / (m.storage * W),
                "client": client_per_pass,
            }

        stage("read", read)
        stage("first pass", pass_parts(t_comp))
        if p > 1:
            stage("passes", pass_parts(t_comp_later), count=p - 1)
        strip = 4 << 20
        per_task = 2 * r * d * 8 + 2 * r * c * item + strip + 2 * r * c * 8
        wave_partials = min(block_tasks, 2 * wave_tasks) * 2 * r * c * item
        mem_worker = (
            x_bytes / W + nb * r * c * item / W + cl.threads * per_task + wave_partials / W
        )
        if kernel_cache == "memory":
            mem_worker += evals * item / W
            assumptions.append("kernel blocks cached in the workers' memory after pass 1")
        mem_client += 8 * n * (basis + 4 * c) + 2 * max((n - offsets[s]) * c * 8 for s, _ in wv)
        graph_bytes = tasks * TASK_GRAPH_BYTES + from_client
    total = sum(s.seconds for s in stages)
    main = max(stages, key=lambda s: s.seconds)
    assumptions.append(
        f"{p} passes ({'measured' if passes else 'expected; the spectrum decides'})"
    )
    return Estimate(
        solver=solver,
        n_samples=n,
        n_features=d,
        block_rows=r,
        n_blocks=nb,
        passes=p,
        passes_range=tuple(p_range),
        columns=c,
        tasks_per_pass=int(tasks),
        block_tasks_per_pass=int(block_tasks),
        waves_per_pass=int(waves),
        graph_bytes_per_pass=int(graph_bytes),
        kernel_evaluations_per_pass=int(evals),
        flops_per_pass=float(flops),
        bytes_to_client_per_pass=int(to_client),
        bytes_from_client_per_pass=int(from_client),
        worker_to_worker_bytes_per_pass=int(w2w),
        storage_bytes_per_pass=int(storage),
        memory_per_worker=int(mem_worker),
        memory_client=int(mem_client),
        stages=stages,
        seconds=float(total),
        bound=main.bound,
        cluster=asdict(cl),
        machine=m.to_dict(),
        assumptions=assumptions,
        kernel_cache=kernel_cache if solver in ("randomized", "arpack") else None,
    )


# ------------------------------------------------------------------ execution choice
@dataclass(frozen=True)
class Execution:
    """Where a fit (or transform) runs: "cluster" (the active scheduler) or "local
    threads" (dask's threaded scheduler in this process), and why."""

    where: str
    reason: str

    @contextlib.contextmanager
    def scheduler(self) -> Iterator[None]:
        if self.where != "local threads":
            yield
            return
        import dask

        with dask.config.set(scheduler="threads"):
            yield


#: dask config key forcing the choice: "auto" (default), "local" or "cluster".
EXECUTION_CONFIG = "kpca.execution"

_ROUNDTRIP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _client_roundtrip(client: Any, machine: Machine) -> float:
    """The round trip of a one-task graph on ``client``'s cluster, measured once per
    client (three trivial graphs, the median; ~tens of ms)."""
    try:
        return _ROUNDTRIP[client]
    except (KeyError, TypeError):
        pass
    import dask

    times = []
    try:
        for i in range(3):
            t0 = time.perf_counter()
            client.compute(dask.delayed(_noop)(i, dask_key_name=f"kpca-ping-{i}"), sync=True)
            times.append(time.perf_counter() - t0)
        value = float(np.median(times))
    except Exception:  # a client that cannot run a task: price it with the constant
        value = machine.roundtrip_seconds
    with contextlib.suppress(TypeError):
        _ROUNDTRIP[client] = value
    return value


def _active_client() -> Any:
    from .gram import _scheduler_kind

    kind, client = _scheduler_kind()
    return client if kind == "distributed" else None


def _round_trips(plan: Any, passes: int) -> int:
    """Graphs a fit submits (each a round trip): finite check, rechunk/persist, trace,
    gather of X, plus the solver's own."""
    base = 4
    if plan.solver == "dense":
        return base + 1
    if plan.solver == "nystroem":
        return base + 3 + passes
    return base + 2 * passes  # Z persisted, then at least one wave per pass


def choose_execution(
    plan: Any, params: dict | None = None, *, rows: int | None = None, what: str = "fit"
) -> Execution:
    """Run on the client's threads when a distributed client is active and the cluster's
    overhead for this fit (its measured round trips and per-task cost, and moving X and
    the results) exceeds the compute time its extra cores would save (the cost model's
    prediction); else on the active scheduler. ``rows``: a transform of that many rows
    (each against ``plan.n_samples`` training rows, or the landmarks). The dask config
    key ``kpca.execution`` ("local" or "cluster") forces it."""
    import dask

    forced = dask.config.get(EXECUTION_CONFIG, "auto")
    client = _active_client()
    if client is None:
        return Execution("scheduler", "the active dask scheduler (no distributed client)")
    if forced == "cluster":
        return Execution("cluster", f"cluster (forced: {EXECUTION_CONFIG}='cluster')")
    if forced == "local":
        return Execution("local threads", f"local threads (forced: {EXECUTION_CONFIG}='local')")
    try:
        machine = load_machine()
        cl = Cluster.from_client(client)
        local = Cluster.local()
        n = int(plan.n_samples)
        if what == "fit":
            est_c = estimate(plan, cl, machine, params=params, **_est_kwargs(params))
            compute = sum(s.parts.get("compute", 0.0) for s in est_c.stages)
            passes = est_c.passes
            tasks = est_c.tasks_per_pass * max(1, passes)
            moved = est_c.bytes_to_client_per_pass * passes + 2 * n * plan.n_features * 8
            mem_local = est_c.memory_client + est_c.memory_per_worker * cl.workers
            trips = _round_trips(plan, passes)
        else:
            cols = int(plan.n_landmarks or n) if plan.solver == "nystroem" else n
            d = int(plan.n_features)
            g = machine.gemm(plan.dtype)
            work = (
                rows * cols * (2 * (d + 2) / (g * _eff_inner(d)) + 1 / machine.exp(plan.dtype))
            )
            compute = work / cl.cores
            tasks = math.ceil(rows / max(1, plan.block_rows))
            moved = rows * d * 8 * 2 + cols * d * 8
            mem_local = rows * 8 * 64 + cols * d * 8
            trips = 1
        roundtrip = _client_roundtrip(client, machine)
        overhead = trips * roundtrip + tasks * machine.task_seconds + moved / machine.network
        local_compute = compute * cl.cores / max(1, local.cores)
        saved = local_compute - compute
        if overhead > saved and mem_local < 0.25 * (local.memory or 0):
            return Execution(
                "local threads",
                f"local threads (n={n}{'' if rows is None else f', {rows} rows'}: cluster "
                f"overhead {overhead:.2g} s > compute saved {max(saved, 0):.2g} s of "
                f"{local_compute:.2g} s)",
            )
        return Execution(
            "cluster",
            f"cluster (n={n}: compute {compute:.2g} s on {cl.cores} threads saves "
            f"{saved:.2g} s against overhead {overhead:.2g} s)",
        )
    except Exception as exc:  # the model must never stop a fit: run as before
        return Execution("cluster", f"cluster (execution not modelled: {exc})")


def _est_kwargs(params: dict | None) -> dict[str, Any]:
    if not params:
        return {}
    return {
        "n_components": params.get("n_components"),
        "n_oversamples": int(params.get("n_oversamples", 16)),
    }


__all__ += ["EXECUTION_CONFIG", "Stage", "default_calibration_path"]


def fit_execution(est: Any, X: Any, **fit_kw: Any) -> Execution:
    """:func:`choose_execution` for ``est.fit(X, **fit_kw)``; never raises (a bad input is
    the fit's to refuse, with its own message)."""
    if _active_client() is None:
        return Execution("scheduler", "the active dask scheduler (no distributed client)")
    try:
        params = est.get_params(deep=False)
        plan = est.plan(
            X,
            kernel_blocks=fit_kw.get("kernel_blocks"),
            centring=fit_kw.get("centring"),
            kernel=False,
        )
    except Exception:
        return Execution("cluster", "cluster (the fit's input could not be planned)")
    return choose_execution(plan, params)


def transform_execution(est: Any, rows: int) -> Execution:
    """:func:`choose_execution` for embedding ``rows`` in-memory rows with a fitted ``est``."""
    if _active_client() is None:
        return Execution("scheduler", "the active dask scheduler (no distributed client)")
    from types import SimpleNamespace

    plan = SimpleNamespace(
        n_samples=int(est.n_samples_fit_),
        n_features=int(est.n_features_in_),
        solver=est.eigen_solver_,
        n_landmarks=getattr(est, "n_landmarks_", None),
        block_rows=int(est.chunk_size_),
        dtype=est.dtype_,
    )
    return choose_execution(plan, rows=rows, what="transform")


__all__ += ["fit_execution", "transform_execution"]


def cluster_threads() -> int:
    """Threads of the active distributed cluster, else this machine's cores (what the
    block rule and the exact product's waves are sized by)."""
    from .gram import _cluster_threads

    return _cluster_threads()


__all__ += ["cluster_threads"]
