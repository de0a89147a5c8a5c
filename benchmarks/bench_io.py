"""`kpca plan` against a measured `kpca run` with its input and output on an object store.

Starts the project's S3-protocol server (moto's standalone server, a separate process on
127.0.0.1: tests/objectstore/s3server.py), writes Gaussian blobs (n x d, float64 NPY) into
a bucket, calibrates the store (``kpca calibrate --store``: per-request latency and
bandwidth of that server, and this machine's rates), runs the whole job with its input and
output on the server (``kpca run``, Nyström, Parquet on), then prices the same config with
``kpca plan`` at the passes the run made, and prints the stages side by side:

    python benchmarks/bench_io.py                      # n = 1M, d = 16
    python benchmarks/bench_io.py --n 200000 --quick   # smaller, quicker
    python benchmarks/bench_io.py --pin                # the server on a core of its own

``--pin`` gives the S3 server the last core and everything else (the calibration, the run's
client, scheduler, workers and Prefect) the others, one one-thread worker a core: the store
then no longer takes its CPU from the workers, as a real object store does not. Without it
the server, the workers and the client share every core.

The run's stage times are the manifest's (``timings``: ingest, split, solve, project, ...);
the plan's "embed" is compared with the run's "project" (the embedding written to zarr and
Parquet) and "ingest" with "ingest". The result (command, date, CPU model and SIMD level,
load average before the run) goes to benchmarks/results/io-<n>-<date>.json.

Caveat kept in the file: on a shared machine the other processes' load moves both the
calibration and the run; compare ratios measured in the same session.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def _blobs(path: Path, n: int, d: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((16, d)) * 2.0
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, d))
    for a in range(0, n, 200_000):
        b = min(n, a + 200_000)
        out[a:b] = centres[rng.integers(0, 16, b - a)] + rng.standard_normal((b - a, d))
    out.flush()
    del out


def _kpca(*args: str, env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "flows.cli", *args]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout[-4000:], res.stderr[-4000:], sep="\n")
        raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}")
    return res


def _config(path: Path, bucket: str, opts: dict, landmarks: int, workers: int = 2) -> Path:
    path.write_text(
        json.dumps(
            {
                "input": {"path": f"s3://{bucket}/in/x.npy", "storage_options": opts},
                "kernel": {"name": "rbf", "gamma": "scale"},
                "solver": {
                    "n_components": 16,
                    "eigen_solver": "nystroem",
                    "n_landmarks": landmarks,
                    "dtype": "float32",
                    "random_state": 0,
                },
                "output": {
                    "path": f"s3://{bucket}/runs/today",
                    "storage_options": opts,
                    "parquet": True,
                },
                "evaluate": {"enabled": False},
                "cluster": {"n_workers": workers, "threads_per_worker": 1},
            }
        )
    )
    return path


def measure_run(args, server, bucket: str, root: Path, env: dict) -> dict:
    """Write the blobs into the bucket and run the whole job there; its timings."""
    fs = server.filesystem()
    local = root / "x.npy"
    _blobs(local, args.n, args.d)
    t = time.perf_counter()
    fs.put(str(local), f"{bucket}/in/x.npy")
    upload = time.perf_counter() - t
    local.unlink()
    cfg = _config(
        root / "run.yaml", bucket, server.storage_options, args.landmarks, args.workers
    )
    load_before = os.getloadavg()
    cmd = ["run", str(cfg), "--no-progress", *(["--no-prefect"] if args.no_prefect else [])]
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = _kpca(*cmd, "-v", env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU of the run's process tree (client, scheduler, workers, Prefect's server: all
    # reaped by the time it exits), over what the machine's cores could give in its wall
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = (res.stdout + res.stderr).splitlines()
    manifest = json.loads(fs.cat(f"{bucket}/runs/today/manifest.json"))
    return {
        "upload_seconds": upload,
        "upload_bytes_per_s": args.n * args.d * 8 / upload,
        "run_command": "kpca " + " ".join(cmd[:1] + ["run.yaml"] + cmd[2:]),
        "load_before_run": list(load_before),
        "load_after_run": list(os.getloadavg()),
        "run_wall_seconds": wall,
        "run_cpu_seconds": cpu,
        "run_cpu_share": cpu / (wall * (os.cpu_count() or 1)),
        "run_timings": manifest["timings"],
        # the stages' own lines (ingest, solve, project: what each took and moved)
        "run_log": [line for line in log if " s" in line][-60:],
        "passes": int(manifest["model"].get("n_passes") or 1),
        "run_model": {k: manifest["model"].get(k) for k in ("solver", "n_passes", "gamma")},
    }


def plan_against(args, run: dict, server, bucket: str, root: Path, env: dict) -> dict:
    """Calibrate this machine and the store, then `kpca plan` the same config at the run's
    passes (its shape given: the input need not be there); the stages side by side."""
    opts = server.storage_options
    cal = root / "calibration.json"
    _kpca(
        "calibrate",
        *(["--quick"] if args.quick else []),
        "--store",
        f"s3://{bucket}/calibration",
        "--storage-options",
        json.dumps(opts),
        "--output",
        str(cal),
        env=env,
    )
    cfg = _config(root / "plan.yaml", bucket, opts, args.landmarks, args.workers)
    plan = json.loads(
        _kpca(
            "plan",
            str(cfg),
            "--json",
            "--rows",
            str(args.n),
            "--features",
            str(args.d),
            "--passes",
            str(run["passes"]),
            "--calibration",
            str(cal),
            env=env,
        ).stdout
    )
    ps, timings = plan["stages"], run["run_timings"]
    pairs = {"ingest": "ingest", "embed": "project", "solve": "solve"}
    compared = {
        k: {
            "predicted": ps.get(k),
            "measured": timings.get(v),
            "measured_over_predicted": (timings.get(v) or 0) / ps[k] if ps.get(k) else None,
        }
        for k, v in pairs.items()
    }
    wall = run["run_wall_seconds"]
    compared["whole run"] = {
        "predicted": plan["seconds"],
        "measured": wall,
        "measured_over_predicted": wall / plan["seconds"],
    }
    return {
        "calibration": json.loads(cal.read_text()),
        "plan_stages": ps,
        "plan_io": plan.get("io"),
        "plan_storage_bytes": plan.get("storage_bytes"),
        "compared": compared,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--landmarks", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="kpca calibrate --quick")
    ap.add_argument("--no-prefect", action="store_true", help="kpca run --no-prefect")
    ap.add_argument("--run-only", action="store_true", help="measure the run, plan nothing")
    ap.add_argument("--from", dest="from_", help="a --run-only result: plan against it")
    ap.add_argument("--out", help="result JSON (default benchmarks/results/io-<n>-<date>.json)")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="the S3 server on the last core, everything else on the others",
    )
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) < 2:
        raise SystemExit("--pin needs at least 2 cores (one for the S3 server)")
    server_cores, run_cores = (cores[-1:], cores[:-1]) if args.pin else (cores, cores)
    args.workers = len(run_cores) if args.pin else 2

    from kpca_dask.cost import _cpu_model
    from tests.objectstore.s3server import CREDENTIAL_ENV, start_s3_server, stop_s3_server

    env = {**os.environ, **CREDENTIAL_ENV, "PYTHONPATH": str(ROOT)}
    env.pop("AWS_ENDPOINT_URL", None)
    os.environ.update(CREDENTIAL_ENV)
    root = Path(tempfile.mkdtemp(prefix="kpca-bench-io-"))
    cpu, simd = _cpu_model()
    result = {
        "command": "python benchmarks/bench_io.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "simd": simd,
        "cores": os.cpu_count(),
        "n": args.n,
        "d": args.d,
        "landmarks": args.landmarks,
        "caveat": "shared 2-core machine (other helpers' jobs running at the same time): "
        "ratios from one session; absolute seconds move with the load",
        "server_cores": server_cores,
        "run_cores": run_cores,
        "workers": args.workers,
    }
    if args.from_:
        prev = json.loads(Path(args.from_).read_text())
        result.update({k: v for k, v in prev.items() if k not in ("command", "date")})
        result["run_date"] = prev["date"]
        result["command"] = "python benchmarks/bench_io.py " + " ".join(sys.argv[1:])
        args.n, args.d, args.landmarks = prev["n"], prev["d"], prev["landmarks"]
        args.workers = prev.get("workers", 2)
    # the server inherits this process's cores when it starts; then this process (and the
    # calibration and the run it starts) takes the others
    os.sched_setaffinity(0, server_cores)
    server = start_s3_server()
    os.sched_setaffinity(0, run_cores)
    try:
        bucket = server.make_bucket(f"kpca-{uuid.uuid4().hex[:12]}")
        if not args.from_:
            result.update(measure_run(args, server, bucket, root, env))
        if not args.run_only:
            result.update(plan_against(args, result, server, bucket, root, env))
    finally:
        stop_s3_server(server)
        shutil.rmtree(root, ignore_errors=True)  # the run's local copies (GBs at 1M rows)
    tag = "run" if args.run_only else "plan"
    out = (
        Path(args.out)
        if args.out
        else fresh(
            HERE / "results" / f"io-{tag}-{args.n}-{datetime.date.today().isoformat()}.json"
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    if "compared" in result:
        print("| stage | predicted s | measured s | measured / predicted |\n|---|---|---|---|")
        for k, v in result["compared"].items():
            r = v["measured_over_predicted"]
            print(
                f"| {k} | {v['predicted'] or 0:.1f} | {v['measured'] or 0:.1f} | "
                f"{'' if r is None else f'{r:.2f}'} |"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
