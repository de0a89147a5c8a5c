"""Where the Nyström pipeline's reads and time go: bytes read from the ingest store, per step.

Writes an ingest store with the pipeline's own ingest (blobs as in bench_pipeline.py),
then repeats what ``stage_solve`` and ``stage_project`` do, one step at a time, on a
LocalCluster of 2 worker processes (1 thread each, as ``kpca run`` on 2 cores):

* store bytes: what the workers' zarr ``LocalStore.get`` returned (every chunk read,
  counted in the worker processes),
* rchar: the workers' bytes through read() (/proc/self/io: store reads, page cache
  hits and the sockets between Dask processes),
* seconds.

    python benchmarks/diag_pipeline_io.py --n 300000              # m = 2048, d = 64
    python benchmarks/diag_pipeline_io.py --n 300000 --block-rows 8192
    python benchmarks/diag_pipeline_io.py --n 300000 \
        --fits threaded-8192,dist-2041,dist-7813,persist-7813

``--fits``: the whole Nyström fit on the ingest store, one variant each: ``threaded-R``
(dask's threaded scheduler in this process, as benchmarks/bench_nystroem.py scale runs the
estimator), ``dist-R`` (the LocalCluster, X re-read from the store at every pass, as the
pipeline ran), ``persist-R`` (the LocalCluster, X read once into the workers' memory);
R = rows per block.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _install_counter() -> None:
    """In a worker: count the bytes zarr's LocalStore.get returns (once per process)."""
    import zarr.storage

    cls = zarr.storage.LocalStore
    if getattr(cls, "_diag_counted", False):
        return
    orig = cls.get
    counts = {"calls": 0, "bytes": 0}

    async def get(self, key, prototype=None, byte_range=None):
        buf = await orig(self, key, prototype, byte_range)
        if buf is not None and not key.endswith("zarr.json"):
            counts["calls"] += 1
            counts["bytes"] += len(buf)
        return buf

    cls.get = get
    cls._diag_counted = True
    cls._diag_counts = counts


def _read_counts() -> dict:
    import zarr.storage

    c = dict(getattr(zarr.storage.LocalStore, "_diag_counts", {"calls": 0, "bytes": 0}))
    with open("/proc/self/io") as f:
        io = dict(line.split(": ") for line in f.read().splitlines())
    c["rchar"] = int(io["rchar"])
    c["cpu"] = time.process_time()
    return c


class Meter:
    def __init__(self, client):
        self.client = client
        self.rows: list[dict] = []

    def snap(self) -> dict:
        per = self.client.run(_read_counts)
        tot = {k: sum(v[k] for v in per.values()) for k in ("calls", "bytes", "rchar", "cpu")}
        tot["driver_cpu"] = time.process_time()
        return tot

    def step(self, name, fn, *args, **kw):
        a, t = self.snap(), time.perf_counter()
        out = fn(*args, **kw)
        secs, b = time.perf_counter() - t, self.snap()
        row = {
            "step": name,
            "seconds": round(secs, 2),
            "chunk_reads": b["calls"] - a["calls"],
            "store_bytes": b["bytes"] - a["bytes"],
            "rchar": b["rchar"] - a["rchar"],
            "worker_cpu": round(b["cpu"] - a["cpu"], 2),
            "driver_cpu": round(b["driver_cpu"] - a["driver_cpu"], 2),
        }
        self.rows.append(row)
        print(
            f"{name:28s} {secs:7.2f} s  {row['chunk_reads']:6d} chunk reads  "
            f"{row['store_bytes'] / 1e6:9.1f} MB from the store  "
            f"{row['rchar'] / 1e6:9.1f} MB rchar  "
            f"cpu: workers {row['worker_cpu']:6.1f} s, driver {row['driver_cpu']:5.1f} s",
            flush=True,
        )
        return out


