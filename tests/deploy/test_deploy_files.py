"""deploy/: prefect.yaml deployments import and validate; cluster specs parse and run the image
the Dockerfile builds; the local-cluster script is sound (CI runs it end to end)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def dockerfile_image() -> str:
    """``title:version`` from the Dockerfile's OCI labels: the tag it is built as."""
    text = (DEPLOY / "Dockerfile").read_text()
    labels = dict(re.findall(r'org\.opencontainers\.image\.(\w+)="([^"]*)"', text))
    image = f"{labels['title']}:{labels['version']}"
    assert f"-t {image} " in text, "the build command in the Dockerfile uses another tag"
    return image


IMAGE = dockerfile_image()


@pytest.fixture(scope="module")
def prefect_yaml() -> dict:
    return yaml.safe_load((DEPLOY / "prefect.yaml").read_text())


def test_image_name_is_the_project_version():
    """The Dockerfile builds kpca-dask:<pyproject version>, installing the project."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert IMAGE == f"{project['name']}:{project['version']}"
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^RUN pip install \"\.\[s3\]\"", text, re.M), "the image must install ."
    for pkg in ("kpca_dask", "pipeline", "flows"):
        assert f"COPY {pkg} ./{pkg}" in text


def test_prefect_yaml_is_a_valid_project_file(prefect_yaml):
    """Prefect's own model of prefect.yaml accepts it; shared parts come from anchors."""
    from prefect.cli.deploy._models import PrefectYamlModel, RawScheduleConfig

    model = PrefectYamlModel.model_validate(prefect_yaml)
    assert len(model.deployments) >= 3
    for d in prefect_yaml["deployments"]:
        for sched in d.get("schedules") or []:
            RawScheduleConfig.model_validate(sched)
    raw = (DEPLOY / "prefect.yaml").read_text()
    for anchor in ("nightly", "process_pool", "kubernetes_pool", "nightly_config"):
        assert f"&{anchor}" in raw and f"*{anchor}" in raw, anchor


def test_required_deployments_exist(prefect_yaml):
    """A nightly cron pipeline and an on-demand transform on a process pool; a k8s variant."""
    deps = prefect_yaml["deployments"]
    pools = {d["name"]: d["work_pool"]["name"] for d in deps}
    nightly = [
        d for d in deps if d["entrypoint"].endswith("kpca_pipeline") and d.get("schedules")
    ]
    on_demand = [
        d for d in deps if d["entrypoint"].endswith("kpca_transform") and not d.get("schedules")
    ]
    assert any(pools[d["name"]] == "kpca-process" for d in nightly)
    assert any(pools[d["name"]] == "kpca-process" for d in on_demand)
    assert any(pools[d["name"]] == "kpca-kubernetes" for d in nightly)
    from prefect.client.schemas.schedules import CronSchedule

    for d in nightly:
        (sched,) = d["schedules"]
        CronSchedule(cron=sched["cron"], timezone=sched["timezone"])  # raises if invalid
        assert d["concurrency_limit"]["limit"] == 1  # never two nightly runs on one output
        assert d["parameters"]["config"]["output"]["overwrite"] is True


def _deployment_names() -> list[str]:
    return [
        d["name"] for d in yaml.safe_load((DEPLOY / "prefect.yaml").read_text())["deployments"]
    ]


@pytest.mark.parametrize("name", _deployment_names())
def test_each_deployment_imports_and_its_parameters_validate(prefect_yaml, name):
    """The entrypoint loads as the named flow; the parameters pass the flow's own
    validation and the pipeline config model (what `prefect deploy` enforces)."""
    from prefect.flows import load_flow_from_entrypoint

    from pipeline.config import PipelineConfig

    (d,) = [d for d in prefect_yaml["deployments"] if d["name"] == name]
    flow = load_flow_from_entrypoint(d["entrypoint"], use_placeholder_flow=False)
    assert flow.name in ("kpca-pipeline", "kpca-transform", "kpca-update-from")
    params = flow.validate_parameters(d["parameters"])
    if flow.name == "kpca-pipeline":
        cfg = PipelineConfig.model_validate(d["parameters"]["config"])
        assert params["config"] == cfg
        for path in (cfg.input.path, cfg.output.path):
            assert path.startswith(("/", "s3://")), f"{d['name']}: relative path {path}"
    elif flow.name == "kpca-update-from":  # a series folder and the batch
        for path in (d["parameters"]["run"], d["parameters"]["new_data"]):
            assert path.startswith(("/", "s3://")), f"{d['name']}: relative path {path}"
    else:
        assert d["parameters"]["model"].startswith(("/", "s3://"))
    assert d.get("enforce_parameter_schema") is True


def test_kubernetes_deployments_run_the_image_against_the_operator_cluster(prefect_yaml):
    """The k8s pool runs the Dockerfile's image and reaches the DaskCluster's scheduler."""
    spec = yaml.safe_load((DEPLOY / "kubernetes" / "dask-cluster.yaml").read_text())
    service = f"{spec['metadata']['name']}-scheduler.{spec['metadata']['namespace']}.svc"
    for d in prefect_yaml["deployments"]:
        if d["work_pool"]["name"] != "kpca-kubernetes":
            continue
        assert d["work_pool"]["job_variables"]["image"] == IMAGE
        params = d["parameters"]
        address = (params.get("config") or params)["cluster"]["address"]
        assert address == f"tcp://{service}.cluster.local:8786", d["name"]


