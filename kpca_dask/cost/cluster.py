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
    #: Machines the workers run on (None: one worker a node); their storage and network
    #: links are what the I/O stages share (:mod:`kpca_dask.cost.io`).
    nodes: int | None = None

    @property
    def cores(self) -> int:
        return max(1, int(self.workers) * int(self.threads))

    @property
    def node_count(self) -> int:
        return max(1, int(self.nodes if self.nodes is not None else self.workers))

    @classmethod
    def from_client(cls, client: Any) -> Cluster:
        """The cluster ``client``'s scheduler knows: its workers, their threads (the
        mean), the smallest memory limit, and the hosts they run on."""
        info = client.scheduler_info(n_workers=-1)["workers"]
        threads = [int(w.get("nthreads", 1)) for w in info.values()] or [1]
        mem = [float(w.get("memory_limit") or 0) for w in info.values()]
        hosts = {str(w.get("host") or addr.rsplit(":", 1)[0]) for addr, w in info.items()}
        return cls(
            workers=len(threads),
            threads=max(1, round(sum(threads) / len(threads))),
            memory=min(mem) if mem and all(mem) else None,
            nodes=max(1, len(hosts)),
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
