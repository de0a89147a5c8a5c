"""Out-of-core pipeline benchmark: the whole `kpca run` job, measured from outside.

Runs the real command line (`python -m flows.cli run CONFIG`) on generated data
and samples the whole process tree (client, scheduler, worker processes) every
0.25 s: peak memory is the highest sum of proportional set sizes (PSS: shared
pages counted once), I/O is the sum of the processes' own storage-level bytes read
and written (/proc/<pid>/io read_bytes/write_bytes, less what reaped children
added) plus the bytes moved through read()/write() calls (rchar/wchar, which
include page-cache hits and the sockets between Dask processes, but not reads
of memory-mapped files such as stored kernel blocks).

    python benchmarks/bench_pipeline.py exact                # n = 100k, d = 32, K recomputed
    python benchmarks/bench_pipeline.py store                # n = 100k, d = 1024, K in zarr
    python benchmarks/bench_pipeline.py nystroem             # n = 2M, d = 64
    python benchmarks/bench_pipeline.py exact --n 20000      # smaller, quicker

nystroem also fits the estimator on the same rows in the same run (``--no-estimator``:
not): ``KernelPCA(eigen_solver="nystroem")`` with the pipeline's resolved gamma, 2048
rpcholesky landmarks, float32, dask's threaded scheduler, reading the pipeline's own
ingest store (zarr) and writing the embedding to zarr, in a fresh process sampled the
same way: fit + embedding against the whole ``kpca run``.

Data: Gaussian blobs (16 centres) in d dimensions written as one NPY file,
rbf kernel with gamma = 'scale' (median heuristic), 16 components, float32.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

HERE = Path(__file__).resolve().parent
CASES = {
    "exact": {"n": 100_000, "d": 32, "solver": "randomized", "materialize": "never"},
    "store": {"n": 100_000, "d": 1024, "solver": "randomized", "materialize": "always"},
    "nystroem": {"n": 2_000_000, "d": 64, "solver": "nystroem", "materialize": "never"},
}


def make_data(path: Path, n: int, d: int, seed: int = 0) -> None:
    """Blobs written in slabs through a memmap (never the whole array in memory)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((16, d)) * 2.0
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    step = 100_000
    for a in range(0, n, step):
        b = min(n, a + step)
        out[a:b] = centres[rng.integers(0, 16, b - a)] + rng.standard_normal((b - a, d))
    out.flush()
    del out


class TreeSampler(threading.Thread):
    """Peak PSS and cumulative I/O of a process and all its descendants."""

    def __init__(self, pid: int, interval: float = 0.25):
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.peak_parts: dict[str, int] = {}  # role -> PSS at the moment of the total peak
        self.role_peak: dict[str, int] = {}  # role -> its own highest PSS
        self.io: dict[int, tuple[int, ...]] = {}  # pid -> its latest /proc/<pid>/io counters
        self.own: dict[int, tuple[int, ...]] = {}  # pid -> those minus its reaped children's
        self.parent: dict[int, int] = {}
        self.gone: set[int] = set()
        self.roles: dict[int, str] = {}
        self.cpu: dict[int, float] = {}  # pid -> its own user + system CPU seconds (latest)
        self.timeline: list | None = None  # (seconds, {role: PSS}) when asked for
        self.t0 = time.perf_counter()
        self.stop = threading.Event()

    def sample(self) -> None:
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        total = 0
        parts: dict[str, int] = {}
        for p in procs:
            try:
                mem = p.memory_full_info()
                pss = getattr(mem, "pss", mem.rss)
                total += pss
                role = self.roles.get(p.pid) or self._role(p)
                self.roles[p.pid] = role
                parts[role] = parts.get(role, 0) + pss
                ct = p.cpu_times()
                self.cpu[p.pid] = ct.user + ct.system
                io = p.io_counters()
                self.io[p.pid] = (io.read_bytes, io.write_bytes, io.read_chars, io.write_chars)
                self.parent.setdefault(p.pid, p.ppid())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        self._own_io({p.pid for p in procs})
        for role, b in parts.items():
            self.role_peak[role] = max(self.role_peak.get(role, 0), b)
        if self.timeline is not None:
            self.timeline.append((time.perf_counter() - self.t0, parts))
        if total > self.peak:
            self.peak, self.peak_parts = total, parts

    def _own_io(self, alive: set[int]) -> None:
        """Each process's own I/O. Linux adds a child's counters to its parent's when
        the parent reaps it (worker -> nanny -> `kpca run`), so summing the latest
        counters of every process counted the workers' I/O twice; a reaped child's
        last sample is subtracted from its parent's counters instead."""
        self.gone |= set(self.io) - alive
        for pid in alive & set(self.io):
            reaped = [
                self.io[c] for c, par in self.parent.items() if par == pid and c in self.gone
            ]
            self.own[pid] = tuple(
                v - sum(r[i] for r in reaped) for i, v in enumerate(self.io[pid])
            )

    def _role(self, p: psutil.Process) -> str:
        """client (the `kpca run` process, with the scheduler), workers, or other."""
        if p.pid == self.root.pid:
            return "client+scheduler"
        cmd = " ".join(p.cmdline())
        if "multiprocessing" in cmd or "distributed" in cmd:
            return "workers"
        if "prefect" in cmd or "uvicorn" in cmd:
            return "prefect-server"
        return "other"

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)

    def cpu_seconds(self) -> float:
        """CPU seconds of the whole tree (as last sampled): a comparison that a machine
        shared with other jobs distorts far less than wall time."""
        return float(sum(self.cpu.values()))

    def totals(self) -> dict[str, int]:
        cols = list(zip(*self.own.values())) or [(0,)] * 4
        return {
            "read_bytes": sum(cols[0]),
            "write_bytes": sum(cols[1]),
            "read_chars": sum(cols[2]),
            "write_chars": sum(cols[3]),
        }


