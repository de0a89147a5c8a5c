"""Schedules fire: a real Prefect server process, the deployments of deploy/prefect.yaml
created the documented way (`prefect work-pool create`, `prefect deploy`), and the server's
scheduler service creating their scheduled flow runs.

This is what broke with SQLAlchemy 2.1 (pyproject.toml pins it): the scheduler failed every
loop with ``InvalidRequestError: Can't evaluate bulk DML statement`` and never created a
run, while `prefect deployment run` still worked. The slow test goes the whole way: a cron
schedule of every minute, a process worker, and the pipeline run the schedule created
completing on a tiny config.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from tests.prefect_server import PREFECT, free_port, server_env
from tests.prefect_server import prefect_server as _server

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def prefect_server(home: Path):
    """`prefect server start` as a process on 127.0.0.1: (API URL, environment, log)."""
    api = f"http://127.0.0.1:{free_port()}/api"
    env = server_env(
        home,
        api,
        PYTHONPATH=str(ROOT),
        # the scheduler's loop (60 s by default) every 2 s: it runs as often as the
        # test polls, so a scheduler that fails shows within a few loops
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    return _server(home, env)


def _prefect(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    res = subprocess.run(
        PREFECT + list(args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def _runs(api: str, deployment_id: str, state: str | None = None) -> list[dict]:
    body: dict = {"deployments": {"id": {"any_": [deployment_id]}}, "limit": 200}
    if state:
        body["flow_runs"] = {"state": {"type": {"any_": [state]}}}
    return httpx.post(f"{api}/flow_runs/filter", json=body, timeout=30).json()


def _deployment(api: str, name: str) -> dict:
    deps = httpx.post(f"{api}/deployments/filter", json={"limit": 50}, timeout=30).json()
    return next(d for d in deps if d["name"] == name)


def test_the_scheduler_creates_the_nightly_deployments_runs(tmp_path):
    """(about 40-60 s here.) deploy/prefect.yaml's kpca-nightly, as shipped (cron 02:00
    UTC), deployed with `prefect deploy` to a real server: the server's scheduler service
    creates its upcoming runs (Prefect schedules at least 3 ahead) at the cron's times,
    and its log has no scheduler error."""
    with prefect_server(tmp_path / "home") as (api, env, log_path):
        _prefect(env, "work-pool", "create", "kpca-process", "--type", "process")
        _prefect(
            env,
            "--no-prompt",
            "deploy",
            "--prefect-file",
            str(DEPLOY / "prefect.yaml"),
            "--name",
            "kpca-nightly",
        )
        dep = _deployment(api, "kpca-nightly")
        deadline = time.monotonic() + 120
        runs: list[dict] = []
        while time.monotonic() < deadline:
            runs = _runs(api, dep["id"], "SCHEDULED")
            if len(runs) >= 3:
                break
            time.sleep(1)
        log = log_path.read_text()
    assert "InvalidRequestError" not in log and "Unexpected error in" not in log, log[-3000:]
    assert len(runs) >= 3, f"the scheduler created {len(runs)} runs; server log:\n{log[-3000:]}"
    times = sorted(r["next_scheduled_start_time"] for r in runs)
    assert all("T02:00:00" in t for t in times), times  # "0 2 * * *" in UTC
    assert all(r["auto_scheduled"] for r in runs)


def _tiny_config(tmp: Path) -> dict:
    from sklearn.datasets import make_blobs

    X, y = make_blobs(240, n_features=6, centers=3, random_state=0)
    import pandas as pd

    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)])
    df["label"] = y
    df.insert(0, "id", np.arange(len(df), dtype=np.int64))
    df.to_parquet(tmp / "features.parquet")
    cfg = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())["definitions"]["config"][
        "nightly"
    ]
    cfg["input"]["path"] = str(tmp / "features.parquet")
    cfg["output"]["path"] = str(tmp / "runs" / "nightly")
    cfg["solver"]["n_components"] = 4
    cfg["chunks"]["target_chunk_mb"] = 1
    # no Dask cluster is running here: the flow starts a local one (one worker)
    cfg["cluster"] = {"address": "", "n_workers": 1, "dashboard_address": None}
    return cfg


@pytest.mark.slow
def test_a_cron_schedule_runs_the_pipeline_deployment_to_completion(tmp_path):
    """(slow: 2-3 min here: up to a minute until the cron fires, then a flow run in a
    process worker.) deploy/README.md's steps against a real server: a process work pool,
    `prefect deploy` of kpca-nightly (its schedule set to every minute, its config to a
    tiny table), `prefect worker start`; the run the scheduler created at the minute
    completes and publishes a verified run."""
    doc = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())
    nightly = next(d for d in doc["deployments"] if d["name"] == "kpca-nightly")
    nightly["schedules"] = [{"cron": "* * * * *", "timezone": "UTC", "active": True}]
    nightly["parameters"] = {"config": _tiny_config(tmp_path)}
    doc["deployments"] = [nightly]
    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    with prefect_server(tmp_path / "home") as (api, env, log_path):
        _prefect(env, "work-pool", "create", "kpca-process", "--type", "process")
        _prefect(
            env,
            "--no-prompt",
            "deploy",
            "--prefect-file",
            str(tmp_path / "prefect.yaml"),
            "--name",
            "kpca-nightly",
        )
        dep = _deployment(api, "kpca-nightly")
        worker_log = tmp_path / "worker.log"
        with open(worker_log, "w") as wlog:
            worker = subprocess.Popen(
                PREFECT + ["worker", "start", "--pool", "kpca-process"],
                env={**env, "PREFECT_WORKER_QUERY_SECONDS": "2"},
                cwd=ROOT,
                stdout=wlog,
                stderr=subprocess.STDOUT,
            )
            try:
                deadline = time.monotonic() + 420
                done: list[dict] = []
                while time.monotonic() < deadline:
                    assert worker.poll() is None, worker_log.read_text()[-3000:]
                    done = [
                        r
                        for r in _runs(api, dep["id"])
                        if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED")
                    ]
                    if done:
                        break
                    time.sleep(2)
            finally:
                worker.terminate()
                try:
                    worker.wait(60)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
        log = log_path.read_text()
    assert done, f"no run finished; worker log:\n{worker_log.read_text()[-3000:]}"
    run = done[0]
    assert run["state_type"] == "COMPLETED", worker_log.read_text()[-5000:]
    assert run["auto_scheduled"], run  # created by the scheduler, not by hand
    assert "InvalidRequestError" not in log
    # the flow run the worker started has the CLI's quiet default: no distributed INFO
    # line for every cluster event, no large-graph warning
    wtext = worker_log.read_text()
    noise = re.findall(r".*distributed\.[\w.]+ - INFO.*|.*Sending large graph.*", wtext)
    assert noise == [], noise[:10]

    from pipeline.output.export import verify_run

    manifest = verify_run(str(tmp_path / "runs" / "nightly"))
    assert manifest["input"]["n_rows"] == 240
