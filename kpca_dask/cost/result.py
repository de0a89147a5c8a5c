"""What :func:`~kpca_dask.cost.estimate` returns: an :class:`Estimate` of one fit, made of
:class:`Stage` records (seconds by resource, and the resource that bounds each)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Estimate", "Stage"]


@dataclass
class Stage:
    """One stage of a fit (``count`` passes of it together): its seconds, the resource
    that bounds it, and the seconds of each resource."""

    name: str
    seconds: float
    bound: str
    #: seconds by resource (compute, memory bandwidth, network, scheduler, client)
    parts: dict[str, float]
    count: int = 1


@dataclass
class Estimate:
    """What :func:`estimate` predicts for one fit (per pass figures for the main pass)."""

    solver: str
    n_samples: int
    n_features: int
    block_rows: int
    n_blocks: int
    passes: int
    passes_range: tuple[int, int]
    columns: int
    tasks_per_pass: int
    block_tasks_per_pass: int
    waves_per_pass: int
    graph_bytes_per_pass: int
    kernel_evaluations_per_pass: int
    flops_per_pass: float
    bytes_to_client_per_pass: int
    bytes_from_client_per_pass: int
    worker_to_worker_bytes_per_pass: int
    storage_bytes_per_pass: int
    memory_per_worker: int
    memory_client: int
    stages: list[Stage]
    seconds: float
    bound: str
    cluster: dict
    machine: dict
    assumptions: list[str]
    #: Where an exact solver's kernel blocks come from after the first pass ("memory",
    #: "partial", "recompute", "store"; None for Nyström and dense).
    kernel_cache: str | None = None
    #: Bytes of the kept kernel blocks on all workers ("memory" and "partial" tiers).
    kernel_cache_bytes: int = 0
    #: Share of a later pass's kernel evaluations read from kept blocks instead (1.0:
    #: "memory", between 0 and 1: "partial", 0.0: evaluated or read from a store).
    kernel_cache_share: float = 0.0
    #: The driver priced: "blocks" (as they run) or "workers" (issue 38's per-worker ones).
    driver: str = "blocks"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passes_range"] = list(self.passes_range)
        return d

    def summary(self) -> str:
        """A few lines for a terminal."""
        gb = 1e9
        c = self.cluster
        lines = [
            f"{self.solver} solver ({self.driver} driver), n={self.n_samples}, "
            f"d={self.n_features}: "
            f"{self.n_blocks} blocks of {self.block_rows} rows, {self.passes} passes "
            f"(range {self.passes_range[0]}-{self.passes_range[1]}), {self.columns} columns",
            f"cluster: {c['workers']} workers x {c['threads']} threads"
            + (f", {c['memory'] / gb:.1f} GB each" if c.get("memory") else ""),
            f"per pass: {self.tasks_per_pass} tasks ({self.block_tasks_per_pass} block "
            f"tasks, {self.waves_per_pass} waves), {self.flops_per_pass / 1e12:.3g} Tflop, "
            f"to client {self.bytes_to_client_per_pass / gb:.3g} GB, from client "
            f"{self.bytes_from_client_per_pass / gb:.3g} GB, worker to worker "
            f"{self.worker_to_worker_bytes_per_pass / gb:.3g} GB, storage "
            f"{self.storage_bytes_per_pass / gb:.3g} GB",
            f"memory: {self.memory_per_worker / gb:.3g} GB per worker, "
            f"{self.memory_client / gb:.3g} GB on the client"
            + (
                f", kernel cache {self.kernel_cache} {self.kernel_cache_bytes / gb:.3g} GB "
                f"({self.kernel_cache_share:.0%} of a pass's kernel values)"
                if self.kernel_cache in ("memory", "partial")
                else ""
            ),
        ]
        for s in self.stages:
            each = f" ({s.count} x {s.seconds / max(1, s.count):.3g} s)" if s.count > 1 else ""
            lines.append(f"  {s.name:<12} {s.seconds:10.3g} s{each}  bound: {s.bound}")
        lines.append(f"  {'total':<12} {self.seconds:10.3g} s  bound: {self.bound}")
        return "\n".join(lines)