def cpu_model() -> str:
    """The CPU's model name and SIMD level (OPENBLAS_CORETYPE named when it is set)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = info.get("Flags", "")
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    core = os.environ.get("OPENBLAS_CORETYPE")
    return (
        f"{info.get('Model name', 'unknown').strip()} ({simd}"
        f"{f', OPENBLAS_CORETYPE={core}' if core else ''})"
    )


def estimator_child(store: str, gamma: float, out: str) -> None:
    """The estimator on the pipeline's ingested rows: fit, then the embedding to zarr."""
    import dask.array as da
    import zarr

    from kpca_dask import KernelPCA

    X = zarr.open_group(store, mode="r")["X"]
    da.ones(4, chunks=2).sum().compute()  # dask's thread pool started before the clock
    t0 = time.perf_counter()
    est = KernelPCA(
        16,
        kernel="rbf",
        gamma=gamma,
        eigen_solver="nystroem",
        n_landmarks=2048,
        landmark_method="rpcholesky",
        random_state=0,
        dtype="float32",
    )
    emb = est.fit_transform(X)  # lazy past the fit
    fit_s = time.perf_counter() - t0
    da.to_zarr(emb, out, overwrite=True)
    print(
        json.dumps(
            {
                "fit_seconds": fit_s,
                "total_seconds": time.perf_counter() - t0,
                "n_passes": est.n_passes_,
                "chunk_size": est.chunk_size_,
                "eigenvalues": est.eigenvalues_.tolist(),
            }
        )
    )


