"""Workers that stop answering or pause, on a real local cluster (pipeline/runtime/liveness.py).

A worker process is frozen with SIGSTOP (its connection to the scheduler stays open, so
distributed never calls it lost) and thawed with SIGCONT in every test's teardown. Shown:

- ``run_on_workers`` answers for the live workers and names the frozen one after its
  timeout instead of waiting for ever;
- the worker watch turns a computation waiting on the frozen worker into one
  WorkerTimeoutError naming the worker and the activity, within the timeout (plus the
  poll interval), and refuses to start the next activity;
- a worker paused at its memory limit is logged by name as it pauses, and as it resumes;
- the probe removes the stale probe files a killed client left, not a fresh one.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.clusters import local_cluster

pytestmark = [pytest.mark.distributed, pytest.mark.cluster]


@pytest.fixture
def cluster():
    """Two single-threaded worker processes on 127.0.0.1 (no nanny: a worker's pid is the
    worker), a client, and each worker's pid by address."""
    from distributed import Client

    with (
        local_cluster(2) as lc,
        Client(lc) as client,
    ):
        pids = client.run(os.getpid)
        stopped: list[int] = []
        try:
            yield client, pids, stopped
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)


def _stop(pids, stopped, address) -> None:
    os.kill(pids[address], signal.SIGSTOP)
    stopped.append(pids[address])


def test_run_on_workers_names_the_frozen_worker(cluster):
    from pipeline.runtime.liveness import run_on_workers

    client, pids, stopped = cluster
    frozen, live = sorted(pids)
    _stop(pids, stopped, frozen)
    t = time.monotonic()
    answers, silent = run_on_workers(client, os.getpid, timeout=3)
    took = time.monotonic() - t
    assert silent == [frozen]
    assert answers == {live: pids[live]}
    assert 3 <= took < 30  # waited the timeout, not for ever


def test_watch_names_the_frozen_worker_and_the_activity(cluster):
    from distributed import wait

    from pipeline.runtime.liveness import WorkerTimeoutError, activity, watching

    client, pids, stopped = cluster
    frozen = sorted(pids)[0]
    _stop(pids, stopped, frozen)
    t = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as err:
        with watching(client, 3), activity("stage 'solve'"):
            fut = client.submit(np.ones, 10, workers=[frozen], pure=False)
            wait(fut, timeout=120)  # would time out (and fail the test) without the watch
            fut.result()
    took = time.monotonic() - t
    msg = str(err.value)
    assert frozen in msg and "during the stage 'solve'" in msg
    assert "no heartbeat for more than 3 s" in msg and "\n" not in msg
    assert took < 60
    assert err.value.retry is False  # a flow's task does not wait for it again


def test_watch_refuses_the_next_activity_once_tripped(cluster):
    from pipeline.runtime.liveness import WorkerTimeoutError, activity, watching

    client, pids, stopped = cluster
    _stop(pids, stopped, sorted(pids)[0])
    with pytest.raises(WorkerTimeoutError):
        with watching(client, 2) as watch:
            with activity("stage 'ingest'"):
                t_end = time.monotonic() + 60
                while not watch.tripped and time.monotonic() < t_end:
                    time.sleep(0.2)
            with activity("stage 'split'"):  # refused: nothing more is submitted
                pytest.fail("the next stage started after a worker stopped answering")