def fit_variant(X0, variant: str, gamma: float, m: int) -> dict:
    """One whole Nyström fit of the ingested X (``kind-rows``), timed; see ``--fits``."""
    from distributed import Client, LocalCluster, wait

    from kpca_dask import KernelPCA

    kind, r = variant.split("-")
    r = int(r)
    est = KernelPCA(
        16,
        kernel="rbf",
        gamma=gamma,
        eigen_solver="nystroem",
        n_landmarks=m,
        landmark_method="rpcholesky",
        random_state=0,
        dtype="float32",
        chunk_size=r,
        remove_zero_eig=True,
    )

    def timed(client=None, X=X0):
        c0 = sum(client.run(time.process_time).values()) if client else 0.0
        d0, t0 = time.process_time(), time.perf_counter()
        est.fit(X)
        wall = time.perf_counter() - t0
        wc = sum(client.run(time.process_time).values()) - c0 if client else 0.0
        return {
            "variant": variant,
            "wall": round(wall, 1),
            "worker_cpu": round(wc, 1),
            "driver_cpu": round(time.process_time() - d0, 1),
            "passes": est.n_passes_,
            "pass_seconds": round(sum(est.solver_info_["pass_seconds"]), 1),
            "landmark_seconds": round(est.solver_info_.get("landmark_seconds", 0), 1),
            "eigenvalue_0": float(est.eigenvalues_[0]),
        }

    if kind == "threaded":
        with dask.config.set(scheduler="threads"):
            return timed()
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        X = X0.rechunk({0: r, 1: -1})
        if kind == "persist":
            X = X.persist()
            wait(X)
        return timed(client, X)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--block-rows", default="auto", help="chunks.block_rows of the config")
    ap.add_argument("--workdir", help="data and store go here (default: a temp dir)")
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--fits", help="comma-separated fit variants to time after the steps")
    args = ap.parse_args()

    from distributed import Client, LocalCluster

    from benchmarks.bench_pipeline import make_data
    from kpca_dask import validation as V
    from kpca_dask.plan import auto_block_rows
    from kpca_dask.solvers.landmarks import select_landmarks
    from pipeline.config import PipelineConfig
    from pipeline.data.ingest import ingest, load_ingested
    from pipeline.model.fitspec import make_estimator
    from pipeline.output.layout import run_layout

    root = Path(args.workdir or tempfile.mkdtemp(prefix="kpca-diag-"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / f"blobs-{args.n}x{args.d}.npy"
    if not data.exists():
        make_data(data, args.n, args.d)
    out = root / "out"
    br = args.block_rows if args.block_rows == "auto" else int(args.block_rows)
    cfg = PipelineConfig.model_validate(
        {
            "input": {"path": str(data)},
            "kernel": {"name": "rbf", "gamma": "scale"},
            "solver": {
                "n_components": 16,
                "eigen_solver": "nystroem",
                "dtype": "float32",
                "random_state": 0,
                "n_landmarks": args.m,
            },
            "chunks": {"block_rows": br},
            "output": {"path": str(out), "overwrite": True},
        }
    )
    logging.basicConfig(level=logging.WARNING)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.run(_install_counter)
        meter = Meter(client)
        layout = run_layout(cfg)
        out.mkdir(parents=True, exist_ok=True)
        res = meter.step("ingest (npy -> zarr)", ingest, cfg.input, cfg.chunks, layout.ingest)
        store_path = res.store.local_path
        store_bytes = sum(f.stat().st_size for f in store_path.rglob("*") if f.is_file())
        print(f"ingest store: {store_bytes / 1e6:.1f} MB, {res.rows_per_chunk} rows per chunk")
        # every row is a training row here (no held-out split), in the kernel stage's blocks
        r = auto_block_rows(res.n_rows) if br == "auto" else min(br, res.n_rows)
        Xb = load_ingested(res).X.rechunk({0: r, 1: -1})
        print(f"solver blocks: {r} rows ({len(Xb.chunks[0])} blocks)")
        est = make_estimator(cfg, r)
        meter.step("check_finite (fit)", V.check_finite, Xb)
        plan = meter.step("gamma='scale' sample (KernelPCA.plan)", est.plan, Xb)
        kernel = plan.kernel
        rng = np.random.default_rng(0)
        meter.step(
            "landmarks (rpcholesky)",
            select_landmarks,
            Xb,
            args.m,
            "rpcholesky",
            kernel,
            rng,
            dtype=np.float32,
        )
        # the whole fit as stage_solve runs it (fit's own passes counted together)
        est = make_estimator(cfg, r)
        meter.step("fit (whole)", est.fit, Xb)
        info = est.solver_info_
        print(
            f"  passes: {est.n_passes_}, pass seconds: "
            f"{[round(s, 1) for s in info.get('pass_seconds', [])]}, "
            f"landmark seconds: {info.get('landmark_seconds', 0):.1f}"
        )
        from pipeline.embed.project import write_embedding

        src = load_ingested(res)
        meter.step("project (write_embedding)", write_embedding, est, src.X, layout.out)
        result = {
            "n": args.n,
            "d": args.d,
            "m": args.m,
            "block_rows": r,
            "rows_per_chunk": res.rows_per_chunk,
            "store_bytes": store_bytes,
            "passes": est.n_passes_,
            "steps": meter.rows,
            "dask": dask.__version__,
        }
        tot = sum(r_["store_bytes"] for r_ in meter.rows[1:])
        print(
            f"after ingest: {tot / 1e9:.2f} GB read from a {store_bytes / 1e9:.2f} GB store "
            f"({tot / store_bytes:.1f} x)"
        )
        gamma = float(est.gamma_)
    if args.fits:
        import dask.array as da
        import zarr

        X0 = da.from_zarr(zarr.open_group(str(store_path), mode="r")["X"])
        result["fits"] = []
        for v in args.fits.split(","):
            row = fit_variant(X0, v, gamma, args.m)
            result["fits"].append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
