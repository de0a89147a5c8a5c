"""What every solver's pricing shares: the fit's shapes and constants (:class:`_Fit`),
the figures a solver returns (:class:`_Priced`), reading the input, the row blocks and
the kernel evaluations of a pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cluster import Cluster
from .machine import Machine
from .result import Stage

__all__ = ["EXPECTED_PASSES", "TASK_GRAPH_BYTES", "exact_waves"]

#: Passes of an ``n_power_iter="auto"`` fit when the caller does not say: the exact
#: fits measured here took 4-13 passes (README: 13 at n = 20 000 with a flat tail,
#: 6-7 on well separated spectra) and Nyström's randomized method about 6
#: (nystroem.estimated_cost). The certification pass is included.
EXPECTED_PASSES = {"randomized": 10, "nystroem": 6, "arpack": 10}

#: Bytes of the graph per block task (its key, function reference and argument keys
#: as pickled by distributed; measured from ``len(pickle.dumps(task))``).
TASK_GRAPH_BYTES = 250


def exact_waves(row_chunks: Any, wave_tasks: int) -> list[tuple[int, int]]:
    """The waves of one exact product: the driver's own rule
    (:func:`kpca_dask.gram.exact_waves`, imported here on use: this module loads no dask)."""
    from ..gram import exact_waves as waves

    return waves(row_chunks, wave_tasks)


def _row_chunks(n: int, r: int) -> list[int]:
    return [min(r, n - a) for a in range(0, n, r)]


def _kernel_evals(chunks: list[int], itemsize: int) -> int:
    from ..gram import _strip_rows

    total = sum(chunks)
    off = sum(ci * (total - s - ci) for ci, s in zip(chunks, np.cumsum([0, *chunks[:-1]])))
    diag = 0
    for r in chunks:
        step = _strip_rows(r, itemsize)
        diag += sum((min(a + step, r) - a) * (r - a) for a in range(0, r, step))
    return int(off + diag)


def _elementwise(kernel_name: str) -> float:
    """Elementwise cost of a kernel value in exp evaluations (clip + exp for rbf)."""
    return {"linear": 0.0, "cosine": 0.0, "poly": 0.5, "polynomial": 0.5}.get(kernel_name, 1.0)


def _kernel_name(plan: Any, params: dict | None) -> str:
    k = getattr(plan, "kernel", None)
    name = getattr(k, "name", None)
    if isinstance(name, str):
        return name
    kp = (params or {}).get("kernel", "rbf")
    return kp if isinstance(kp, str) else "callable"


@dataclass
class _Fit:
    """What every solver's pricing reads (the plan's shape, the cluster, the machine's
    constants) and what it adds to (the stages and the assumptions, in order)."""

    plan: Any
    cl: Cluster
    m: Machine
    params: dict | None
    passes: int | None
    n: int
    d: int
    r: int
    dtype: np.dtype
    k: int
    c: int
    elem: float
    chunks: list[int]
    net: float
    #: rows of X on the workers for the whole fit (else re-read at every pass)
    persisted: bool = True
    #: float32 blocks under a float64 model (``dtype`` is then the blocks' float32):
    #: the cache is filled from a float64 evaluation and one float64 pass certifies
    mixed: bool = False
    #: "blocks" (the drivers as they run) or "workers" (per-worker, :mod:`.price_workers`)
    driver: str = "blocks"
    #: URL of the store the workers read the rows from (None or a path: the local disk)
    store: str | None = None
    stages: list[Stage] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def item(self) -> int:
        return self.dtype.itemsize

    @property
    def W(self) -> int:
        return max(1, self.cl.workers)

    @property
    def cores(self) -> int:
        return self.cl.cores

    @property
    def remote(self) -> float:
        """The share of a task's inputs on another worker."""
        return 1.0 - 1.0 / self.W if self.cl.distributed else 0.0

    @property
    def nb(self) -> int:
        return len(self.chunks)

    @property
    def rt(self) -> float:
        return self.m.roundtrip_seconds if self.cl.distributed else 0.0

    @property
    def ts(self) -> float:
        return self.m.task_seconds if self.cl.distributed else 5e-5  # the threaded scheduler's

    @property
    def client_bw(self) -> float:
        return self.m.mem_bandwidth  # the driver's one thread

    @property
    def x_bytes(self) -> int:
        return self.n * self.d * 8

    def stage(
        self, name: str, parts: dict[str, float], count: int = 1, serial: str = "client"
    ) -> None:
        # network and storage overlap the tasks; the scheduler's time adds to the
        # compute (with dask's queuing a worker thread gets its next task when it
        # reports one finished: measured here, passes of 75 tasks took compute plus
        # the scheduler's time, not the larger of the two); the client's serial work
        # between passes adds to everything
        busy = parts.get("compute", 0.0) + parts.get("scheduler", 0.0)
        rest = [v for k_, v in parts.items() if k_ not in (serial, "compute", "scheduler")]
        sec = max([busy, *rest]) + parts.get(serial, 0.0)
        bound = max(parts, key=parts.get) if parts else serial
        self.stages.append(
            Stage(name, sec * count, bound, {k_: v * count for k_, v in parts.items()}, count)
        )


