"""``kpca plan``: what a configured run will need and how long it will take, before it runs.

Reads the input's shape through ``input.storage_options`` (NPY header, zarr metadata,
Parquet footers, CSV lines; or ``rows``/``features`` given), plans the fit as the kernel
and solve stages do (:func:`pipeline.model.fitspec.plan_fit`: the same estimator, solver and
block rule) and prices it with the cost model (:mod:`kpca_dask.cost`) on the cluster
described (``cluster.address``: the running scheduler's answer, :func:`configured_cluster`),
plus the pipeline's own stages around the fit, from their chunk counts and the store rates
``kpca calibrate`` measured (:mod:`kpca_dask.cost.io`): ingest (the source read from local
disk or an object store, the rows written into the zarr store), the scaler's read, the
kernel store, and the embedding of every row (held-out rows evaluated; an exact model's
training rows from its vectors) written to zarr and Parquet; and the bytes the run leaves
in its output. Nothing is written and no cluster is started. The run's fixed start
(imports, the Prefect API, starting the cluster) is the machine's ``run_start_seconds``
(given: 17.5 s measured on the development machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kpca_dask import cost as _cost
from kpca_dask.cost import io as _io
from pipeline.config import ConfigError, PipelineConfig

__all__ = ["RunPlan", "Source", "configured_cluster", "input_shape", "plan_run", "read_source"]


@dataclass
class Source:
    """What ``kpca plan`` knows of the configured input without reading its rows: its
    shape, format, bytes and objects (files, or a zarr array's chunks) and where it is."""

    rows: int
    features: int
    fmt: str
    url: str
    nbytes: int
    objects: int


def _format(cfg: PipelineConfig) -> str:
    path, fmt = cfg.input.path, cfg.input.format
    if fmt != "auto":
        return fmt
    low = path.lower().rstrip("/")
    return next(
        (f for f in ("npy", "csv", "parquet", "zarr") if low.endswith("." + f)),
        "parquet" if low.endswith(".pq") else "zarr",
    )


def read_source(cfg: PipelineConfig) -> Source:
    """The configured input's :class:`Source`, read from its metadata through
    ``input.storage_options`` (as ``kpca validate`` reads it): an NPY header, zarr
    metadata, Parquet footers, or a CSV file's lines and header; the label, id and
    excluded columns are not features."""
    from pipeline.data.readers import RemoteNpyFile
    from pipeline.output import Location

    path, fmt = cfg.input.path, _format(cfg)
    loc = Location.at(path, cfg.input.storage_options)
    skip = {c for c in (cfg.input.label_column, cfg.input.id_column) if c}
    skip |= set(cfg.input.exclude_columns or [])
    try:
        fs, fs_path = loc.fs, loc.fs_path
        if fmt == "npy":
            a = RemoteNpyFile.open(loc)
            d = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1
            return Source(a.shape[0], d, fmt, path, int(fs.size(fs_path)), 1)
        if fmt == "zarr":
            import zarr

            opts = {} if loc.is_local else {"storage_options": loc.storage_options}
            z = zarr.open(loc.zarr_store(), mode="r", **opts)
            if cfg.input.zarr_array:
                z = z[cfg.input.zarr_array]
            elif not hasattr(z, "shape"):
                z = z["X"]
            return Source(
                int(z.shape[0]), int(z.shape[1]), fmt, path, int(z.nbytes), int(z.nchunks)
            )
        if fmt == "parquet":
            import pyarrow.dataset as ds

            data = ds.dataset(fs_path, filesystem=fs, format="parquet")
            names = [
                f.name
                for f in data.schema
                if f.name not in skip
                and (f.type.id in range(2, 13) or str(f.type).startswith(("int", "float")))
            ]
            if cfg.input.columns:
                names = list(cfg.input.columns)
            files = list(data.files)
            size = sum(int(fs.size(f)) for f in files)
            return Source(int(data.count_rows()), len(names), fmt, path, size, len(files))
        import pandas as pd

        with fs.open(fs_path, "rb") as f:
            head = pd.read_csv(f, nrows=200)
        with fs.open(fs_path, "rb") as f:
            rows = sum(1 for _ in f) - 1
        names = [c for c in head.select_dtypes("number").columns if c not in skip]
        if cfg.input.columns:
            names = list(cfg.input.columns)
        return Source(rows, len(names), fmt, path, int(fs.size(fs_path)), 1)
    except Exception as exc:  # noqa: BLE001 - any store's or format's error: one line
        msg = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ConfigError(
            f"kpca plan cannot read the shape of {path} ({type(exc).__name__}: {msg}); "
            "check input.path and input.storage_options, or pass --rows and --features"
        ) from exc


def input_shape(cfg: PipelineConfig) -> tuple[int, int]:
    """(rows, feature columns) of the configured input (:func:`read_source`)."""
    src = read_source(cfg)
    return src.rows, src.features


def configured_cluster(cfg: PipelineConfig) -> _cost.Cluster:
    """The cluster at ``cluster.address``, as its scheduler reports it (workers, their
    threads and memory limit, the hosts they run on); a :class:`ClusterError` (one line,
    exit 2) when it cannot be reached or has no workers."""
    from .cluster import dask_client

    with dask_client(cfg.cluster) as client:
        return _cost.Cluster.from_client(client)


@dataclass
class RunPlan:
    n_rows: int
    n_train: int
    n_features: int
    fit: _cost.Estimate
    stages: dict[str, float]
    seconds: float
    #: each I/O stage's traffic (:class:`kpca_dask.cost.io.Transfer` as dicts) and its
    #: priced parts (``io``, ``store``, ``seconds``)
    io: dict[str, Any] = field(default_factory=dict)
    #: bytes the run leaves in its output (ingest store, kernel store, embedding, Parquet)
    storage_bytes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_rows": self.n_rows,
            "n_train": self.n_train,
            "n_features": self.n_features,
            "stages": self.stages,
            "seconds": self.seconds,
            "io": self.io,
            "storage_bytes": self.storage_bytes,
            "fit": self.fit.to_dict(),
        }

    def summary(self) -> str:
        total = sum(self.storage_bytes.values())
        lines = [
            f"{self.n_rows} rows x {self.n_features} features, {self.n_train} training rows",
            self.fit.summary(),
            "run: "
            + ", ".join(f"{k} {v:.3g} s" for k, v in self.stages.items())
            + f"; total {self.seconds:.3g} s",
            f"storage: {total / 1e9:.3g} GB written ("
            + ", ".join(f"{k} {v / 1e9:.3g} GB" for k, v in self.storage_bytes.items())
            + ")",
        ]
        for name, io in self.io.items():
            moved = ", ".join(
                f"{t['what']} {t['nbytes'] / 1e9:.3g} GB in {t['objects']} objects"
                for t in io["transfers"]
            )
            lines.append(
                f"  {name}: {io['chunks']} chunks: {moved}; "
                f"{io['seconds']:.3g} s (store floor {io['store']:.3g} s)"
            )
        lines.append(f"machine: {self.fit.machine.get('source')}")
        return "\n".join(lines)


