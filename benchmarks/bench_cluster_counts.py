"""A simulated cluster: what one exact fit costs the scheduler, the client and the network.

Starts a scheduler process and ``--workers`` worker processes (``--threads`` threads each)
on 127.0.0.1, each its own process as on a real cluster, and fits the exact (randomized
block Krylov) solver on standard normal rows with a cheap kernel (d = 4, float32,
recomputed every pass), so that counts, not flops, dominate. Measured with Dask's own
instruments, per fit and per kernel pass:

- tasks run (the scheduler's task stream),
- bytes the workers sent to the client and to each other (each worker's
  ``transfer_outgoing_log``: who asked, how many bytes),
- CPU seconds of the client process, of the scheduler process and of the workers,
  and the client's CPU as a share of the fit's wall time.

    python benchmarks/bench_cluster_counts.py --n 60000 --workers 2 --threads 1
    python benchmarks/bench_cluster_counts.py --n 40000 --workers 16 --threads 1

Results go to ``benchmarks/results/cluster-counts-<n>-<workers>x<threads>-<date>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

HERE = Path(__file__).resolve().parent
DASK = shutil.which("dask") or str(Path(sys.executable).with_name("dask"))


def _outgoing_since(client, t0: float) -> list[dict]:
    """Every worker's record of the data it sent since ``t0`` (its clock: same host)."""

    def log(dask_worker, t0=t0):
        return [
            {"who": e["who"], "total": e["total"]}
            for e in dask_worker.transfer_outgoing_log
            if e["start"] >= t0
        ]

    return [e for entries in client.run(log).values() for e in entries]


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def measure(client, fit) -> dict:
    """Run ``fit()`` and return what it cost (see the module docstring)."""
    import psutil
    from distributed import get_task_stream

    me = psutil.Process()

    def proc_cpu():
        import psutil

        t = psutil.Process().cpu_times()
        return t.user + t.system

    workers = set(client.scheduler_info()["workers"])
    sched0 = client.run_on_scheduler(proc_cpu)
    work0 = sum(client.run(proc_cpu).values())
    cpu0, t0 = _cpu(me), time.time()
    with get_task_stream(client) as stream:
        result = fit()
    wall = time.time() - t0
    cpu = _cpu(me) - cpu0
    sent = _outgoing_since(client, t0 - 0.5)
    return {
        "result": result,
        "wall_s": wall,
        "tasks": len(stream.data),
        "bytes_to_client": sum(e["total"] for e in sent if e["who"] not in workers),
        "bytes_worker_to_worker": sum(e["total"] for e in sent if e["who"] in workers),
        "client_cpu_s": cpu,
        "client_cpu_share": cpu / wall,
        "scheduler_cpu_s": client.run_on_scheduler(proc_cpu) - sched0,
        "workers_cpu_s": sum(client.run(proc_cpu).values()) - work0,
    }


@contextlib.contextmanager
def _separate_processes(workers: int, threads: int):
    """A scheduler and ``workers`` worker processes on 127.0.0.1, each its own process
    (``dask scheduler``, ``dask worker``), as on a real cluster: the client's CPU then
    counts the client only (a LocalCluster runs its scheduler inside the client's
    process, on the client's event-loop thread). Yields the scheduler's address."""
    with tempfile.TemporaryDirectory() as tmp:
        sfile = os.path.join(tmp, "scheduler.json")
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        procs = [
            subprocess.Popen(
                [
                    DASK,
                    "scheduler",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--dashboard-address",
                    ":0",
                    "--scheduler-file",
                    sfile,
                ],
                **quiet,
            )
        ]
        try:
            for _ in range(600):
                if os.path.exists(sfile) and os.path.getsize(sfile):
                    break
                time.sleep(0.1)
            address = json.loads(Path(sfile).read_text())["address"]
            procs.append(
                subprocess.Popen(
                    [
                        DASK,
                        "worker",
                        address,
                        "--host",
                        "127.0.0.1",
                        "--nworkers",
                        str(workers),
                        "--nthreads",
                        str(threads),
                        "--memory-limit",
                        "auto",
                        "--no-dashboard",
                    ],
                    **quiet,
                )
            )
            yield address
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in reversed(procs):
                p.wait(timeout=60)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d", type=int, default=4)
    ap.add_argument("--components", type=int, default=16)
    ap.add_argument("--block-rows", type=int, default=None, help="default: the plan's")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import dask
    from distributed import Client

    from kpca_dask import KernelPCA
    from kpca_dask.cost import EXECUTION_CONFIG, Cluster, _cpu_model, load_machine

    # every transfer must stay in the workers' logs for the count (default: 1000); the
    # fit runs on the cluster (on one machine the estimator's rule would run it on the
    # client's threads: a LocalCluster saves no compute, and this harness simulates one)
    dask.config.set(
        {"distributed.admin.low-level-log-length": 1_000_000, EXECUTION_CONFIG: "cluster"}
    )
    X = np.random.default_rng(0).standard_normal((args.n, args.d)).astype(np.float32)
    kw = dict(
        kernel="rbf",
        gamma=1.0 / args.d,
        dtype="float32",
        kernel_cache="recompute",
        eigen_solver="randomized",
        random_state=0,
    )
    if args.block_rows:
        kw["chunk_size"] = args.block_rows
    with _separate_processes(args.workers, args.threads) as address, Client(address) as client:
        client.wait_for_workers(args.workers)
        client.run(lambda: None)

        def fit():
            m = KernelPCA(args.components, **kw).fit(X)
            return {
                "passes": len(m.solver_info_["pass_seconds"]),
                "block_rows": int(m.chunk_size_),
                "basis_columns": int(m.solver_info_["basis_columns"]),
                "converged": bool(m.converged_),
            }

        r = measure(client, fit)
        res = r["result"]
        passes = max(1, res["passes"])
        # the cost model's counts for the same fit, at the passes it made
        e = (
            KernelPCA(args.components, **kw)
            .plan(X)
            .estimate(
                Cluster.from_client(client),
                load_machine(),
                passes=passes,
                kernel_cache="recompute",
            )
        )
    res = r.pop("result")
    from kpca_dask.solvers.randomized import DEFAULT_N_OVERSAMPLES

    nl8 = args.n * (args.components + DEFAULT_N_OVERSAMPLES) * 8  # l: one Krylov block
    out = {
        "date": datetime.date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "cpu": " ".join(_cpu_model()),
        "load_avg": os.getloadavg(),
        "args": vars(args) | {"out": None},
        **res,
        **r,
        "per_pass": {
            "tasks": r["tasks"] / passes,
            "bytes_to_client": r["bytes_to_client"] / passes,
            "bytes_to_client_over_nl8": r["bytes_to_client"] / passes / nl8,
            "bytes_worker_to_worker": r["bytes_worker_to_worker"] / passes,
        },
        "model_per_pass": {
            "tasks": e.tasks_per_pass,
            "bytes_to_client": e.bytes_to_client_per_pass,
            "bytes_worker_to_worker": e.worker_to_worker_bytes_per_pass,
        },
        "measured_over_model": {
            "tasks": r["tasks"] / passes / e.tasks_per_pass,
            "bytes_to_client": r["bytes_to_client"] / passes / e.bytes_to_client_per_pass,
            "bytes_worker_to_worker": (
                r["bytes_worker_to_worker"] / passes / max(1, e.worker_to_worker_bytes_per_pass)
            ),
        },
    }
    print(json.dumps(out, indent=2))
    path = args.out or fresh(
        HERE
        / "results"
        / f"cluster-counts-{args.n}-{args.workers}x{args.threads}-{out['date']}.json"
    )
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
