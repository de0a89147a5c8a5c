"""``kpca run`` in Prefect mode (the default) keeps the plain mode's contract: a dead
PREFECT_API_URL is a user error (one line, exit 2, nothing written), and Ctrl-C -- a real
SIGINT to a real process, mid-solve -- ends the run within 5 s with exit 130 and one line;
running the same command again resumes from the finished stages. SIGTERM (what a
scheduler, Kubernetes or systemd sends) does the same with exit 143, and no process the
command started (the temporary Prefect server, the Dask workers) outlives it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.cluster  # its tests start processes

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PYTHONPATH=str(ROOT),
        PREFECT_HOME=str(tmp / "prefect-home"),
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        **extra,
    )
    return env


def _config(tmp: Path, n: int = 300) -> Path:
    from sklearn.datasets import make_blobs

    X = make_blobs(n, n_features=10, centers=5, cluster_std=3.0, random_state=0)[0]
    np.save(tmp / "x.npy", X)
    cfg = {
        "input": {"path": str(tmp / "x.npy")},
        "kernel": {"name": "rbf", "gamma": 0.05},
        "solver": {"n_components": 8, "eigen_solver": "randomized", "dtype": "float64"},
        "chunks": {"target_chunk_mb": 0.05, "block_rows": 500},
        "kernel_store": {"materialize": "never"},
        "output": {"path": str(tmp / "out"), "parquet": False},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1, "dashboard_address": None},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(cfg))
    return tmp / "run.yaml"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is


def test_an_unreachable_prefect_api_is_one_line_and_exit_2(tmp_path):
    cfg = _config(tmp_path)
    url = f"http://127.0.0.1:{_closed_port()}/api"
    res = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(cfg), "--no-progress"],
        env=_env(tmp_path, PREFECT_API_URL=url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[0] == f"kpca run: checking {cfg}, its input and its output", lines
    assert lines[1] == "kpca run: input and output checked; loading Prefect", lines
    lines = lines[2:]  # the lines say what it does; then one for the error
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"kpca run: error: the Prefect API at PREFECT_API_URL={url} ")
    assert "not reachable" in lines[0] and "--no-prefect" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ~50 s; SIGTERM mid-solve (the same handler) stays in the default run
def test_ctrl_c_mid_solve_exits_130_within_5_s_and_the_run_resumes(tmp_path):
    """Two real flow runs on an ephemeral Prefect API (the issue's must-show test: kept
    in the default suite; 4000 rows give the solve a few seconds of passes)."""
    cfg = _config(tmp_path, n=4000)
    env = _env(tmp_path)
    args = [sys.executable, "-m", "flows.cli", "run", str(cfg), "--no-progress"]
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            t_end = time.monotonic() + 240
            while "randomized solver: pass 1," not in err_file.read_text():
                assert proc.poll() is None, err_file.read_text()
                assert time.monotonic() < t_end, err_file.read_text()
                time.sleep(0.05)
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGINT)
            rc = proc.wait(timeout=30)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = err_file.read_text()
    after = text.split("randomized solver: pass 1,", 1)[1].splitlines()[1:]
    after = [ln for ln in after if ln.strip() and "randomized solver: pass" not in ln]
    assert rc == 130, text
    assert took < 5.0, took
    assert len(after) == 1, "\n".join(after)
    assert after[0].startswith("kpca run: interrupted after ")
    assert after[0].endswith("re-run the same command to resume.")
    assert "Traceback" not in text
    assert not (tmp_path / "out" / "manifest.json").exists()

    res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "run complete" in res.stdout
    # the ingest that finished before Ctrl-C is not done again: its task is a cache hit
    prefect_line = next(ln for ln in res.stdout.splitlines() if "stages cached" in ln)
    ran = prefect_line.split("ran ", 1)[1] if "ran " in prefect_line else ""
    assert "ingest" not in ran and "solve" in ran, prefect_line


def _alive(procs) -> list[str]:
    import psutil

    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:  # gone, or a zombie meanwhile: not running
            pass
    return alive


def test_sigterm_mid_solve_exits_143_stops_every_child_and_the_run_resumes(tmp_path):
    """A real Prefect-mode run (ephemeral API server, local Dask cluster) gets SIGTERM
    mid-solve: exit 143, one line, and every process it had started -- recorded by pid from
    the process tree just before the signal: the Prefect API server (uvicorn), the Dask
    worker processes -- is gone; the same command then resumes (ingest is a cache hit)."""
    import psutil

    cfg = _config(tmp_path, n=4000)
    env = _env(tmp_path)
    args = [sys.executable, "-m", "flows.cli", "run", str(cfg), "--no-progress"]
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            t_end = time.monotonic() + 240
            while "randomized solver: pass 1," not in err_file.read_text():
                assert proc.poll() is None, err_file.read_text()
                assert time.monotonic() < t_end, err_file.read_text()
                time.sleep(0.05)
            started = psutil.Process(proc.pid).children(recursive=True)
            cmdlines = [" ".join(p.cmdline()) for p in started]
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = err_file.read_text()
    # the command had started the API server and at least one Dask worker process
    assert any("uvicorn" in c for c in cmdlines), cmdlines
    assert any("multiprocessing" in c for c in cmdlines), cmdlines
    deadline = time.monotonic() + 10  # the kernel reaps a killed process's children
    while _alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(started) == [], _alive(started)
    after = text.split("randomized solver: pass 1,", 1)[1].splitlines()[1:]
    after = [ln for ln in after if ln.strip() and "randomized solver: pass" not in ln]
    assert rc == 143, text
    assert took < 30.0, took  # Prefect records the crash first, then our handler's grace
    assert len(after) == 1, "\n".join(after)
    assert after[0].startswith("kpca run: stopped by SIGTERM after "), after[0]
    assert after[0].endswith("(finished stages are kept); re-run the same command to resume.")
    assert "Traceback" not in text
    assert not (tmp_path / "out" / "manifest.json").exists()

    res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    prefect_line = next(ln for ln in res.stdout.splitlines() if "stages cached" in ln)
    ran = prefect_line.split("ran ", 1)[1] if "ran " in prefect_line else ""
    assert "ingest" not in ran and "solve" in ran, prefect_line


def test_after_a_stop_signal_prefects_log_worker_writes_nothing_to_stderr(tmp_path):
    """The race behind a flaky three-line SIGTERM: the ephemeral API server is stopped, and
    Prefect's API log worker then fails to send its last batch and writes "--- Error logging
    to API ---" and the connection error straight to stderr. A real log worker, sending to an
    address where nothing listens, in a process that got SIGTERM inside
    ``handle_interrupts``: stderr holds the one line and nothing else."""
    script = """
