"""``kpca calibrate``'s I/O measurements: the local disk, an object store through fsspec
(request latency, one stream's and all streams' bandwidth) and Parquet's encoding; what
:mod:`kpca_dask.cost.io` prices a pipeline's reads and writes with."""

from __future__ import annotations

import os
import time

import numpy as np

__all__: list[str] = []


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _disk_rates(nbytes: int = 256 << 20, files: int = 64) -> tuple[float, float]:
    """(bytes/s of one stream writing a file to this machine's temporary folder and
    reading it back cold (fsync'd, then dropped from the page cache where the OS allows),
    seconds to open and read a small file)."""
    import tempfile

    data = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "big")
        t0 = time.perf_counter()
        with open(p, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        write = time.perf_counter() - t0
        fd = os.open(p, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        t0 = time.perf_counter()
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass
        read = time.perf_counter() - t0
        for i in range(files):
            with open(os.path.join(tmp, f"s{i}"), "wb") as f:
                f.write(b"x" * 4096)
        t0 = time.perf_counter()
        for i in range(files):
            with open(os.path.join(tmp, f"s{i}"), "rb") as f:
                f.read()
        latency = (time.perf_counter() - t0) / files
    # the slower direction: a stage's reads and writes both go through it
    return nbytes / max(1e-6, write, read), latency


def _store_rates(
    url: str, storage_options: dict, nbytes: int, streams: int, repeats: int = 3
) -> dict:
    """An object store's rates, measured under ``url`` (a prefix this writes below and
    removes afterwards, through :mod:`kpca_dask.removal`): ``latency`` (median seconds
    of a small object's read), ``read``/``write`` (bytes/s of one stream, an object of
    ``nbytes``), ``read_aggregate``/``write_aggregate`` (``streams`` objects at once),
    each from the median time of ``repeats`` measurements."""
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    import fsspec

    from ..removal import remove_owned_url

    fs, root = fsspec.core.url_to_fs(url.rstrip("/"), **storage_options)
    base = f"{root}/kpca-calibrate-{uuid.uuid4().hex[:8]}"
    data = np.random.default_rng(2).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    try:
        fs.pipe_file(f"{base}/small", b"x" * 1024)
        lat = []
        for _ in range(21):
            t0 = time.perf_counter()
            fs.cat_file(f"{base}/small")
            lat.append(time.perf_counter() - t0)
        latency = float(np.median(lat))

        def put(i: str) -> None:
            fs.pipe_file(f"{base}/big{i}", data)

        def get(i: str) -> None:
            fs.cat_file(f"{base}/big{i}")

        def timed(fn, ids) -> float:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(len(ids)) as pool:
                list(pool.map(fn, ids))
            return time.perf_counter() - t0

        def once(rep: int) -> tuple[float, float, float, float]:
            # new objects every time, as a stage writes them: on the S3 server, writing
            # over the same key again measured 112-148 MB/s where new keys took 72-131
            # (benchmarks/bench_store_overwrite.py)
            one, many = [f"{rep}-0"], [f"{rep}-{i}" for i in range(1, streams + 1)]
            return timed(put, one), timed(get, one), timed(put, many), timed(get, many)

        # the median of ``repeats`` of each: one of each measured a stream's write at
        # 86-148 MB/s over three calibrations minutes apart on the S3 server
        sides = [once(rep) for rep in range(max(1, repeats))]
        write1, read1, write_n, read_n = (float(np.median(t)) for t in zip(*sides))
    finally:  # the prefix this made, and only it
        remove_owned_url(
            fs, base, root=base, owned=lambda p: p.rsplit("/", 1)[-1] == base.rsplit("/", 1)[-1]
        )
    # one stream's rate net of its request's latency (the model adds that per request)
    return {
        "latency": latency,
        "read": nbytes / max(1e-6, read1 - latency),
        "write": nbytes / max(1e-6, write1 - latency),
        "read_aggregate": streams * nbytes / max(1e-6, read_n),
        "write_aggregate": streams * nbytes / max(1e-6, write_n),
        "measured_at": url,
    }


def _parquet_rate(rows: int = 1 << 20, columns: int = 16) -> float:
    """Bytes per second one thread turns an embedding's rows into Parquet as the project
    stage writes them (pipeline/embed/parquet.py): a pandas frame of an int64 ``id``,
    ``columns`` float32 components and a ``train``/``test`` text ``split`` column, built
    from the arrays and written by ``to_parquet`` (pyarrow, its default codec) into memory.

    The bytes counted are the ones the plan prices (an int64 id and the float32 components
    a row); the text column's cost is in the time. Before, an int64 split column written
    with pyarrow's default dictionary pages was timed, while the pipeline wrote text: the
    embedding's Parquet part was priced at half of what it took."""
    import io

    import pandas as pd

    rng = np.random.default_rng(3)
    emb = rng.standard_normal((rows, columns)).astype("float32")
    split = rng.random(rows) < 0.8
    names = [f"kernelpca{i}" for i in range(columns)]
    nbytes = rows * (columns * 4 + 8)

    def write() -> None:
        df = pd.DataFrame(emb, columns=names)
        df.insert(0, "id", np.arange(rows, dtype=np.int64))
        df["split"] = np.where(split, "train", "test")
        # dictionary pages for the text column only, as the pipeline writes them
        df.to_parquet(io.BytesIO(), index=False, use_dictionary=["split"])

    return nbytes / _best(write, 2)
