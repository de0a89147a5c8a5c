"""Memory pressure: the exact path under worker memory limits small enough to force spilling.

Runs the pipeline (ingest, materialised kernel store, centring, randomized solve,
projection, manifest) twice on the same data and config through
``pipeline.runtime.cluster.dask_client`` -- a local cluster of worker processes, as
``kpca run`` starts it -- once with roomy workers and once with a tight
``cluster.memory_limit``. It reports, per run: wall time, the peak resident
memory of each worker process (sampled every 0.1 s), what the workers' memory
managers spilled to disk and read back (their cumulative spill metrics), worker
deaths, and whether every published array and the model are bit-identical to
the roomy run's.

    python benchmarks/bench_memory_pressure.py --save          # n = 20000, d = 256
    python benchmarks/bench_memory_pressure.py --tight 300MiB

The data: Gaussian blobs (16 centres), rbf kernel (gamma 'scale'), 8 components,
float32 kernel, 2 single-threaded workers, kernel blocks of 2000 rows (55
upper blocks of 16 MB). Unconstrained, a worker peaks at ~250 MB resident
(~120 MB of its own, the persisted input's share, a block and its products).
Dask's memory manager spills managed data when a worker's process memory
passes 70% of its limit, pauses it at 80% and restarts it at 95%: with the
default 280 MiB limit every worker spills the input chunks and block products
it holds again and again (about 1.3 GB written to disk here), pauses now and
then, and is never killed.

Measured here (2 cores, shared with other jobs; results/memory-pressure-*.json):
4 GiB 43 s, peak 250/255 MB, nothing spilled; 280 MiB 52 s, peak 227/254 MB,
1.37 GB spilled and 0.87 GB read back, no worker lost, artifacts bit-identical.
Smaller limits fail with a KilledWorker naming the task (the exact solver
gathers the n x d input onto one worker to hand it to the driver: 2 x 41 MB
here; see the note in the reliability report). A limit that is too small is a
failure, never a different result.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def make_data(path: Path, n: int, d: int, seed: int = 0) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((16, d)) * 2.0
    X = centres[rng.integers(0, 16, n)] + rng.standard_normal((n, d))
    np.save(path, X)


class WorkerSampler(threading.Thread):
    """Peak RSS of every descendant process of this one (the local cluster's workers)."""

    def __init__(self, interval: float = 0.1):
        super().__init__(daemon=True)
        self.interval = interval
        self.peak: dict[int, int] = {}
        self._done = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._done.is_set():
            for p in me.children(recursive=True):
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)
            time.sleep(self.interval)

    def stop(self) -> dict[int, int]:
        self._done.set()
        self.join()
        return self.peak


def _worker_spill(dask_worker) -> dict:
    """A worker's cumulative spill metrics (bytes and counts written/read, seconds)."""
    metrics = {
        f"{label}-{unit}": float(v)
        for (label, unit), v in dict(dask_worker.data.cumulative_metrics).items()
    }
    memory, disk = dask_worker.data.spilled_total
    return {
        "metrics": metrics,
        "on_disk_now": int(disk),
        "memory_limit": dask_worker.memory_manager.memory_limit,
    }