#: tasks the embedding's graph runs per block of the fit's rows it transforms: the block
#: cut out of the store's chunk, the transform, the block put into the output chunk
#: (counted on the graph of ``pipeline.embed.transform.embed_rows``:
#: tests/pipeline/test_embed_tasks.py; 121 tasks for 37 blocks in a real run's project
#: stage at 300 000 rows on the S3 server)
EMBED_TASKS_PER_BLOCK = 3


def _priced(
    transfers: list[_io.Transfer],
    m: _cost.Machine,
    chunks: int,
    cluster: _cost.Cluster,
    compute: float = 0.0,
    tasks: int = 0,
    fixed: float = 0.0,
) -> dict[str, Any]:
    parts = _io.price_transfers(
        transfers,
        m,
        chunks=chunks,
        cores=cluster.cores,
        nodes=cluster.node_count,
        compute=compute,
    )
    # one graph a stage (and its results back): the round trip, the tasks' scheduling
    # (a task a chunk and transfer, and ``tasks`` more where the stage cuts its chunks)
    tasks += chunks * (len(transfers) + 1)
    parts["tasks"] = tasks
    parts["seconds"] += m.roundtrip_seconds + tasks * m.task_seconds / max(1, cluster.workers)
    # the stage's fixed part on this store (measured: Machine.stage_seconds)
    parts["fixed"] = float(fixed)
    parts["seconds"] += float(fixed)
    return {**parts, "chunks": chunks, "transfers": [t.to_dict() for t in transfers]}


