"""The measured constants of one node (:class:`Machine`) and where a calibration lives.

The built-in values are one quiet ``kpca calibrate`` of this project's machine, rounded
(benchmarks/results/calibration-2026-11-26.json, written in here as the dataclass's
defaults: nothing reads that file at run time); ``kpca calibrate``
(:func:`kpca_dask.cost.calibrate`) writes the machine at hand's to
:func:`default_calibration_path`, and :func:`load_machine` reads it back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Machine", "default_calibration_path", "load_machine"]


@dataclass(frozen=True)
class Machine:
    """Measured constants of one node (per core unless said otherwise).

    The built-in values are one quiet ``kpca calibrate`` of this project's 2-core
    AVX-512 machine (OpenBLAS SkylakeX kernels), 2026-11-26, rounded:
    benchmarks/results/calibration-2026-11-26.json. ``kpca calibrate`` replaces them
    with the machine at hand's (``storage`` and ``run_start_seconds`` are given, not
    measured).
    """

    #: GEMM flops per second on one core, by dtype name.
    gemm_flops: dict = field(default_factory=lambda: {"float64": 5.5e10, "float32": 1.5e11})
    #: exp evaluations per second on one core (numpy's, in place), by dtype name.
    exp_rate: dict = field(default_factory=lambda: {"float64": 1.2e9, "float32": 1.9e9})
    #: Streaming memory bandwidth of one core (bytes/s; a copy counts read + write).
    mem_bandwidth: float = 2.5e10
    #: Bytes per second one core takes new pages into use (their first touch: a page
    #: fault and the zeroing each): what the memory tier's first pass pays on top of
    #: evaluating the blocks it keeps, which land on new pages as the cache grows. A
    #: 16 MB block took twice as long into new pages as into reused memory here
    #: (docs/scaling.md). Measured by ``kpca calibrate`` with every core at once, on
    #: pages held as the kept blocks are (since 2026-11-29: a VM gave pages it had just
    #: freed back 4-5x faster than new ones); the built-in value is the 2026-11-27 Xeon's
    #: (2.6e9, measured on pages freed in turn), the others 2026-11-26's.
    page_touch: float = 2.6e9
    #: Scheduler (and worker bookkeeping) seconds per task of a large graph.
    task_seconds: float = 2.0e-3
    #: ``kpca calibrate``'s seconds per task and round trip on a LocalCluster, whose
    #: scheduler runs in the client's process (``task_seconds`` above is measured with the
    #: scheduler in its own process, as deployed, since 2026-11-28); a record only.
    scheduler_in_client: dict = field(default_factory=dict)
    #: Seconds from submitting a one-task graph to having its result on the client.
    roundtrip_seconds: float = 0.012
    #: Network bandwidth of a node, each direction (bytes/s): 10 Gbit/s.
    network: float = 1.25e9
    #: Storage read/write bandwidth of a node's local disk (bytes/s, one stream; cold
    #: reads: the page cache dropped). ``kpca calibrate`` measures it since 2026-11-28
    #: (:func:`kpca_dask.cost.calibration._disk_rates`); the built-in value is given.
    storage: float = 5.0e8
    #: Seconds per file or object opened on the local disk (open + first read).
    disk_latency: float = 1.0e-4
    #: An object store reached through fsspec, by URL scheme (``s3``, ``gs``, ``az``,
    #: ...; ``*`` for any other): ``latency`` seconds per request, ``read`` and ``write``
    #: bytes/s of one stream, ``read_aggregate`` / ``write_aggregate`` bytes/s of all a
    #: node's streams together. ``kpca calibrate --store URL`` measures the store given
    #: (:func:`kpca_dask.cost.calibration._store_rates`); the built-in ``*`` entry is
    #: given, not measured: a cloud object store's usual 30 ms first byte and 100 MB/s a
    #: stream, a node's streams together at its network's rate.
    object_stores: dict = field(
        default_factory=lambda: {
            "*": {
                "latency": 0.03,
                "read": 1.0e8,
                "write": 1.0e8,
                "read_aggregate": 1.25e9,
                "write_aggregate": 1.25e9,
            }
        }
    )
    #: Bytes per second one core writes a Parquet file of the embedding's columns
    #: (pyarrow, snappy) into memory: the format's own cost, the store's is added.
    parquet_write: float = 2.0e8
    #: Bytes per second one core writes into / reads from a local zarr store with zarr's
    #: default codec, in 64 MB chunks with a digest each (what a pipeline's ingest,
    #: scaling and embedding stages pay per byte of rows beyond the storage itself).
    zarr_write: float = 1.9e8  # benchmarks/results/calibration-2026-11-26-2.json
    zarr_read: float = 1.7e8
    #: Fixed start of a pipeline run (``kpca run``: imports, the Prefect API, starting
    #: the cluster), priced by ``kpca plan``; not calibrated (given). Measured on the
    #: development machine as the command's wall time less its stages' total: 17-18 s
    #: (benchmarks/bench_pipeline.py exact, 2026-11-26).
    run_start_seconds: float = 17.5
    #: Fixed seconds of a pipeline's I/O stages besides their chunks, by the URL scheme of
    #: the store they write ("s3", "file", ...) and stage ("ingest", "split", "embed"):
    #: the client's own requests, the first stage's worker imports. Measured by ``kpca
    #: calibrate --store`` with a tiny real run (pipeline/runtime/stage_calibration.py);
    #: none priced for a store not measured.
    stage_seconds: dict = field(default_factory=dict)
    #: Measured time of the real block tasks, run on every core at once, over the time
    #: the rates above predict for them (:func:`kpca_dask.cost.calibration._block_factors`):
    #: ``recompute`` (a block evaluated strip by strip and multiplied), ``fill`` (a whole
    #: block evaluated as the kernel cache's first pass does, into reused memory: the new
    #: pages are ``page_touch``'s; files of earlier calibrations measured it on new pages,
    #: sometimes) and ``stored`` (a kept block multiplied). Above 1 when cores slow each
    #: other down (shared caches, memory bandwidth, clock) or a kernel misses the rates'
    #: shapes (repeated calibrations here spread 1.4-2.0 for ``recompute``; the predicted
    #: time of the exact 100k pipeline's solve from them, 64-86 s).
    block_factors: dict = field(
        default_factory=lambda: {
            "float32": {"recompute": 2.0, "fill": 2.7, "fill_large": 6.1, "stored": 2.8},
            "float64": {"recompute": 1.8, "fill": 3.6, "fill_large": 5.4, "stored": 2.8},
        }
    )
    cpu: str = ""
    simd: str = ""
    source: str = "built-in defaults (quiet 2-core AVX-512 node, kpca calibrate 2026-11-26)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Machine:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})

    def gemm(self, dtype: Any) -> float:
        return float(self.gemm_flops.get(np.dtype(dtype).name, self.gemm_flops["float64"]))

    def exp(self, dtype: Any) -> float:
        return float(self.exp_rate.get(np.dtype(dtype).name, self.exp_rate["float64"]))

    def object_store(self, scheme: str) -> dict[str, float]:
        """The object store rates for URL scheme ``scheme`` (the ``*`` entry, else the
        built-in one, when it was not calibrated)."""
        stores = self.object_stores or {}
        got = stores.get(scheme) or stores.get("*") or Machine().object_stores["*"]
        base = Machine().object_stores["*"]
        return {k: float(got.get(k, base[k])) for k in base}

    def factor(self, kind: str, dtype: Any = "float64") -> float:
        f = (self.block_factors or {}).get(np.dtype(dtype).name) or {}
        return float(f.get(kind, 1.0))


#: Where ``kpca calibrate`` writes and the estimator looks (``KPCA_CALIBRATION`` wins).
def default_calibration_path() -> Path:
    env = os.environ.get("KPCA_CALIBRATION")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kpca" / "calibration.json"


def load_machine(path: str | os.PathLike | None = None) -> Machine:
    """The calibrated machine at ``path`` (default :func:`default_calibration_path`), else
    the built-in defaults (their ``source`` says so). A file that cannot be read is an
    error only when ``path`` was given."""
    p = Path(path) if path is not None else default_calibration_path()
    try:
        return Machine.from_dict(json.loads(p.read_text()))
    except (OSError, ValueError, TypeError):
        if path is not None:
            raise
        return Machine()