def run_once(
    data: Path,
    work: Path,
    *,
    memory_limit: str,
    n_workers: int,
    block_rows: int,
    n_components: int,
) -> dict:
    import dask

    from pipeline.config import load_config
    from pipeline.output.export import verify_run
    from pipeline.runner.run import run_pipeline
    from pipeline.runtime.cluster import dask_client

    out = work / f"out-{memory_limit}"
    cfg = load_config(
        {
            "input": {"path": str(data)},
            "kernel": {"name": "rbf", "gamma": "scale"},
            "solver": {
                "n_components": n_components,
                "eigen_solver": "randomized",
                "dtype": "float32",
                "random_state": 0,
            },
            "chunks": {"target_chunk_mb": 16, "block_rows": block_rows},
            "kernel_store": {"materialize": "always"},
            "output": {"path": str(out), "parquet": False, "overwrite": True},
            "evaluate": {"enabled": False},
            "cluster": {
                "n_workers": n_workers,
                "threads_per_worker": 1,
                "memory_limit": memory_limit,
                "dashboard_address": None,
            },
        }
    )
    spill_dir = work / f"spill-{memory_limit}"
    spill_dir.mkdir(parents=True, exist_ok=True)
    sampler = WorkerSampler()
    t0 = time.perf_counter()
    with dask.config.set({"temporary-directory": str(spill_dir)}):
        with dask_client(cfg.cluster) as client:
            first_workers = set(client.scheduler_info()["workers"])
            sampler.start()
            run_pipeline(cfg)
            seconds = time.perf_counter() - t0
            spill = client.run(_worker_spill)
            last_workers = set(client.scheduler_info()["workers"])
    peaks = sampler.stop()
    manifest = verify_run(out)
    write = sum(s["metrics"].get("disk-write-bytes", 0.0) for s in spill.values())
    read = sum(s["metrics"].get("disk-read-bytes", 0.0) for s in spill.values())
    nwrite = sum(s["metrics"].get("disk-write-count", 0.0) for s in spill.values())
    return {
        "memory_limit": memory_limit,
        "seconds": round(seconds, 1),
        "worker_peak_rss_mb": sorted(round(v / 2**20) for v in peaks.values())[-n_workers:],
        "spilled_to_disk_mb": round(write / 2**20, 1),
        "read_back_from_disk_mb": round(read / 2**20, 1),
        "spill_writes": int(nwrite),
        "worker_deaths": len(first_workers - last_workers),
        "timings": {k: round(v, 1) for k, v in manifest["timings"].items()},
        "checksums": manifest["checksums"],
        "model_checksums": manifest["model"]["checksums"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--roomy", default="4GiB", help="memory limit per worker, reference run")
    p.add_argument("--tight", default="280MiB", help="memory limit per worker, pressure run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--block-rows", type=int, default=2000)
    p.add_argument("--components", type=int, default=8)
    p.add_argument("--save", action="store_true", help="write benchmarks/results/*.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import distributed  # noqa: F401  (configures its loggers; quieten them after)

    for name in ("distributed", "pipeline", "kpca_dask"):
        logging.getLogger(name).setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="kpca-mem-") as tmp:
        tmp = Path(tmp)
        data = tmp / "x.npy"
        make_data(data, args.n, args.d)
        runs = [
            run_once(
                data,
                tmp,
                memory_limit=m,
                n_workers=args.workers,
                block_rows=args.block_rows,
                n_components=args.components,
            )
            for m in (args.roomy, args.tight)
        ]
    ref, tight = runs
    identical = (
        ref["checksums"] == tight["checksums"]
        and ref["model_checksums"] == tight["model_checksums"]
    )
    print(
        f"exact path, n={args.n}, d={args.d}, {args.workers} workers x 1 thread, "
        f"kernel blocks of {args.block_rows} rows (float32, materialised)"
    )
    print(
        f"{'memory limit':>13} {'time s':>7} {'peak RSS MB':>14} {'spilled MB':>11} "
        f"{'read back MB':>13} {'deaths':>7}"
    )
    for r in runs:
        print(
            f"{r['memory_limit']:>13} {r['seconds']:>7} "
            f"{'/'.join(map(str, r['worker_peak_rss_mb'])):>14} {r['spilled_to_disk_mb']:>11} "
            f"{r['read_back_from_disk_mb']:>13} {r['worker_deaths']:>7}"
        )
    print(f"published arrays and model bit-identical: {identical}")
    result = {
        "date": datetime.date.today().isoformat(),
        "n": args.n,
        "d": args.d,
        "workers": args.workers,
        "block_rows": args.block_rows,
        "runs": runs,
        "identical": identical,
        "machine": {
            "cpus": psutil.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30),
        },
    }
    if args.save:
        path = fresh(HERE / "results" / f"memory-pressure-{result['date']}.json")
        path.write_text(json.dumps(result, indent=2))
        print(f"saved {path}")
    if not identical or tight["spilled_to_disk_mb"] <= 0:
        print(
            "FAILED: "
            + ("results differ" if not identical else "nothing was spilled; lower --tight"),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