def _embed_io(
    cfg: PipelineConfig, plan: Any, n: int, n_train: int, d: int, chunks: int, machine: Any
) -> tuple[list[_io.Transfer], float, dict[str, int]]:
    """The embedding stage's traffic, its compute (core-seconds) and the bytes it and the
    ingest store leave in the output."""
    out_url, x_bytes = cfg.output.path, n * d * 8
    cols = int(plan.n_landmarks or n_train) if plan.solver == "nystroem" else n_train
    k = int(cfg.solver.n_components or 8)
    # exact models embed their training rows as V sqrt(lambda) (pipeline.embed.project): only
    # held-out rows are evaluated against the training rows; Nyström transforms every row
    evaluated = n if plan.solver == "nystroem" else n - n_train
    embed_compute = _cost.embed_seconds(evaluated, cols, d, k, machine, plan.dtype, 1)
    emb_bytes = n * k * plan.dtype.itemsize
    # the ingest store read once (the NaN check in the transform's tasks: kpca_dask.one_pass),
    # the embedding written, then read back for its checksums (the stage's fingerprint:
    # "checksums")
    embed = [
        _io.Transfer("ingest store", out_url, x_bytes, chunks, False, machine.zarr_read),
        _io.Transfer("embedding", out_url, emb_bytes, chunks, True, machine.zarr_write),
        _io.Transfer("checksums", out_url, emb_bytes, chunks, False, machine.zarr_read),
    ]
    storage = {"ingest store": x_bytes, "embedding": emb_bytes}
    if cfg.output.parquet:  # the embedding read back, a Parquet file a chunk
        pq_bytes = n * (k * plan.dtype.itemsize + 8)
        embed += [
            _io.Transfer("embedding", out_url, emb_bytes, chunks, False, machine.zarr_read),
            _io.Transfer("parquet", out_url, pq_bytes, chunks, True, machine.parquet_write),
        ]
        storage["parquet"] = pq_bytes
    return embed, embed_compute, storage


