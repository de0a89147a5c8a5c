"""The I/O a pipeline's stages do around the fit, priced from chunk counts and store rates.

A stage that reads or writes a store runs one task per row chunk (the ingest store's
chunks: the readers' ``target_chunk_mb``); each task, on one thread, pays per object it
touches the store's request latency, then the bytes at one stream's bandwidth, then the
format's own cost on its core (zarr's codec and the chunk digests, Parquet's encoding).
The chunks run ``min(chunks, cores)`` at a time, in waves; the streams a node runs at
once share the store's aggregate rate for that node (an object store's, measured by
``kpca calibrate --store``; the local disk's one stream), so each gets at most its share of
it, and one stream's rate alone when that is lower. So

    per-stream rate = min(one stream's rate, aggregate rate / streams a node runs at once)
    seconds = waves x (per-chunk seconds of the largest wave's tasks)
              floored by  bytes / (aggregate rate x nodes)

The rates are a :class:`~kpca_dask.cost.machine.Machine`'s (``storage``, ``disk_latency``,
``object_stores``, ``zarr_write``, ``zarr_read``, ``parquet_write``). Nothing here opens a
store; :mod:`pipeline.sizing` says which stage touches which store with how many bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .machine import Machine

__all__ = ["Transfer", "price_transfers", "store_rates", "store_scheme"]


def store_scheme(url: str) -> str:
    """The store ``url`` lives on, as rates are keyed: its URL scheme, ``file`` locally."""
    return _scheme(url)


def _scheme(url: str) -> str:
    url = str(url)
    if "://" not in url or url.startswith("file://"):
        return "file"
    return url.split("://", 1)[0].lower()


def store_rates(m: Machine, url: str, write: bool) -> dict[str, float]:
    """``latency`` (s a request), ``stream`` (bytes/s of one stream) and ``aggregate``
    (bytes/s of a node's streams together) of the store ``url`` lives on."""
    scheme = _scheme(url)
    if scheme == "file":
        return {"latency": m.disk_latency, "stream": m.storage, "aggregate": m.storage}
    r = m.object_store(scheme)
    kind = "write" if write else "read"
    return {
        "latency": r["latency"],
        "stream": r[kind],
        "aggregate": r[f"{kind}_aggregate"],
    }


@dataclass
class Transfer:
    """One stage's traffic with one store: ``objects`` requests of ``nbytes`` in total,
    ``write`` or read, with a format cost of ``format_rate`` bytes/s a core (0: none)."""

    what: str
    url: str
    nbytes: float
    objects: int
    write: bool
    format_rate: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def price_transfers(
    transfers: list[Transfer],
    m: Machine,
    *,
    chunks: int,
    cores: int,
    nodes: int,
    compute: float = 0.0,
) -> dict[str, float]:
    """Seconds of a stage whose ``chunks`` tasks each do their share of ``transfers`` one
    after the other, ``compute`` core-seconds of work besides (spread over the tasks), on
    ``cores`` threads of ``nodes`` nodes. Returns the parts: ``io`` (requests and bytes at
    the streams' rates, the formats' costs, the compute: what the tasks wait for),
    ``store`` (the aggregate floor) and ``seconds`` (the larger)."""
    chunks = max(1, int(chunks))
    streams = max(1, min(chunks, int(cores)))
    waves = math.ceil(chunks / streams)
    per_node = math.ceil(streams / max(1, int(nodes)))  # streams a node runs at once
    per_chunk = compute / chunks
    floor = 0.0
    for t in transfers:
        r = store_rates(m, t.url, t.write)
        share = t.nbytes / chunks
        requests = t.objects / chunks
        rate = min(r["stream"], r["aggregate"] / per_node)
        per_chunk += requests * r["latency"] + share / rate
        if t.format_rate:
            per_chunk += share / t.format_rate
        floor = max(floor, t.nbytes / (r["aggregate"] * max(1, int(nodes))))
    io = waves * per_chunk
    return {"io": io, "store": floor, "seconds": max(io, floor)}
