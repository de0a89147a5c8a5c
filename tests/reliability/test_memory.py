"""Memory: inputs travel to the workers as paths, not as bytes in the task graph."""

from __future__ import annotations

import cloudpickle
import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.data.ingest import read_input

pytestmark = pytest.mark.cluster  # its tests start processes


def test_npy_input_graph_holds_the_path_not_the_array(tmp_path):
    """A local NPY file is sliced by the workers through their own memmaps: the graph
    shipped to the scheduler stays a few kB whatever the file's size (it used to embed the
    whole memmapped array, and a worker with a small memory limit died receiving it)."""
    X = np.random.default_rng(0).standard_normal((50_000, 64))  # 25.6 MB
    np.save(tmp_path / "x.npy", X)
    cfg = load_config(
        {"input": {"path": str(tmp_path / "x.npy")}, "chunks": {"target_chunk_mb": 4}}
    )
    src = read_input(cfg.input, cfg.chunks)
    graph = dict(src.X.__dask_graph__())
    assert len(cloudpickle.dumps(graph)) < 20_000
    assert len(src.X.chunks[0]) == 7
    np.testing.assert_array_equal(src.X[12345:12350].compute(), X[12345:12350])


def test_workers_paused_for_good_fail_the_run_with_the_fix():
    """A worker paused at its memory limit whose memory never drops would wait forever; the
    pause watchdog cancels the work and names the cause. The pause threshold is set below
    the worker's own footprint (real worker process, paused by distributed's own monitor)."""
    import dask
    import dask.array as da
    import pytest

    from pipeline.config import ClusterConfig
    from pipeline.runtime.cluster import ClusterError, dask_client

    cfg = ClusterConfig(
        n_workers=1,
        threads_per_worker=1,
        memory_limit="1GiB",
        dashboard_address=None,
        paused_timeout=3,
    )
    with dask.config.set(
        {
            "distributed.worker.memory.pause": 0.01,
            "distributed.worker.memory.terminate": False,
            "distributed.worker.memory.monitor-interval": "50ms",
        }
    ):
        with pytest.raises(
            ClusterError,
            match=r"every worker has been paused at its memory "
            r"limit \(1\.00 GiB\) for 3 s.*cluster\.memory_limit",
        ):
            with dask_client(cfg) as client:
                client.compute(da.ones((100, 100), chunks=10).sum()).result(timeout=120)


def test_local_cluster_workers_keep_block_buffers_for_reuse():
    """distributed spawns workers with MALLOC_TRIM_THRESHOLD_=65536, which makes every
    block-sized buffer a fresh mmap (page faults, zeroing: twice the time of a stored
    kernel pass). A local cluster's worker processes get the settings of
    pipeline.runtime.cluster.WORKER_MALLOC_ENV instead -- checked in the real worker
    processes."""
    import os

    from pipeline.config import ClusterConfig
    from pipeline.runtime.cluster import WORKER_MALLOC_ENV, dask_client

    cfg = ClusterConfig(n_workers=2, threads_per_worker=1, dashboard_address=None)
    with dask_client(cfg) as client:
        seen = client.run(lambda: {k: os.environ.get(k) for k in WORKER_MALLOC_ENV})
        pids = client.run(os.getpid)
    assert len(seen) == 2 and set(pids.values()) != {os.getpid()}
    for env in seen.values():
        assert env == {k: str(v) for k, v in WORKER_MALLOC_ENV.items()}


_HELD: list = []


def _fragment_heap() -> int:
    """Allocate 300 one-MB buffers on the heap, free every other one (holes glibc does not
    trim by itself), and return the resident set size."""
    import psutil

    bufs = [np.ones(1 << 17) for _ in range(300)]  # 1 MiB each: below the mmap threshold
    _HELD[:] = bufs[1::2]
    del bufs
    return psutil.Process().memory_info().rss


def _held() -> int:
    return len(_HELD)


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def test_release_worker_memory_returns_freed_heap_of_real_workers():
    """release_worker_memory (malloc_trim on every worker) gives the holes freed buffers
    leave in a worker's heap back to the OS; the workers keep what is still in use."""
    from pipeline.config import ClusterConfig
    from pipeline.runtime.cluster import dask_client, release_worker_memory

    release_worker_memory()  # without a client: nothing to do, no error
    cfg = ClusterConfig(n_workers=2, threads_per_worker=1, dashboard_address=None)
    with dask_client(cfg) as client:
        before = client.run(_fragment_heap)
        release_worker_memory()
        after = client.run(_rss)
        held = client.run(_held)
    assert set(held.values()) == {150}
    for w in before:  # 150 MiB of holes: most of it goes back
        assert before[w] - after[w] > 100 << 20, (before[w], after[w])