def _io_stages(
    cfg: PipelineConfig,
    planned: Any,
    fit: _cost.Estimate,
    src: Source | None,
    n: int,
    n_train: int,
    d: int,
    cluster: _cost.Cluster,
    machine: _cost.Machine,
) -> tuple[dict[str, Any], dict[str, int], dict[str, float]]:
    """The I/O stages around the fit (:mod:`kpca_dask.cost.io`): their traffic and
    prices, the bytes the run leaves in its output, and the stages' seconds so far
    (start, ingest, split, kernel store; the caller adds the solve and the embedding)."""
    from pipeline.data.readers.base import rows_per_chunk

    plan, materialize = planned.plan, planned.materialize
    cores = cluster.cores
    out_url = cfg.output.path
    # the ingest store's chunks: the readers' row chunks of about target_chunk_mb
    per_chunk = rows_per_chunk(d, cfg.chunks.target_chunk_mb)
    chunks = max(1, math.ceil(n / per_chunk))
    x_bytes = n * d * 8
    src_bytes = src.nbytes if src is not None and src.rows == n else x_bytes
    src_objects = src.objects if src is not None and src.rows == n else 1
    # a task reads its rows' range of each source object it spans (NPY, CSV: byte ranges
    # of one file; Parquet and zarr: their own files or chunks)
    reads = max(chunks, src_objects)
    io: dict[str, Any] = {}
    # each stage's fixed part on the output's store, where it was measured
    fixed = dict((machine.stage_seconds or {}).get(_io.store_scheme(out_url)) or {})
    # ingest: the source read, the rows written into the zarr store (codec and digests)
    io["ingest"] = _priced(
        [
            _io.Transfer("source", cfg.input.path, src_bytes, reads, write=False),
            _io.Transfer("ingest store", out_url, x_bytes, chunks, True, machine.zarr_write),
        ],
        machine,
        chunks,
        cluster,
        fixed=fixed.get("ingest", 0.0),
    )
    embed, embed_compute, storage = _embed_io(cfg, plan, n, n_train, d, chunks, machine)
    # Nyström (and an exact model's held-out rows) transform in blocks of the fit's rows
    evaluated = n if plan.solver == "nystroem" else n - n_train
    blocks = math.ceil(evaluated / max(1, int(plan.block_rows))) if evaluated else 0
    io["embed"] = _priced(
        embed,
        machine,
        chunks,
        cluster,
        compute=embed_compute,
        tasks=EMBED_TASKS_PER_BLOCK * blocks,
        fixed=fixed.get("embed", 0.0),
    )
    stages = {"start": float(machine.run_start_seconds), "ingest": io["ingest"]["seconds"]}
    if cfg.preprocess.scale != "none":  # the scaler's statistics: one read of the rows
        io["split"] = _priced(
            [_io.Transfer("ingest store", out_url, x_bytes, chunks, False, machine.zarr_read)],
            machine,
            chunks,
            cluster,
            fixed=fixed.get("split", 0.0),
        )
        stages["split"] = io["split"]["seconds"]
    if materialize:
        kb = fit.kernel_evaluations_per_pass * plan.dtype.itemsize
        storage["kernel store"] = int(kb)
        blocks = max(1, fit.block_tasks_per_pass)
        # the blocks' evaluation (the fit's first stage, seconds on every core)
        fill = fit.stages[1].parts.get("compute", 0.0) if len(fit.stages) > 1 else 0.0
        io["kernel store"] = _priced(
            [_io.Transfer("kernel store", out_url, kb, blocks, True, machine.zarr_write)],
            machine,
            blocks,
            cluster,
            compute=fill * cores,
        )
        stages["kernel store"] = io["kernel store"]["seconds"]
    return io, storage, stages


def plan_run(
    cfg: PipelineConfig,
    cluster: _cost.Cluster,
    machine: _cost.Machine,
    *,
    rows: int | None = None,
    features: int | None = None,
    passes: int | None = None,
    driver: str = "blocks",
) -> RunPlan:
    """The run's prediction on ``cluster`` (see the module docstring)."""
    from pipeline.model.fitspec import plan_fit

    if rows and features:
        src = None
        n, d = int(rows), int(features)
    else:
        src = read_source(cfg)
        n, d = int(rows or src.rows), int(features or src.features)
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
        # (pipeline.model.solve.nystroem_rows, memory_budget)
        persist=n_train * d * 8 <= 0.5 * (cluster.memory or 4e9) * cluster.workers,
        driver=driver,
        # the solve reads the ingest store, under the output
        store=cfg.output.path,
    )
    io, storage, stages = _io_stages(cfg, planned, fit, src, n, n_train, d, cluster, machine)
    stages["solve"] = fit.seconds
    stages["embed"] = io["embed"]["seconds"]
    return RunPlan(
        n,
        n_train,
        d,
        fit,
        stages,
        float(sum(stages.values())),
        io,
        {k_: int(v) for k_, v in storage.items()},
    )
