"""Shared fixtures: data sets and a real multi-process Dask cluster on 127.0.0.1.

The ``cluster`` marker: a test that starts other processes (a dask cluster, a Prefect
server, an object-store server, a ``kpca`` command, a fresh Python). ``pytest -m "not slow
and not cluster"`` is the fast loop. The marker is added here to every test that uses a
process-starting fixture or lives in a folder whose tests all do, and declared with
``pytestmark`` in the other modules that need it; a test without it that starts a
process fails (``_no_process_unless_marked``), so the fast loop stays what it says.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing.process
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import make_blobs, make_circles, make_moons


def _datasets(n: int = 300, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "blobs": make_blobs(n, n_features=4, centers=4, random_state=seed)[0],
        "moons": make_moons(n, noise=0.05, random_state=seed)[0],
        "circles": make_circles(n, noise=0.05, factor=0.4, random_state=seed)[0],
        "random": rng.standard_normal((n, 6)),
    }


DATASETS = _datasets()

#: Fixtures that start processes, and folders whose every test does.
PROCESS_FIXTURES = {
    "dask_cluster", "dask_client", "s3_server", "s3_proxy", "gcs_emulator", "gcs_proxy",
    "azurite", "az_proxy", "object_store",
}  # fmt: skip
PROCESS_FOLDERS = ("objectstore", "deploy")
TESTS = Path(__file__).resolve().parent

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n: each worker process its own Prefect database (two temporary Prefect
    # servers on one SQLite file lock each other out)
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="kpca-tests-prefect-home-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if folder in PROCESS_FOLDERS or PROCESS_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.cluster)


_session_server = contextlib.ExitStack()


def pytest_collection_finish(session):
    """One Prefect server for the session's flows, when a selected test starts processes.

    The ``kpca`` commands and flows the tests start record their runs in it (as on a
    cluster, where PREFECT_API_URL names a server) instead of each starting a temporary
    server of its own (10-30 s each). The tests of that temporary server, what a user
    without PREFECT_API_URL gets, remove the variable from their commands' environment.
    ``KPCA_TEST_PREFECT_SERVER=0`` turns this off.
    """
    if "PREFECT_API_URL" in os.environ or os.environ.get("KPCA_TEST_PREFECT_SERVER") == "0":
        return
    if not any(item.get_closest_marker("cluster") for item in session.items):
        return
    from tests.prefect_server import prefect_server

    home = Path(tempfile.mkdtemp(prefix="kpca-tests-prefect-server-"))
    _session_server.callback(shutil.rmtree, home, ignore_errors=True)
    api, _env, _log = _session_server.enter_context(prefect_server(home))
    os.environ["PREFECT_API_URL"] = api
    _session_server.callback(os.environ.pop, "PREFECT_API_URL", None)


def pytest_sessionfinish(session, exitstatus):
    _session_server.close()


class ProcessStarted(AssertionError):
    """A test without the ``cluster`` marker started a process."""


_guard = {"on": False}


def _refuse(what: str) -> None:
    if _guard["on"]:
        _guard["on"] = False  # one report; the test fails here
        raise ProcessStarted(
            f"this test starts a process ({what}): mark it `cluster` (tests/conftest.py)"
        )


#: System queries libraries make once and cache (platform.processor() runs ``uname -p``,
#: ctypes.util.find_library ``ldconfig``/``gcc``, matplotlib's first font cache
#: ``fc-list``: a fresh machine's first report failed on it): not a process a test starts.
SYSTEM_QUERIES = {
    "uname",
    "ldconfig",
    "gcc",
    "cc",
    "ld",
    "objdump",
    "lscpu",
    "nvidia-smi",
    "fc-list",
    "fc-match",
}


def _audit(event: str, args) -> None:
    if event == "subprocess.Popen":  # args: executable, args, cwd, env
        argv = args[1] if isinstance(args[1], list | tuple) else [args[1]]
        program = str(args[0] or (argv[0] if argv else ""))
        if Path(program.split()[0] if program else "").name not in SYSTEM_QUERIES:
            _refuse(f"subprocess {program}")
    elif event in ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn"):
        _refuse(event)


_start = multiprocessing.process.BaseProcess.start


def _checked_start(self):
    _refuse(f"multiprocessing {type(self).__name__}")
    return _start(self)


sys.addaudithook(_audit)
multiprocessing.process.BaseProcess.start = _checked_start
assert subprocess.Popen  # the audit event above is subprocess.Popen's


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """The guard also covers fixtures (a module-scoped fixture that starts a process is
    set up before the test's own guard is on): on for a fixture an unmarked test needs."""
    if fixturedef.argname == "_no_process_unless_marked":  # it sets the test's guard
        yield
        return
    item = getattr(request, "_pyfuncitem", None)
    before = _guard["on"]
    _guard["on"] = item is not None and item.get_closest_marker("cluster") is None
    try:
        yield
    finally:
        _guard["on"] = before


@pytest.fixture(autouse=True)
def _no_process_unless_marked(request):
    _guard["on"] = request.node.get_closest_marker("cluster") is None
    try:
        yield
    finally:
        _guard["on"] = False


@pytest.fixture(params=sorted(DATASETS))
def dataset(request) -> tuple[str, np.ndarray]:
    return request.param, DATASETS[request.param]


@pytest.fixture(scope="session")
def dask_cluster():
    """A LocalCluster of 2 worker processes (1 thread each) bound to 127.0.0.1."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        memory_limit="2GiB",
        silence_logs=logging.ERROR,
    ) as cluster:
        yield cluster


@pytest.fixture
def dask_client(dask_cluster):
    """A client of ``dask_cluster``; the estimator runs every fit on the cluster (its
    execution rule would run these small fits on local threads: tests/kpca_dask/
    test_cost.py tests the rule itself)."""
    import dask
    from distributed import Client

    with Client(dask_cluster) as client, dask.config.set({"kpca.execution": "cluster"}):
        # the cluster lives for the session: a worker an earlier test lost (its nanny
        # restarts it) is waited for here, and one left paused, busy or holding memory by
        # an earlier test is restarted, so that a test starts on two idle workers
        client.wait_for_workers(2, timeout=60)
        if not _idle(client):
            client.restart()
            client.wait_for_workers(2, timeout=60)
        yield client


def _idle(client, wait: float = 5.0) -> bool:
    """Whether both workers run, process nothing and hold under half of their
    memory limit (waiting up to ``wait`` seconds for an earlier test's tasks to end)."""
    import time

    deadline = time.monotonic() + wait
    while True:
        info = client.scheduler_info(n_workers=-1)["workers"].values()
        ok = (
            len(info) == 2
            and all(w.get("status") == "running" for w in info)
            and all(
                (w.get("metrics", {}).get("memory") or 0) < 0.5 * (w.get("memory_limit") or 1)
                for w in info
            )
            and not any(client.processing().values())
        )
        if ok or time.monotonic() > deadline:
            return ok
        time.sleep(0.2)


def align_signs(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Flip the columns of A to best match B (embeddings agree up to sign)."""
    s = np.sign(np.sum(A * B, axis=0))
    s[s == 0] = 1
    return A * s
