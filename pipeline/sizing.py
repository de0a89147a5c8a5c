"""``kpca plan``: what a configured run will need and how long it will take, before it runs.

Reads the input's shape (NPY header, zarr metadata, Parquet footer, CSV lines; or
``rows``/``features`` given), plans the fit as the kernel and solve stages do
(:func:`pipeline.fitspec.plan_fit`: the same estimator, solver and block rule) and
prices it with the cost model (:mod:`kpca_dask.cost`) on the cluster described, plus
the pipeline's own stages around the fit: ingest (read the source, write the zarr
store) and the embedding of every row (held-out rows evaluated; an exact model's
training rows from its vectors).
Nothing is written and no cluster is started. The run's fixed start (imports, the
Prefect API, starting the cluster) is the machine's ``run_start_seconds`` (given: 17.5 s
measured on the development machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kpca_dask import cost as _cost

from .config import ConfigError, PipelineConfig

__all__ = ["RunPlan", "input_shape", "plan_run"]


def input_shape(cfg: PipelineConfig) -> tuple[int, int]:
    """(rows, feature columns) of the configured input, from its metadata (CSV: a line
    count and the header); the label, id and excluded columns are not features."""
    path, fmt = cfg.input.path, cfg.input.format
    if fmt == "auto":
        low = path.lower().rstrip("/")
        fmt = next(
            (f for f in ("npy", "csv", "parquet", "zarr") if low.endswith("." + f)),
            "parquet" if low.endswith(".pq") else "zarr",
        )
    skip = {c for c in (cfg.input.label_column, cfg.input.id_column) if c}
    skip |= set(cfg.input.exclude_columns or [])
    try:
        if fmt == "npy":
            a = np.load(path, mmap_mode="r", allow_pickle=False)
            return int(a.shape[0]), int(a.shape[1]) if a.ndim == 2 else 1
        if fmt == "zarr":
            import zarr

            z = zarr.open(path, mode="r")
            if cfg.input.zarr_array:
                z = z[cfg.input.zarr_array]
            elif not hasattr(z, "shape"):
                z = z["X"]
            return int(z.shape[0]), int(z.shape[1])
        if fmt == "parquet":
            import pyarrow.dataset as ds

            d = ds.dataset(path)
            names = [
                f.name
                for f in d.schema
                if f.name not in skip
                and (f.type.id in range(2, 13) or str(f.type).startswith(("int", "float")))
            ]
            if cfg.input.columns:
                names = list(cfg.input.columns)
            return int(d.count_rows()), len(names)
        import pandas as pd

        head = pd.read_csv(path, nrows=200)
        with open(path, "rb") as f:
            rows = sum(1 for _ in f) - 1
        names = [c for c in head.select_dtypes("number").columns if c not in skip]
        if cfg.input.columns:
            names = list(cfg.input.columns)
        return rows, len(names)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"kpca plan cannot read the shape of {path} ({exc}); pass --rows and --features"
        ) from exc


@dataclass
class RunPlan:
    n_rows: int
    n_train: int
    n_features: int
    fit: _cost.Estimate
    stages: dict[str, float]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_rows": self.n_rows,
            "n_train": self.n_train,
            "n_features": self.n_features,
            "stages": self.stages,
            "seconds": self.seconds,
            "fit": self.fit.to_dict(),
        }

    def summary(self) -> str:
        lines = [
            f"{self.n_rows} rows x {self.n_features} features, {self.n_train} training rows",
            self.fit.summary(),
            "run: "
            + ", ".join(f"{k} {v:.3g} s" for k, v in self.stages.items())
            + f"; total {self.seconds:.3g} s",
            f"machine: {self.fit.machine.get('source')}",
        ]
        return "\n".join(lines)


def plan_run(
    cfg: PipelineConfig,
    cluster: _cost.Cluster,
    machine: _cost.Machine,
    *,
    rows: int | None = None,
    features: int | None = None,
    passes: int | None = None,
) -> RunPlan:
    """The run's prediction on ``cluster`` (see the module docstring)."""
    from .fitspec import plan_fit

    n, d = (rows, features) if rows and features else input_shape(cfg)
    n, d = int(rows or n), int(features or d)
    labelled = cfg.input.label_column is not None and cfg.evaluate.enabled is not False
    n_train = int(math.floor(n * (1 - cfg.evaluate.test_fraction))) if labelled else n
    # the fit's own parameters (keep_statistics too), on the described cluster's threads
    planned = plan_fit(cfg, n_train, d, threads=cluster.cores)
    plan, materialize = planned.plan, planned.materialize
    fit = plan.estimate(
        cluster,
        machine,
        passes=passes,
        kernel_cache="store" if materialize else "auto",
        input_in_memory=False,
        # the solve stage reads the rows into the workers' memory when they fit half of it
        # (pipeline.solve.nystroem_rows, memory_budget)
        persist=n_train * d * 8 <= 0.5 * (cluster.memory or 4e9) * cluster.workers,
    )
    W = max(1, cluster.workers)
    cores = cluster.cores
    src = n * d * 8
    # ingest: the source read from storage, the rows written into the zarr store (codec
    # and chunk digests on every core)
    ingest = src / (machine.storage * W) + src / (machine.zarr_write * cores)
    cols = int(plan.n_landmarks or n_train) if plan.solver == "nystroem" else n_train
    k = int(cfg.solver.n_components or 8)
    # exact models embed their training rows as V sqrt(lambda) (pipeline.project): only
    # held-out rows are evaluated against the training rows; Nyström transforms every row
    evaluated = n if plan.solver == "nystroem" else n - n_train
    embed = _cost.embed_seconds(evaluated, cols, d, k, machine, plan.dtype, cores)
    # the rows read back from the store, the embedding written
    embed += (src + n * k * 8) / (machine.zarr_read * cores)
    stages = {"start": float(machine.run_start_seconds), "ingest": ingest}
    if cfg.preprocess.scale != "none":  # the scaler's statistics: one read of the rows
        stages["split"] = n_train * d * 8 / (machine.zarr_read * cores)
    if materialize:
        stages["kernel store"] = fit.kernel_evaluations_per_pass * plan.dtype.itemsize / (
            machine.storage * W
        ) + fit.stages[1].parts.get("compute", 0.0)
    stages["solve"] = fit.seconds
    stages["embed"] = embed
    return RunPlan(n, n_train, d, fit, stages, float(sum(stages.values())))
