"""``kpca plan`` and ``kpca calibrate``: a run's predicted time and memory from the cost
model (kpca_dask/cost.py, pipeline/runtime/sizing.py), and the machine constants it reads.
Neither starts a run or writes into one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["cmd_calibrate", "cmd_plan"]


def cmd_plan(args: argparse.Namespace) -> int:
    from dask.utils import parse_bytes

    from kpca_dask.cost import Cluster, load_machine
    from pipeline.config import ConfigError, load_config
    from pipeline.runtime import configured_cluster, plan_run

    cfg = load_config(args.config)
    try:
        machine = load_machine(args.calibration) if args.calibration else load_machine()
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(
            f"--calibration {args.calibration}: not a calibration file "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); pass the JSON "
            "`kpca calibrate --output FILE` wrote, or leave --calibration out"
        ) from exc
    given = (args.workers, args.threads, args.memory)
    if cfg.cluster.address and not all(given):
        # the running cluster, as its scheduler reports it; the flags given replace parts
        asked = configured_cluster(cfg)
        workers = args.workers or asked.workers
        threads = args.threads or asked.threads
        memory = parse_bytes(args.memory) if args.memory else asked.memory
        nodes = asked.nodes if not args.workers else None
    else:
        workers = args.workers or cfg.cluster.n_workers or 1
        threads = args.threads or cfg.cluster.threads_per_worker
        limit = args.memory or cfg.cluster.memory_limit
        if limit == "auto" and not cfg.cluster.address:
            # a local cluster's "auto" limit (dask's rule): this machine's memory per worker
            import psutil

            memory = psutil.virtual_memory().total / max(1, int(workers))
        else:
            memory = parse_bytes(limit) if limit and limit != "auto" else None
        # a local cluster (no address, no --workers): its workers share this one machine
        nodes = 1 if not cfg.cluster.address and not args.workers else None
    cluster = Cluster(
        workers=int(workers),
        threads=int(threads),
        memory=float(memory) if memory else None,
        network=args.network * 1e9 / 8 if args.network else None,
        nodes=nodes,
    )
    rp = plan_run(
        cfg,
        cluster,
        machine,
        rows=args.rows,
        features=args.features,
        passes=args.passes,
        driver=args.driver,
    )
    if args.json:
        print(json.dumps(rp.to_dict(), indent=2, default=str))
    else:
        print(rp.summary())
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from kpca_dask.cost import calibrate, default_calibration_path

    from .overrides import storage_options_arg

    options = storage_options_arg(args) if args.storage_options is not None else {}
    m = calibrate(quick=args.quick, store=args.store, storage_options=options)
    if args.store:  # each I/O stage's fixed part there: a tiny real run on the store
        from kpca_dask.cost.io import store_scheme
        from pipeline.runtime import measure_stage_seconds

        m.stage_seconds[store_scheme(args.store)] = measure_stage_seconds(
            args.store, options, m, runs=1 if args.quick else 3
        )
    out = Path(args.output) if args.output else default_calibration_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(m.to_dict(), indent=2))
    print(
        f"kpca calibrate: {m.cpu} [{m.simd}]: GEMM {m.gemm('float64') / 1e9:.1f} / "
        f"{m.gemm('float32') / 1e9:.1f} Gflop/s per core (float64/float32), exp "
        f"{m.exp('float64') / 1e6:.0f} M/s, memory {m.mem_bandwidth / 1e9:.1f} GB/s "
        f"(new pages {m.page_touch / 1e9:.1f} GB/s), "
        f"{m.task_seconds * 1e3:.2f} ms a task, round trip {m.roundtrip_seconds * 1e3:.0f} ms, "
        f"client-worker {m.network / 1e9:.2f} GB/s; block tasks on every core at "
        f"{m.factor('recompute', 'float32'):.2f}x / {m.factor('fill', 'float32'):.2f}x / "
        f"{m.factor('stored', 'float32'):.2f}x the one-core rates' time (float32 recompute / "
        f"fill / stored); disk {m.storage / 1e6:.0f} MB/s, Parquet "
        f"{m.parquet_write / 1e6:.0f} MB/s a core"
        + "".join(
            f"; {k} store {v['latency'] * 1e3:.1f} ms a request, {v['read'] / 1e6:.0f} / "
            f"{v['read_aggregate'] / 1e6:.0f} MB/s read (one / all streams), "
            f"{v['write'] / 1e6:.0f} / {v['write_aggregate'] / 1e6:.0f} MB/s write"
            for k, v in m.object_stores.items()
            if k != "*"
        )
        + "".join(
            f"; {k} stages' fixed part "
            + ", ".join(f"{stage} {sec:.2f} s" for stage, sec in v.items())
            for k, v in m.stage_seconds.items()
        )
        + f"; wrote {out}"
    )
    return 0
