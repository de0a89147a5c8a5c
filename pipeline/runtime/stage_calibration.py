"""Each I/O stage's fixed seconds on a store, measured: what ``kpca calibrate --store`` adds
to the store's rates.

A stage pays, besides its chunks' reads, writes and codecs (priced per chunk,
:mod:`kpca_dask.cost.io`), a part that does not grow with the rows: the client's own
requests (the source's header, the old store's removal, zarr's group, array and
attribute objects, the model's small arrays, the read-back of what it wrote for its
checksums) and, in the first stage that touches the store, the workers' imports and first
connections. On a small run that part is most of the stage (measured at 1M rows on the S3
server: 1.2-1.5 s of a 2.7 s ingest; docs/scaling.md).

Measured here with tiny real runs of the pipeline's stages (:func:`run_pipeline`, no
Prefect, the default cluster) with their input and output below the store URL, each on a
fresh cluster as a ``kpca run`` has: each stage's time less what the cost model prices for
its chunks is its fixed part, and the median over the runs is kept. One run was not
enough: three calibrations on the S3 server, minutes apart on a quiet machine, measured
the ingest's fixed part at 1.57, 0.83 and 1.11 s, and the one at 0.83 s priced a 1M-row
ingest 30 % under what it took (docs/scaling.md). Everything the runs wrote is removed
afterwards (below a prefix made here, through :mod:`kpca_dask.removal`).
"""

from __future__ import annotations

import dataclasses
import io
import uuid
from typing import Any

import numpy as np

__all__ = ["STAGES", "measure_stage_seconds", "median_stages"]

#: the manifest's stage timings -> the plan's stages they are compared with
STAGES = {"ingest": "ingest", "split": "split", "project": "embed"}
ROWS, FEATURES = 4000, 8


def _config(root: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    return {
        "input": {"path": f"{root}/in/x.npy", "storage_options": storage_options},
        "kernel": {"name": "rbf", "gamma": "scale"},
        "solver": {
            "n_components": 4,
            "eigen_solver": "nystroem",
            "n_landmarks": 64,
            "dtype": "float32",
            "random_state": 0,
        },
        "output": {"path": f"{root}/run", "storage_options": storage_options, "parquet": True},
        "evaluate": {"enabled": False},
        "cluster": {"dashboard_address": None},
    }


def measure_stage_seconds(
    store: str, storage_options: dict[str, Any] | None, machine: Any, runs: int = 3
) -> dict[str, float]:
    """``{plan stage: fixed seconds}`` of a run whose input and output are on ``store``
    (an object-store URL or a local folder; written below a new prefix there and removed
    again): the median over ``runs`` tiny runs of their stage times less ``machine``'s
    price of their chunks."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    return median_stages([_one_run(store, storage_options, machine) for _ in range(runs)])


def median_stages(each: list[dict[str, float]]) -> dict[str, float]:
    """Each stage's median over the runs ``each``; a stage some run did not time is left
    out (it is then priced with no fixed part, as on a store not calibrated)."""
    return {
        stage: float(np.median([e[stage] for e in each]))
        for stage in each[0]
        if all(stage in e for e in each)
    }


def _one_run(store: str, storage_options: dict[str, Any] | None, machine: Any) -> dict:
    """One tiny run's ``{plan stage: its time less its chunks' price}``."""
    from kpca_dask.cost import Cluster
    from kpca_dask.removal import remove_owned_url
    from pipeline.config import load_config
    from pipeline.output import Location, open_run
    from pipeline.runner.run import run_pipeline

    from .cluster import dask_client
    from .sizing import plan_run

    opts = dict(storage_options or {})
    name = f"kpca-calibrate-stages-{uuid.uuid4().hex[:8]}"
    root = f"{store.rstrip('/')}/{name}"
    loc = Location.at(root, opts)
    fs = loc.fs
    X = np.random.default_rng(4).standard_normal((ROWS, FEATURES))
    buf = io.BytesIO()
    np.save(buf, X)
    raw = _config(root, opts)
    try:
        fs.pipe_file(f"{loc.fs_path}/in/x.npy", buf.getvalue())
        # a fresh local cluster as `kpca run` starts one (the default cluster section),
        # started here so that its shape is known: the run connects to it
        with dask_client(load_config(raw).cluster) as client:
            cluster = Cluster.from_client(client)
            raw["cluster"] = {"address": client.scheduler.address}
            # a chunk a worker, as a real run's stages have: every worker pays its first
            # use of the store (imports, a client session, zarr's codecs) at once, on the
            # cores the run shares (one chunk left the others cold: the fixed part was
            # half of what a 2-worker run paid on the S3 server, docs/scaling.md)
            raw["chunks"] = {"target_chunk_mb": ROWS * FEATURES * 8 / 1e6 / cluster.workers}
            cfg = load_config(raw)
            run_pipeline(cfg)
        timings = open_run(cfg.output.path, storage_options=opts).manifest["timings"]
    finally:  # the prefix this made, and only it
        remove_owned_url(fs, loc.fs_path, root=loc.fs_path, owned=lambda p: p.endswith(name))
    bare = dataclasses.replace(machine, stage_seconds={})  # the chunks' price alone
    priced = plan_run(cfg, cluster, bare, rows=ROWS, features=FEATURES, passes=1).stages
    return {
        stage: max(0.0, float(timings[t]) - float(priced[stage]))
        for t, stage in STAGES.items()
        if t in timings and stage in priced
    }