@dataclass
class _Priced:
    """A solver's figures per pass (the main pass) and for the whole fit."""

    passes: int
    passes_range: tuple[int, int]
    columns: int
    tasks: int
    block_tasks: int
    waves: int
    graph_bytes: float
    evals: float
    flops: float
    to_client: float
    from_client: float
    w2w: int
    storage: float
    mem_worker: float
    mem_client: float
    kernel_cache: str | None = None
    kernel_cache_bytes: int = 0
    kernel_cache_share: float = 0.0


def _fit_of(
    plan: Any,
    cluster: Cluster | None,
    machine: Machine | None,
    n_components: int | None,
    n_oversamples: int,
    passes: int | None,
    params: dict | None,
) -> _Fit:
    cl = cluster or Cluster()
    m = machine or Machine()
    n, d = int(plan.n_samples), int(plan.n_features)
    r = int(plan.block_rows)
    k = int(n_components or min(n, 8))
    return _Fit(
        plan=plan,
        cl=cl,
        m=m,
        params=params,
        passes=passes,
        n=n,
        d=d,
        r=r,
        dtype=np.dtype(plan.block_dtype if getattr(plan, "mixed", False) else plan.dtype),
        mixed=bool(getattr(plan, "mixed", False)),
        k=k,
        c=min(n, k + int(n_oversamples)),
        elem=_elementwise(_kernel_name(plan, params)),
        chunks=_row_chunks(n, r),
        net=float(cl.network or m.network),
    )


def _read(f: _Fit, input_in_memory: bool, persist: bool | None) -> dict[str, float]:
    """The parts of reading the input once (persist / rechunk): from the client (numpy
    input: through its network link) or by the workers from storage; sets
    ``f.persisted``."""
    cl, m, x_bytes = f.cl, f.m, f.x_bytes
    from_storage = not input_in_memory
    if persist is not None:
        f.persisted = bool(persist)
    elif from_storage and f.plan.solver == "nystroem":
        f.persisted = x_bytes <= (256 << 20)
    else:
        f.persisted = True
    if from_storage and f.store and "://" in f.store and not f.store.startswith("file://"):
        # an object store (kpca_dask.cost.io): a request a zarr chunk, the streams' rates,
        # decoding on the cores, floored by the nodes' aggregate
        from .io import Transfer, price_transfers

        objects = max(f.nb, -(-x_bytes // (64 << 20)))
        stored = price_transfers(
            [Transfer("rows", f.store, x_bytes, objects, False, m.zarr_read)],
            m,
            chunks=f.nb,
            cores=f.cores,
            nodes=cl.node_count,
        )["seconds"]
    elif from_storage:  # a zarr source: the disk's bandwidth, or decoding, the slower
        stored = max(x_bytes / (m.storage * f.W), x_bytes / (m.zarr_read * f.cores))
    else:
        stored = 0.0
    read = {
        "network": (x_bytes / f.net) if cl.distributed and not from_storage else 0.0,
        "storage": stored,
        "scheduler": 3 * f.rt + f.nb * f.ts,
    }
    if f.plan.solver != "nystroem":  # the training rows come to the client after the solve
        read["client"] = x_bytes / f.net if cl.distributed else x_bytes / f.client_bw
    if not f.persisted:
        read = {"scheduler": f.rt}
        f.assumptions.append("rows re-read from storage at every pass (above 256 MB)")
    return read
