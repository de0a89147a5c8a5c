"""The cluster a fit is priced on (:class:`Cluster`): workers, threads, memory, network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Cluster"]


@dataclass(frozen=True)
class Cluster:
    """The cluster a fit runs on: ``workers`` processes of ``threads`` threads, each with
    ``memory`` bytes; ``network`` bytes/s per node (None: the machine's)."""

    workers: int = 1
    threads: int = 1
    memory: float | None = None
    network: float | None = None
    #: False for the threaded scheduler (tasks in the client's process: no transfers).
    distributed: bool = True

    @property
    def cores(self) -> int:
        return max(1, int(self.workers) * int(self.threads))

    @classmethod
    def from_client(cls, client: Any) -> Cluster:
        info = client.scheduler_info(n_workers=-1)["workers"]
        threads = [int(w.get("nthreads", 1)) for w in info.values()] or [1]
        mem = [float(w.get("memory_limit") or 0) for w in info.values()]
        return cls(
            workers=len(threads),
            threads=max(1, round(sum(threads) / len(threads))),
            memory=min(mem) if mem and all(mem) else None,
        )

    @classmethod
    def local(cls) -> Cluster:
        """The threaded scheduler in this process."""
        import psutil

        from ..threads import cpu_count

        return cls(
            workers=1,
            threads=cpu_count(),
            memory=float(psutil.virtual_memory().available),
            distributed=False,
        )