import os, signal, time
from flows.runtime import handle_interrupts, report_interrupt
from prefect.logging.handlers import APILogWorker
try:
    with handle_interrupts(lambda: "stopped", grace=30):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
except KeyboardInterrupt:
    report_interrupt("stopped")
APILogWorker.instance().send({"message": "x", "level": 20, "name": "t",
    "timestamp": "2026-11-27T00:00:00Z", "flow_run_id": None, "task_run_id": None})
APILogWorker.drain_all(timeout=20)
"""
    env = _env(tmp_path, PREFECT_API_URL=f"http://127.0.0.1:{_closed_port()}/api")
    res = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == ["stopped"], res.stderr


def test_prefects_copies_of_the_final_error_stay_off_the_console():
    """The console filter (flows/runtime.py): the task's and the flow's own ERROR records of
    a failure are dropped (the CLI prints it once); a retried failure is still shown, and a
    user error never brings its traceback."""
    import logging

    from flows.runtime import _OneLinePerError
    from pipeline.errors import UserError

    def record(name, msg, exc=None, level=logging.ERROR):
        r = logging.LogRecord(name, level, __file__, 1, msg, (), None)
        r.exc_info = (type(exc), exc, None) if exc else None
        return r

    f = _OneLinePerError()
    assert not f.filter(record("prefect.task_runs", "Task run failed with exception: X"))
    assert not f.filter(record("prefect.flow_runs", "Finished in state Failed('X')"))
    assert f.filter(record("prefect.task_runs", "Task run failed - Retry 1/2 will start"))
    assert f.filter(record("prefect.flow_runs", "Beginning flow run", level=logging.INFO))
    r = record("distributed.worker", "compute failed", exc=UserError("bad input"))
    assert f.filter(r) and r.exc_info is None


@pytest.mark.slow
def test_the_flow_run_address_is_printed_when_a_server_records_it(tmp_path):
    """(slow: a Prefect server starts, about 40 s here.) A real Prefect server (the test
    harness's subprocess, PREFECT_API_URL set): the
    flow's first line names the run's page in the UI; an ephemeral API prints nothing."""
    import io

    from prefect import flow
    from prefect.settings import PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from flows.runtime import announce_flow_run

    @flow(name="kpca-announce-test")
    def announced() -> tuple[str | None, str]:
        buf = io.StringIO()
        return announce_flow_run(buf), buf.getvalue()

    with temporary_settings(updates={PREFECT_HOME: tmp_path / "home"}):
        with prefect_test_harness(server_startup_timeout=90):
            from prefect.runtime import flow_run  # noqa: F401
            from prefect.settings import get_current_settings

            api = str(get_current_settings().api.url)
            url, printed = announced()
    assert url is not None and "/flow-run" in url
    assert url.startswith(api.removesuffix("/api"))
    assert printed.startswith("kpca: Prefect flow run '") and printed.strip().endswith(url)
    assert announce_flow_run(io.StringIO()) is None  # outside a flow run: nothing to print
