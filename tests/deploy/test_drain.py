"""Stopping a Prefect worker without killing the night in flight: ``kpca drain``.

A process worker stopped with SIGTERM while a flow run is in flight takes the run's
process with it (seen with Prefect 3.8.8: the run is killed mid-stage and stays
``Running`` on the server). ``kpca drain POOL --worker-pid PID`` pauses the pool, waits
for the run in flight, then stops the worker; a night that comes due meanwhile waits and
runs on ``kpca drain --resume``. Real server, deployment, process worker and flow runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.deploy.test_schedules import (
    DEPLOY,
    PREFECT,
    ROOT,
    _deployment,
    _prefect,
    _runs,
    _tiny_config,
    prefect_server,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

KPCA = [sys.executable, "-m", "flows.cli"]


@contextlib.contextmanager
def worker(env: dict[str, str], log: Path):
    """`prefect worker start` on the pool, in its own session; killed with its children
    if the test leaves it running."""
    with open(log, "a") as out:
        proc = subprocess.Popen(
            PREFECT + ["worker", "start", "--pool", "kpca-process"],
            env={**env, "PREFECT_WORKER_QUERY_SECONDS": "2"},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait(predicate, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(
        f"{what} within {timeout:.0f} s; worker log:\n{log.read_text()[-4000:]}"
    )


def test_drain_stops_the_worker_after_the_run_in_flight_and_a_waiting_night_runs_on_resume(
    tmp_path,
):
    """(slow: about 3 min.) A run in flight when `kpca drain` starts completes and
    publishes; the worker stops only after it; a run created meanwhile is not taken
    (stays scheduled) and completes once the pool is resumed and a worker runs again."""
    rng = np.random.default_rng(0)
    n = 12_000  # a run of some tens of seconds: the drain starts while it is in flight
    frame = pd.DataFrame(rng.normal(size=(n, 6)), columns=[f"f{i}" for i in range(6)])
    frame["label"] = rng.integers(0, 3, n)
    frame.insert(0, "id", np.arange(n, dtype=np.int64))
    cfg = _tiny_config(tmp_path)
    frame.to_parquet(cfg["input"]["path"])
    cfg["solver"]["eigen_solver"] = "randomized"
    doc = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())
    nightly = next(d for d in doc["deployments"] if d["name"] == "kpca-nightly")
    nightly["schedules"] = []
    nightly["parameters"] = {"config": cfg}
    doc["deployments"] = [nightly]
    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    log = tmp_path / "worker.log"

    with prefect_server(tmp_path / "home") as (api, env, _server_log):
        _prefect(env, "work-pool", "create", "kpca-process", "--type", "process")
        _prefect(
            env, "--no-prompt", "deploy", "--prefect-file", str(tmp_path / "prefect.yaml"),
            "--name", "kpca-nightly",
        )  # fmt: skip
        dep = _deployment(api, "kpca-nightly")
        _prefect(env, "deployment", "run", "kpca-pipeline/kpca-nightly")
        with worker(env, log) as w:
            first = _wait(
                lambda: [r for r in _runs(api, dep["id"]) if r["state_type"] == "RUNNING"],
                300, "the first run started", log,
            )[0]  # fmt: skip
            proc = subprocess.Popen(
                KPCA + ["drain", "kpca-process", "--worker-pid", str(w.pid), "--settle", "6"],
                env={**env, "PYTHONPATH": str(ROOT)},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                time.sleep(3)  # the pool is paused by now: this night must wait
                _prefect(env, "deployment", "run", "kpca-pipeline/kpca-nightly")
                out, err = proc.communicate(timeout=600)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            assert proc.returncode == 0, out + err
            assert w.wait(30) is not None  # the drain stopped the worker
        runs = {r["id"]: r for r in _runs(api, dep["id"])}
        assert runs[first["id"]]["state_type"] == "COMPLETED", log.read_text()[-4000:]
        waiting = [r for r in runs.values() if r["id"] != first["id"]]
        assert len(waiting) == 1 and waiting[0]["state_type"] == "SCHEDULED", waiting
        assert first["name"] in out and "drained" in out, out

        from pipeline.output.export import verify_run

        assert verify_run(cfg["output"]["path"])["input"]["n_rows"] == n

        res = subprocess.run(
            KPCA + ["drain", "--resume", "kpca-process"],
            env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        with worker(env, log):
            done = _wait(
                lambda: [
                    r for r in _runs(api, dep["id"])
                    if r["id"] == waiting[0]["id"]
                    and r["state_type"] in ("COMPLETED", "FAILED", "CRASHED")
                ],
                420, "the waiting night finished after resume", log,
            )  # fmt: skip
        assert done[0]["state_type"] == "COMPLETED", log.read_text()[-4000:]


def test_drain_of_an_unknown_pool_is_one_line(tmp_path):
    """(slow: a server start.) A pool name the server does not know: one line, exit 2."""
    with prefect_server(tmp_path / "home") as (_api, env, _log):
        res = subprocess.run(
            KPCA + ["drain", "no-such-pool"],
            env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-pool" in lines[0] and "does not exist" in lines[0]