def _containers(spec: dict) -> list[dict]:
    return spec["spec"]["containers"]


def test_dask_operator_manifest_parses_and_runs_the_image():
    """A kubernetes.dask.org/v1 DaskCluster whose scheduler and workers run the image,
    workers with memory limits below their container limits."""
    from dask.utils import parse_bytes

    spec = yaml.safe_load((DEPLOY / "kubernetes" / "dask-cluster.yaml").read_text())
    assert spec["apiVersion"] == "kubernetes.dask.org/v1" and spec["kind"] == "DaskCluster"
    workers, scheduler = spec["spec"]["worker"], spec["spec"]["scheduler"]
    assert workers["replicas"] >= 1
    for c in _containers(workers) + _containers(scheduler):
        assert c["image"] == IMAGE
    (w,) = _containers(workers)
    assert w["args"][:2] == ["dask", "worker"]
    limit = parse_bytes(w["args"][w["args"].index("--memory-limit") + 1])
    assert limit < parse_bytes(w["resources"]["limits"]["memory"])
    nthreads = int(w["args"][w["args"].index("--nthreads") + 1])
    assert nthreads <= int(w["resources"]["limits"]["cpu"])  # threads never exceed cores
    (s,) = _containers(scheduler)
    assert s["args"][:2] == ["dask", "scheduler"]
    assert {p["port"] for p in scheduler["service"]["ports"]} == {8786, 8787}


def test_helm_values_parse_and_run_the_image():
    """Values for the dask/dask chart: scheduler and workers on the image, no Jupyter."""
    values = yaml.safe_load((DEPLOY / "helm" / "dask-values.yaml").read_text())
    for part in ("scheduler", "worker"):
        img = values[part]["image"]
        assert f"{img['repository']}:{img['tag']}" == IMAGE
    assert values["worker"]["replicas"] >= 1
    worker = values["worker"]
    assert worker["threads_per_worker"] <= worker["resources"]["limits"]["cpu"]
    assert values["jupyter"]["enabled"] is False
    # the chart runs `dask-scheduler` / `dask-worker`: the image must provide both
    docker = (DEPLOY / "Dockerfile").read_text()
    assert "/usr/local/bin/dask-scheduler" in docker and "/usr/local/bin/dask-worker" in docker
    assert values["worker"]["image"]["dask_worker"] == "dask-worker"


def test_slurm_example_is_importable_without_dask_jobqueue():
    """The jobqueue example parses, imports (dask_jobqueue only when run) and has a CLI."""
    path = DEPLOY / "slurm" / "slurm_cluster.py"
    ast.parse(path.read_text())
    res = subprocess.run(
        [sys.executable, str(path), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert "--jobs" in res.stdout and "SLURMCluster" in path.read_text()


def test_local_cluster_script_is_sound_and_run_by_ci():
    """bash -n passes; the script binds 127.0.0.1, sets memory limits, always cleans up;
    .ci/run runs it after the README's test command."""
    script = DEPLOY / "local-cluster.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "trap stop_all EXIT" in text
    assert "--host 127.0.0.1" in text and "--memory-limit" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "deploy/local-cluster.sh" in ci
    assert ci.index("test-command") < ci.index("deploy/local-cluster.sh")


@pytest.mark.slow
def test_local_cluster_script_end_to_end():
    """The whole script (about 2 minutes): cluster, flow, checks, clean stop."""
    res = subprocess.run(
        ["bash", str(DEPLOY / "local-cluster.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "OK: flow ran on the local cluster" in res.stdout


@pytest.mark.slow
def test_prefect_deploy_registers_every_deployment(tmp_path):
    """`prefect deploy --all` against a real (temporary) server creates all deployments with
    their schedules, pools and parameters (about 30 s; needs fastapi 0.150, see pyproject)."""
    import os
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    prefect = [sys.executable, "-m", "prefect"]
    server = subprocess.Popen(
        prefect + ["server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        for pool, kind in (("kpca-process", "process"), ("kpca-kubernetes", "kubernetes")):
            subprocess.run(
                prefect + ["work-pool", "create", pool, "--type", kind],
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
        res = subprocess.run(
            prefect
            + [
                "--no-prompt",
                "deploy",
                "--prefect-file",
                str(DEPLOY / "prefect.yaml"),
                "--all",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        deps = httpx.post(f"{api}/deployments/filter", json={"limit": 50}, timeout=30).json()
        by_name = {d["name"]: d for d in deps}
        assert set(by_name) == {
            "kpca-nightly",
            "kpca-transform",
            "kpca-nightly-k8s",
            "kpca-transform-k8s",
        }
        assert by_name["kpca-nightly"]["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
        assert by_name["kpca-transform"]["schedules"] == []
        assert by_name["kpca-nightly-k8s"]["job_variables"]["image"] == IMAGE
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_the_local_cluster_scripts_python_one_liners_run():
    """deploy/local-cluster.sh asks the packages for names (the stage count, the workers'
    malloc settings) with ``python -c``: each one-liner runs against the code as it is now
    (a renamed module once failed only in CI's deploy step, after the tests)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (root / "deploy" / "local-cluster.sh").read_text()
    snippets = re.findall(r"""python -c (?:'([^']*)'|"([^"]*)")""", script)
    codes = [a or b for a, b in snippets]
    assert len(codes) >= 2, "the script's python -c one-liners were not found"
    for code in codes:
        res = subprocess.run(
            [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, f"{code}\n{res.stderr}"
        assert res.stdout.strip(), code