def test_a_local_worker_that_stops_answering_leaves_its_threads_stacks(caplog):
    """A worker of a local cluster the run started whose event loop is held (what a
    deadlock or a call holding the GIL does: no heartbeat, no ``Client.run``): besides the
    one-line WorkerTimeoutError, the log names a file that keeps every one of its threads'
    stacks, written by the worker itself on SIGUSR1 (pipeline/runtime/stacks.py), and the
    held function is in it."""
    from pipeline.config import ClusterConfig
    from pipeline.runtime.cluster import dask_client
    from pipeline.runtime.liveness import WorkerTimeoutError, activity

    async def _hold_the_event_loop(seconds):  # on the worker's event loop, blocking it
        time.sleep(seconds)

    cfg = ClusterConfig(n_workers=2, dashboard_address=None, worker_timeout=3)
    caplog.set_level(logging.WARNING, logger="pipeline")
    with pytest.raises(WorkerTimeoutError) as err:
        with dask_client(cfg) as client, activity("stage 'ingest'"):
            held = sorted(client.scheduler_info()["workers"])[0]
            client.run(_hold_the_event_loop, 20, workers=[held], wait=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                client.submit(np.ones, 3, workers=[held], pure=False).result(timeout=60)
    assert held in str(err.value)
    kept = [r for r in caplog.records if "threads' stacks are in" in r.getMessage()]
    assert len(kept) == 1 and held in kept[0].getMessage(), caplog.text
    path = Path(kept[0].getMessage().rsplit(" are in ", 1)[1])
    stacks = path.read_text()
    path.unlink()
    assert "most recent call first" in stacks and "_hold_the_event_loop" in stacks, stacks


def test_no_activity_no_trip(cluster):
    """Between activities (nothing of the run is waiting) a frozen worker is not a failure."""
    from pipeline.runtime.liveness import watching

    client, pids, stopped = cluster
    _stop(pids, stopped, sorted(pids)[0])
    with watching(client, 1) as watch:
        time.sleep(4)
        assert watch.tripped is None


def test_paused_worker_is_logged_by_name(caplog):
    """A worker at 80 % of its memory limit pauses (distributed); the watch logs it by
    name as it pauses, and again when it resumes."""
    from distributed import Client, LocalCluster

    from pipeline.runtime.liveness import watching

    def rss(dask_worker=None) -> int:
        import psutil

        return psutil.Process().memory_info().rss

    def hold(nbytes: int, dask_worker=None) -> int:
        dask_worker._kpca_ballast = np.ones(nbytes // 8)
        return nbytes

    def drop(dask_worker=None) -> None:
        dask_worker._kpca_ballast = None

    limit = 512 << 20
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            memory_limit=limit,
            silence_logs=logging.ERROR,
        ) as lc,
        Client(lc) as client,
        caplog.at_level(logging.INFO, logger="pipeline"),
        watching(client, None),
    ):
        (addr, base), *_ = client.run(rss).items()
        client.run(hold, int(0.88 * limit) - base)  # between pause (80 %) and kill (95 %)

        def logged(word: str) -> bool:
            msgs = [r.getMessage() for r in caplog.records]
            return any(word in m and addr in m for m in msgs)

        t_end = time.monotonic() + 60
        while not logged("paused at its memory limit") and time.monotonic() < t_end:
            time.sleep(0.2)
        assert logged("paused at its memory limit"), [r.getMessage() for r in caplog.records]
        client.run(drop)
        t_end = time.monotonic() + 60
        while not logged("resumed") and time.monotonic() < t_end:
            time.sleep(0.2)
        assert logged("resumed")


def test_probe_removes_stale_probe_files_only(dask_client, tmp_path: Path):
    """Probe files a killed client left (an hour old by the time in their name) go with
    the next probe of that folder; a fresh one (another probe under way) stays."""
    from pipeline.runtime.visibility import PROBE_PREFIX, ProbeTarget, check_locations

    out = tmp_path / "out"
    out.mkdir()
    stale = out / f"{PROBE_PREFIX}{int(time.time()) - 7200}-abcdef.client"
    fresh = out / f"{PROBE_PREFIX}{int(time.time()) - 60}-012345.client"
    for f in (stale, fresh):
        f.write_text("x")
    res = check_locations([ProbeTarget("output", str(out), {}, True)], dask_client)
    assert res["workers"] == 2
    assert not stale.exists() and fresh.exists()
    assert sorted(p.name for p in out.iterdir()) == [fresh.name]  # its own files gone too
