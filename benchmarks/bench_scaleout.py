"""Scale-out drivers on a simulated cluster: tasks and scheduler CPU per exact pass against n.

Starts a scheduler process and ``--workers`` one-thread worker processes on 127.0.0.1
(``dask scheduler`` / ``dask worker``, as benchmarks/bench_cluster_counts.py), then, for
every ``--n`` and both drivers of the exact solve's pass (``kpca.exact-driver``:
``waves``, one task per upper block, and ``workers``, one task per worker and a tree of
sums; kpca_dask/worker_passes.py), runs ``--passes`` products ``K Z`` in a fresh client
process and measures the passes after the first:

- tasks run (the scheduler's task stream) and scheduler transitions
  (``Scheduler.transition_counter``) per pass,
- CPU seconds of the scheduler process per pass (psutil, in the scheduler), and the
  same less the idle scheduler's CPU over the pass's wall time (the idle rate measured
  for half of ``--idle-seconds`` just before and just after each run, their mean; and
  for ``--idle-seconds`` before and after all runs, recorded),
- the client process's CPU per pass and its peak RSS above its imports
  (``ru_maxrss``: the client is a fresh process per run),
- the wall time per pass.

The kernel is cheap so that counts dominate: linear, d = 2, float32, recomputed, and Z of
``--columns`` columns; the block rows are the estimator's rule (``auto_block_rows``) for
the cluster's threads. Only the products run, not the solver around them (its Krylov basis
stays on the client with either driver: docs/scaling.md, "Scale-out drivers").

    python benchmarks/bench_scaleout.py --workers 16 --n 40000 80000 160000

``--solve``: the whole block Krylov solve instead of the products alone, with the
per-worker driver and the basis on the caller (``client-basis``, ``kpca.worker-basis:
False``, as before issue 38's basis work) or on the workers (``worker-basis``,
kpca_dask/worker_basis.py). After a warm-up product (the rows placed on the workers), solves of
``--passes`` and ``2 x --passes`` fixed passes are measured and their difference divided
by ``--passes`` gives the per-pass numbers (the first block, the certification pass and
the final gather cancel); the client's bytes received (every TCP frame it reads: the
scheduler's messages and the results it gathers) are counted in its process. ``--k``
components and ``--oversamples`` set the block (``l = k + oversamples``).

    python benchmarks/bench_scaleout.py --solve --workers 16 --n 40000 80000 160000

Results go to ``benchmarks/results/scaleout-<workers>x1-<date>.json``
(``scaleout-solve-...`` with ``--solve``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _proc_cpu() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


def _idle_scheduler_rate(client, seconds: float) -> float:
    """CPU seconds a second of the scheduler process while nothing runs: its periodic
    callbacks and the workers' heartbeats, which grow with the workers and go on during
    a pass however few tasks it has (the per-pass figures less this times the pass's
    wall are the pass's own)."""
    s0, t0 = client.run_on_scheduler(_proc_cpu), time.perf_counter()
    time.sleep(seconds)
    s1, t1 = client.run_on_scheduler(_proc_cpu), time.perf_counter()
    return (s1 - s0) / (t1 - t0)


def child(address: str, n: int, driver: str, passes: int, columns: int, d: int) -> dict:
    """One run in a fresh client process: ``passes`` products, the first one apart."""
    import resource

    import dask
    import dask.array as da
    import numpy as np
    from distributed import Client, get_task_stream

    from kpca_dask.gram import BlockKernelMatrix
    from kpca_dask.kernels import make_kernel
    from kpca_dask.params import auto_block_rows
    from kpca_dask.worker_passes import DRIVER_CONFIG

    dask.config.set({"distributed.admin.low-level-log-length": 1_000_000})
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with Client(address) as client:
        threads = sum(client.nthreads().values())
        rows = auto_block_rows(n, "randomized", threads=threads)
        X = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
        Xd = da.from_array(X, chunks=(rows, d))
        K = BlockKernelMatrix(Xd, make_kernel("linear"), np.float32)
        Z = np.random.default_rng(1).standard_normal((n, columns))
        rss_data = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        me = __import__("psutil").Process()
        out: list[dict] = []
        with dask.config.set({DRIVER_CONFIG: driver}):
            for p in range(passes):
                s0 = client.run_on_scheduler(_proc_cpu)
                tr0 = client.run_on_scheduler(
                    lambda dask_scheduler: dask_scheduler.transition_counter
                )
                c0 = me.cpu_times()
                t0 = time.perf_counter()
                with get_task_stream(client) as ts:
                    K.product(Z)
                wall = time.perf_counter() - t0
                c1 = me.cpu_times()
                out.append(
                    {
                        "pass": p,
                        "wall_s": wall,
                        "tasks": len(ts.data),
                        "transitions": client.run_on_scheduler(
                            lambda dask_scheduler: dask_scheduler.transition_counter
                        )
                        - tr0,
                        "scheduler_cpu_s": client.run_on_scheduler(_proc_cpu) - s0,
                        "client_cpu_s": (c1.user + c1.system) - (c0.user + c0.system),
                    }
                )
            K.release_cache()
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    later = out[1:] or out
    mean = {k: sum(r[k] for r in later) / len(later) for k in later[0] if k != "pass"}
    return {
        "n": n,
        "driver": driver,
        "block_rows": rows,
        "row_blocks": K.n_blocks,
        "upper_blocks": K.n_blocks * (K.n_blocks + 1) // 2,
        "passes": out,
        "later_pass_mean": mean,
        "client_peak_rss_mb_above_imports": (rss1 - rss0) / 1024,
        "client_peak_rss_mb_above_data": (rss1 - rss_data) / 1024,
        "data_mb": (X.nbytes + Z.nbytes) / 2**20,
    }


_RECEIVED = [0]


def _count_received() -> None:
    """Count the bytes of every TCP frame this process reads (distributed's comm)."""
    import distributed.comm.tcp as tcp

    original = tcp.from_frames

    async def counting(frames, *args, **kwargs):
        _RECEIVED[0] += sum(len(f) for f in frames)
        return await original(frames, *args, **kwargs)

    tcp.from_frames = counting


def child_solve(
    address: str, n: int, basis: str, passes: int, k: int, oversamples: int, d: int
) -> dict:
    """One solver run in a fresh client process (see the module's docstring)."""
    import resource

    import dask
    import dask.array as da
    import numpy as np
    import psutil
    from distributed import Client, get_task_stream

    from kpca_dask.centering import CentredKernel
    from kpca_dask.gram import BlockKernelMatrix
    from kpca_dask.kernels import make_kernel
    from kpca_dask.params import auto_block_rows
    from kpca_dask.solvers import randomized_eigh
    from kpca_dask.worker_basis import BASIS_CONFIG, panel_krylov_eigh
    from kpca_dask.worker_passes import DRIVER_CONFIG

    _count_received()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    me = psutil.Process()
    with Client(address) as client:
        threads = sum(client.nthreads().values())
        rows = auto_block_rows(n, "randomized", threads=threads)
        X = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
        Xd = client.persist(da.from_array(X, chunks=(rows, d)))
        del X  # the rows live on the workers, as a fit's persisted blocks do
        K = BlockKernelMatrix(Xd, make_kernel("linear"), np.float32)
        rss_data = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

        def solve(q: int):
            kw = dict(n_oversamples=oversamples, n_power_iter=q - 1, random_state=0, warn=False)
            if basis == "worker-basis":
                return panel_krylov_eigh(K, k, **kw)[0]
            return randomized_eigh(CentredKernel(K), k, **kw)

        def measured(q: int) -> dict:
            s0 = client.run_on_scheduler(_proc_cpu)
            tr0 = client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.transition_counter
            )
            c0, b0 = me.cpu_times(), _RECEIVED[0]
            t0 = time.perf_counter()
            with get_task_stream(client) as ts:
                res = solve(q)
            wall = time.perf_counter() - t0
            c1 = me.cpu_times()
            return {
                "passes": q,
                "products": res.n_passes,
                "wall_s": wall,
                "tasks": len(ts.data),
                "transitions": client.run_on_scheduler(
                    lambda dask_scheduler: dask_scheduler.transition_counter
                )
                - tr0,
                "scheduler_cpu_s": client.run_on_scheduler(_proc_cpu) - s0,
                "client_cpu_s": (c1.user + c1.system) - (c0.user + c0.system),
                "client_bytes_received": _RECEIVED[0] - b0,
                "round_trips": res.info.get("basis_round_trips", 0),
            }

        with dask.config.set({DRIVER_CONFIG: "workers", BASIS_CONFIG: basis == "worker-basis"}):
            K.product(np.ones((n, 1)))  # warm-up: X's blocks placed as each share's rows
            short, long = measured(passes), measured(2 * passes)
        K.release_cache()
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    per = {
        key: (long[key] - short[key]) / passes
        for key in ("wall_s", "tasks", "transitions", "scheduler_cpu_s", "client_cpu_s")
        + ("client_bytes_received", "round_trips")
    }
    return {
        "n": n,
        "driver": basis,
        "block_rows": rows,
        "row_blocks": K.n_blocks,
        "runs": [short, long],
        "later_pass_mean": per,
        "client_cpu_share_of_wall": long["client_cpu_s"] / long["wall_s"],
        "client_peak_rss_mb_above_imports": (rss1 - rss0) / 1024,
        "client_peak_rss_mb_above_data": (rss1 - rss_data) / 1024,
        "basis_mb_per_column_block": n * (k + oversamples) * 8 / 2**20,
    }