def run_estimator(root: Path, out: Path, gamma: float) -> dict:
    """:func:`estimator_child` in a fresh process, its memory and I/O sampled."""
    cmd = [
        sys.executable,
        __file__,
        "--estimator-child",
        str(out / "work" / "ingest.zarr"),
        repr(gamma),
        str(root / "estimator-embedding.zarr"),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=HERE.parent, stdout=subprocess.PIPE, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    text = proc.stdout.read()
    proc.wait()
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"the estimator run failed with exit code {proc.returncode}")
    res = json.loads(text.strip().splitlines()[-1])
    return {
        **res,
        "wall_seconds": time.perf_counter() - t0,
        "peak_memory_gib": sampler.peak / 2**30,
        "io": sampler.totals(),
        "cpu_seconds": sampler.cpu_seconds(),
    }


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def roofline(
    n: int,
    d: int,
    solve_s: float,
    model: dict,
    block_rows: int | None,
    oversamples: int | None = None,
) -> dict:
    """The GEMM + exp roofline of the solve's passes, measured now in a fresh process
    (bench_exact.py's: float32 GEMM on every core, exp per thread times the cores).

    Each pass evaluates the n(n + r)/2 entries of the upper kernel blocks (a
    2d-flop distance GEMM and one exp per entry; r the block rows) and multiplies
    every off-diagonal block twice (K_ij Z_j, K_ij^T Z_i): 2 n^2 c flops for a block of
    c columns: l = k + n_oversamples for the iteration passes, k for the
    certification pass. The trace (the kernel's diagonal) and driver algebra are not
    counted: they are part of what the ratio measures.
    """
    out = subprocess.run(
        [sys.executable, str(HERE / "bench_exact.py"), "--child", "roofline"],
        check=True,
        capture_output=True,
        text=True,
    )
    roof = json.loads(out.stdout.strip().splitlines()[-1])
    if oversamples is None:  # the pipeline's default (the run sets no other)
        from pipeline.config import SolverConfig

        oversamples = int(SolverConfig.model_fields["n_oversamples"].default)
    passes = int(model["n_passes"])
    k = 16
    r = int(block_rows or 2048)
    entries = n * (n + r) / 2
    cols = [k + oversamples] * (passes - 1) + [k]
    gemm = sum(entries * 2 * d + 2 * n * n * c for c in cols)
    exp = passes * entries
    gemm_s = gemm / roof["gemm_flops"]
    exp_s = exp / (roof["exp_per_s_per_thread"] * roof["threads"])
    return {
        "passes": passes,
        "solve_seconds": solve_s,
        "roofline_seconds": gemm_s + exp_s,
        "gemm_seconds": gemm_s,
        "exp_seconds": exp_s,
        "gemm_gflops": roof["gemm_flops"] / 1e9,
        "exp_per_s": roof["exp_per_s_per_thread"] * roof["threads"],
        "threads": roof["threads"],
        "ratio": solve_s / (gemm_s + exp_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--n", type=int)
    ap.add_argument("--d", type=int)
    ap.add_argument("--workdir", help="where data and outputs go (default: a temp dir)")
    ap.add_argument("--memory-limit", default="auto", help="per worker, e.g. 1.5GiB")
    ap.add_argument("--block-rows", default="auto", help="chunks.block_rows (default auto)")
    ap.add_argument("--keep", action="store_true", help="keep data and outputs")
    ap.add_argument(
        "--timeline",
        help="write the sampled memory by role over time to this "
        "JSON file, and the run's log next to it (where the peak comes from)",
    )
    ap.add_argument(
        "--no-estimator",
        action="store_true",
        help="nystroem: do not also run the estimator on the same rows",
    )
    args = ap.parse_args()
    case = dict(CASES[args.case])
    n = args.n or case["n"]
    d = args.d or case["d"]
    root = Path(args.workdir or tempfile.mkdtemp(prefix="kpca-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / f"blobs-{n}x{d}.npy"
    if not data.exists():
        t = time.perf_counter()
        make_data(data, n, d)
        print(
            f"data: {data} ({data.stat().st_size / 1e9:.2f} GB) "
            f"in {time.perf_counter() - t:.0f} s"
        )
    out = root / f"out-{args.case}-{n}"
    if out.exists():  # a fresh run: the flow would reuse a kept run's cached stages
        import shutil

        shutil.rmtree(out)
    cfg = root / f"{args.case}.yaml"
    cfg.write_text(
        f"input:\n  path: {data}\n"
        "kernel:\n  name: rbf\n  gamma: scale\n"
        f"solver:\n  n_components: 16\n  eigen_solver: {case['solver']}\n  dtype: float32\n"
        f"  random_state: 0\n"
        f"kernel_store:\n  materialize: {case['materialize']}\n"
        f"chunks:\n  block_rows: {args.block_rows}\n"
        f"output:\n  path: {out}\n  overwrite: true\n  parquet: false\n"
        f"cluster:\n  n_workers: {psutil.cpu_count()}\n  memory_limit: {args.memory_limit}\n"
    )
    cmd = [sys.executable, "-m", "flows.cli", "run", str(cfg), "--no-progress"]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = TreeSampler(proc.pid)
    if args.timeline:
        sampler.timeline = []
    sampler.start()
    log = proc.stdout.read()
    proc.wait()
    sampler.stop.set()
    sampler.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(log)
        raise SystemExit(f"run failed with exit code {proc.returncode}")
    if args.timeline:
        Path(args.timeline).write_text(
            json.dumps(
                [
                    {"t": round(t, 2), **{k: round(v / 2**30, 3) for k, v in parts.items()}}
                    for t, parts in sampler.timeline
                ]
            )
        )
        Path(args.timeline).with_suffix(".log").write_text(log)
    manifest = json.loads((out / "manifest.json").read_text())
    io = sampler.totals()
    result = {
        "case": args.case,
        "n": n,
        "d": d,
        "date": datetime.date.today().isoformat(),
        "machine": (
            f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"
        ),
        "wall_seconds": wall,
        "cpu_seconds": sampler.cpu_seconds(),
        "peak_memory_gib": sampler.peak / 2**30,
        "peak_memory_parts_gib": {k: v / 2**30 for k, v in sampler.peak_parts.items()},
        "peak_memory_by_role_gib": {k: v / 2**30 for k, v in sampler.role_peak.items()},
        "stage_seconds": manifest["timings"],
        "model": {
            k: manifest["model"].get(k)
            for k in (
                "solver",
                "n_passes",
                "max_residual",
                "block_rows",
                "rows_in_memory",
                "gamma",
            )
        },
        "kernel_store": manifest.get("kernel_store"),
        # the cost model's prediction of the solve beside what it took (kpca_dask.cost)
        "cost_model": {
            k: (manifest.get("cost_model") or {}).get(k)
            for k in ("measured", "predicted_at_measured_passes", "measured_over_predicted")
        },
        "io": io,
        "output_bytes": du(out),
        "kernel_store_bytes": du(out / "work" / "kernel.zarr"),
        "data_bytes": data.stat().st_size,
        "ingest_store_bytes": du(out / "work" / "ingest.zarr"),
        "cpu": cpu_model(),
        "load_before": list(load_before),
    }
    # the whole run as `kpca plan` prices it, at the passes the solve made
    planned = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "plan",
            str(cfg),
            "--json",
            "--passes",
            str(int(manifest["model"].get("n_passes") or 1)),
        ],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    plan = json.loads(planned.stdout)
    result["kpca_plan"] = {
        "stages": plan["stages"],
        "seconds": plan["seconds"],
        # the stages (the manifest's total against the plan less its fixed start), and the
        # whole command
        "stages_over_predicted": manifest["timings"]["total"]
        / (plan["seconds"] - plan["stages"].get("start", 0.0)),
        "wall_over_predicted": wall / plan["seconds"] if plan["seconds"] else None,
    }
    if args.case == "exact":
        result["roofline"] = roofline(
            n,
            d,
            result["stage_seconds"]["solve"],
            manifest["model"],
            (manifest.get("kernel_store") or {}).get("block_rows"),
        )
    if args.case == "nystroem" and not args.no_estimator:
        est = run_estimator(root, out, float(manifest["model"]["gamma"]))
        result["estimator"] = est
        result["pipeline_over_estimator"] = wall / est["wall_seconds"]
        result["pipeline_over_estimator_cpu"] = result["cpu_seconds"] / est["cpu_seconds"]
    print(json.dumps(result, indent=1))
    print(
        f"\n| case | n | d | wall | peak memory | written (disk) | read (disk / incl. cache) |"
        f"\n|---|---|---|---|---|---|---|\n| {args.case} | {n:,} | {d} | {wall:.0f} s | "
        f"{result['peak_memory_gib']:.2f} GiB | {io['write_bytes'] / 1e9:.1f} GB | "
        f"{io['read_bytes'] / 1e9:.1f} / {io['read_chars'] / 1e9:.1f} GB |"
    )
    if "roofline" in result:
        rf = result["roofline"]
        print(
            f"\nsolve stage {rf['solve_seconds']:.1f} s for {rf['passes']} passes; this "
            f"machine's GEMM + exp roofline for them {rf['roofline_seconds']:.1f} s "
            f"(GEMM {rf['gemm_gflops']:.0f} GFLOP/s, exp {rf['exp_per_s'] / 1e9:.2f} G/s on "
            f"{rf['threads']} threads): {rf['ratio']:.2f}x the roofline; {result['cpu']}"
        )
    if "estimator" in result:
        e = result["estimator"]
        print(
            f"| estimator, same rows | {n:,} | {d} | {e['wall_seconds']:.0f} s "
            f"(fit {e['fit_seconds']:.0f} s) | {e['peak_memory_gib']:.2f} GiB | "
            f"{e['io']['write_bytes'] / 1e9:.1f} GB | {e['io']['read_bytes'] / 1e9:.1f} / "
            f"{e['io']['read_chars'] / 1e9:.1f} GB |\n\npipeline / estimator: "
            f"{result['pipeline_over_estimator']:.2f}x wall, "
            f"{result['pipeline_over_estimator_cpu']:.2f}x CPU seconds; {result['cpu']}"
        )
    (HERE / "results").mkdir(exist_ok=True)
    tag = "" if args.block_rows == "auto" else f"-block{args.block_rows}"
    fresh(HERE / "results" / f"pipeline-{args.case}-{n}{tag}-{result['date']}.json").write_text(
        json.dumps(result, indent=1)
    )
    if not args.keep and not args.workdir:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--estimator-child"]:
        estimator_child(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    else:
        main()