def child_nystroem(
    address: str, n: int, driver: str, passes: int, columns: int, d: int
) -> dict:
    """``--nystroem``: ``passes`` Nyström products (``FeatureCovariance.matmul``, m = 256
    landmarks, rbf, float32, ``columns`` columns) with ``kpca.nystroem-driver`` ``driver``
    (``blocks``: one task per row block, 8 blocks a task and a tree of fan-in 8;
    ``workers``: one task per worker and a tree of fan-in 4), the first one apart."""
    import resource

    import dask
    import dask.array as da
    import numpy as np
    import psutil
    from distributed import Client, get_task_stream

    from kpca_dask.kernels import make_kernel
    from kpca_dask.params import auto_block_rows
    from kpca_dask.solvers.nystroem import FeatureCovariance, nystroem_basis
    from kpca_dask.solvers.nystroem.worker_passes import DRIVER_CONFIG

    dask.config.set({"distributed.admin.low-level-log-length": 1_000_000})
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    me = psutil.Process()
    with Client(address) as client:
        threads = sum(client.nthreads().values())
        rows = auto_block_rows(n, "nystroem", threads=threads)
        X = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
        kern = make_kernel("rbf", gamma=0.5)
        basis = nystroem_basis(X[:: max(1, n // 256)][:256], kern, np.float32)
        op = FeatureCovariance(da.from_array(X, chunks=(rows, d)), basis)
        Y = np.random.default_rng(1).standard_normal((op.n, columns))
        out: list[dict] = []
        with dask.config.set({DRIVER_CONFIG: driver}):
            for p in range(passes):
                s0 = client.run_on_scheduler(_proc_cpu)
                tr0 = client.run_on_scheduler(
                    lambda dask_scheduler: dask_scheduler.transition_counter
                )
                c0 = me.cpu_times()
                t0 = time.perf_counter()
                with get_task_stream(client) as ts:
                    op.matmul(Y)
                wall = time.perf_counter() - t0
                c1 = me.cpu_times()
                out.append(
                    {
                        "pass": p,
                        "wall_s": wall,
                        "tasks": len(ts.data),
                        "transitions": client.run_on_scheduler(
                            lambda dask_scheduler: dask_scheduler.transition_counter
                        )
                        - tr0,
                        "scheduler_cpu_s": client.run_on_scheduler(_proc_cpu) - s0,
                        "client_cpu_s": (c1.user + c1.system) - (c0.user + c0.system),
                    }
                )
        op.release()
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    later = out[1:] or out
    mean = {k: sum(r[k] for r in later) / len(later) for k in later[0] if k != "pass"}
    return {
        "n": n,
        "driver": driver,
        "block_rows": rows,
        "row_blocks": len(op.X.chunks[0]),
        "passes": out,
        "later_pass_mean": mean,
        "client_peak_rss_mb_above_imports": (rss1 - rss0) / 1024,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--n", type=int, nargs="+", default=[40_000, 80_000, 160_000])
    ap.add_argument("--drivers", nargs="+", default=["waves", "workers"])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--columns", type=int, default=2)
    ap.add_argument("--d", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--solve", action="store_true", help="the whole solve (module docstring)")
    ap.add_argument("--nystroem", action="store_true", help="Nyström passes (child_nystroem)")
    ap.add_argument(
        "--idle-seconds",
        type=float,
        default=20.0,
        help="how long the idle scheduler's CPU is measured (the baseline subtracted)",
    )
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--oversamples", type=int, default=8)
    ap.add_argument("--child", nargs=2, metavar=("ADDRESS", "N_DRIVER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        n, driver = args.child[1].split(":")
        if args.nystroem:
            res = child_nystroem(
                args.child[0], int(n), driver, args.passes, args.columns, args.d
            )
        elif args.solve:
            res = child_solve(
                args.child[0], int(n), driver, args.passes, args.k, args.oversamples, args.d
            )
        else:
            res = child(args.child[0], int(n), driver, args.passes, args.columns, args.d)
        print("RESULT " + json.dumps(res))
        return

    from _results import fresh
    from bench_cluster_counts import _separate_processes
    from distributed import Client

    from kpca_dask.cost import _cpu_model

    if args.solve and args.drivers == ["waves", "workers"]:
        args.drivers = ["client-basis", "worker-basis"]
    if args.nystroem and args.drivers == ["waves", "workers"]:
        args.drivers = ["blocks", "workers"]
    runs = []
    started = datetime.datetime.now(datetime.UTC)
    with _separate_processes(args.workers, 1) as address:
        with Client(address) as c:
            c.wait_for_workers(args.workers, timeout=300)
            c.run(lambda: __import__("kpca_dask.worker_passes"))  # warm imports
            idle = _idle_scheduler_rate(c, args.idle_seconds)
        print(f"idle scheduler: {idle:.4f} CPU s a second ({args.workers} workers)", flush=True)
        for n in args.n:
            for driver in args.drivers:
                load0 = os.getloadavg()
                with Client(address) as c:  # the idle baseline just before this run
                    idle_before = _idle_scheduler_rate(c, args.idle_seconds / 2)
                cmd = (
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        address,
                        f"{n}:{driver}",
                        "--passes",
                        str(args.passes),
                        "--columns",
                        str(args.columns),
                        "--d",
                        str(args.d),
                        "--k",
                        str(args.k),
                        "--oversamples",
                        str(args.oversamples),
                    ]
                    + (["--solve"] if args.solve else [])
                    + (["--nystroem"] if args.nystroem else [])
                )
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
                res = json.loads(line[len("RESULT ") :])
                res["load_avg_before"] = load0
                with Client(address) as c:  # and just after it
                    idle_after_run = _idle_scheduler_rate(c, args.idle_seconds / 2)
                res["idle_scheduler_cpu_per_s"] = [idle_before, idle_after_run]
                m = res["later_pass_mean"]
                # the pass's own scheduler CPU: less what the idle scheduler spends in as
                # long (the workers' heartbeats and its periodic callbacks), at the rate
                # measured around this run
                rate = (idle_before + idle_after_run) / 2
                m["scheduler_cpu_net_s"] = m["scheduler_cpu_s"] - rate * m["wall_s"]
                runs.append(res)
                extra = ""
                if args.solve:
                    extra = (
                        f" client recv/pass={m['client_bytes_received'] / 1e6:.2f} MB"
                        f" client CPU/wall={res['client_cpu_share_of_wall']:.1%}"
                    )
                print(
                    f"n={n} {driver:8s} blocks={res['row_blocks']:3d} "
                    f"tasks/pass={m['tasks']:.0f} transitions/pass={m['transitions']:.0f} "
                    f"scheduler CPU/pass={m['scheduler_cpu_s']:.3f}s "
                    f"(net of idle {m['scheduler_cpu_net_s']:.3f}s) "
                    f"client CPU/pass={m['client_cpu_s']:.3f}s wall/pass={m['wall_s']:.2f}s "
                    f"client peak RSS +{res['client_peak_rss_mb_above_imports']:.0f} MB"
                    + extra,
                    flush=True,
                )
        with Client(address) as c:  # the baseline again, after the runs
            idle_after = _idle_scheduler_rate(c, args.idle_seconds)
        print(f"idle scheduler after the runs: {idle_after:.4f} CPU s a second", flush=True)
    cpu, simd = _cpu_model()
    out = {
        "date": started.isoformat(timespec="seconds"),
        "command": "python benchmarks/bench_scaleout.py " + " ".join(argv or sys.argv[1:]),
        "cpu": cpu,
        "simd": simd,
        "cores": os.cpu_count(),
        "workers": args.workers,
        "kernel": f"linear, d = {args.d}, float32, recomputed, Z of {args.columns} columns"
        if not args.solve
        else f"linear, d = {args.d}, float32, recomputed; k = {args.k}, l = "
        f"{args.k + args.oversamples}, block Krylov, fixed passes",
        "load_avg_end": os.getloadavg(),
        "idle_scheduler_cpu_per_s": idle,
        "idle_scheduler_cpu_per_s_after": idle_after,
        "runs": runs,
    }
    path = args.out or fresh(
        HERE
        / "results"
        / (
            f"scaleout-{'solve-' * args.solve}{'nystroem-' * args.nystroem}"
            f"{args.workers}x1-{started.date().isoformat()}.json"
        )
    )
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
