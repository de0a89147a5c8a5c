"""deploy/: prefect.yaml deployments import and validate; cluster specs parse and run the image
the Dockerfile builds; the local-cluster script is sound (CI runs it end to end)."""

from __future__ import annotations

import ast
import re
import shutil
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
    assert re.search(r"^RUN pip install \"\.\[s3,gcs,azure\]\"", text, re.M), (
        "the image must install . with every object store"
    )
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
            "kpca-update-nightly",
            "kpca-nightly-k8s",
            "kpca-transform-k8s",
        }
        assert by_name["kpca-nightly"]["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
        assert by_name["kpca-transform"]["schedules"] == []
        # the nightly update runs after the batch lands, one at a time, on the series folder
        update = by_name["kpca-update-nightly"]
        assert update["schedules"][0]["schedule"]["cron"] == "30 2 * * *"
        assert update["parameters"]["run"] == "/srv/kpca/runs/features"
        assert update["global_concurrency_limit"]["limit"] == 1
        assert update["concurrency_options"]["collision_strategy"] == "ENQUEUE"
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


# ------------------------------------------------------------ object stores, credentials
K8S = DEPLOY / "kubernetes"
#: the Kubernetes objects every spec refers to by name (deploy/kubernetes/service-account.yaml)
SERVICE_ACCOUNT = "kpca-dask"
STORE_SECRET = "kpca-object-store"
#: names of environment variables that carry a secret (must come from a Secret reference)
SECRET_ENV = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL|CONNECTION_STRING)", re.I)


def _yaml_docs() -> dict[str, list]:
    docs = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs[str(path.relative_to(DEPLOY))] = [
            d for d in yaml.safe_load_all(path.read_text()) if d is not None
        ]
    return docs


def _walk(node, path=()):
    """Every (path, mapping) in a parsed YAML tree."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, (*path, i))


def test_object_store_extras_are_declared_and_in_the_image():
    """gs:// and az:// next to s3://: gcsfs and adlfs as extras, all installed in the image."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    want = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs"}
    for extra, pkg in want.items():
        assert any(r.startswith(f"{pkg}>=") for r in extras[extra]), (extra, extras[extra])
    docker = (DEPLOY / "Dockerfile").read_text()
    (installed,) = re.findall(r'^RUN pip install "\.\[([^\]]+)\]"', docker, re.M)
    assert set(installed.split(",")) >= set(want)
    assert re.search(r"import [^\"]*\bs3fs, gcsfs, adlfs\b", docker), "the build imports them"


def test_no_literal_credentials_anywhere_in_deploy():
    """Secrets are references: an env var that carries one comes from a secretKeyRef, an
    envFrom names a Secret, and no file defines a Secret's data."""
    from pipeline.config import _secret_value

    seen_refs = 0
    for name, docs in _yaml_docs().items():
        for doc in docs:
            assert not (
                doc.get("kind") == "Secret" and (doc.get("data") or doc.get("stringData"))
            ), f"{name} defines a Secret's data: create it by hand instead"
            for path, node in _walk(doc):
                if "name" in node and ("value" in node or "valueFrom" in node):  # an env entry
                    if SECRET_ENV.search(str(node["name"])):
                        assert "value" not in node, f"{name}: literal {node['name']}"
                        ref = node["valueFrom"]["secretKeyRef"]
                        assert ref["name"] == STORE_SECRET, (name, ref)
                        seen_refs += 1
                for src in node.get("envFrom") or []:
                    assert set(src) == {"secretRef"}, (name, src)
                    assert src["secretRef"]["name"] == STORE_SECRET
                    seen_refs += 1
                for key, value in node.items():
                    # a value shaped like a credential (an access key id, a private key,
                    # a token...: the check config files get, pipeline/config.py)
                    what = _secret_value(value) if isinstance(value, str) else None
                    assert what is None, f"{name}: {'/'.join(map(str, path))}/{key} is {what}"
    assert seen_refs >= 3  # the operator's workers (plain and TLS) and the Helm workers
    # and in the configs: storage_options never hold credentials (the model refuses them)
    from pipeline.config import PipelineConfig

    for d in yaml.safe_load((DEPLOY / "prefect.yaml").read_text())["deployments"]:
        if "config" in d["parameters"]:
            PipelineConfig.model_validate(d["parameters"]["config"])


def test_pods_that_do_io_run_as_the_data_service_account():
    """Workers (operator, TLS, Helm) and the Prefect flow-run pods use the service account
    the manifest defines; the scheduler, which moves no data, does not need it."""
    (sa,) = yaml.safe_load_all((K8S / "service-account.yaml").read_text())
    assert sa["kind"] == "ServiceAccount" and sa["metadata"]["name"] == SERVICE_ACCOUNT
    assert sa["metadata"]["namespace"] == "kpca"
    assert any("role-arn" in k or "service-account" in k for k in sa["metadata"]["annotations"])
    for f in ("dask-cluster.yaml", "dask-cluster-tls.yaml"):
        spec = yaml.safe_load((K8S / f).read_text())
        assert spec["spec"]["worker"]["spec"]["serviceAccountName"] == SERVICE_ACCOUNT, f
        (w,) = _containers(spec["spec"]["worker"])
        assert {"secretRef": {"name": STORE_SECRET, "optional": True}} in w["envFrom"], f
    values = yaml.safe_load((DEPLOY / "helm" / "dask-values.yaml").read_text())
    assert values["worker"]["serviceAccountName"] == SERVICE_ACCOUNT
    assert "serviceAccountName" not in values["scheduler"]
    pools = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())["definitions"]["work_pools"]
    assert pools["kubernetes"]["job_variables"]["service_account_name"] == SERVICE_ACCOUNT


def _helm_fullname(release: str, values: dict, chart: str = "dask") -> str:
    """dask/templates/_helpers.tpl's ``dask.fullname`` (the chart's naming rule)."""
    if values.get("fullnameOverride"):
        return values["fullnameOverride"][:63].rstrip("-")
    name = values.get("nameOverride") or chart
    full = release if name in release else f"{release}-{name}"
    return full[:63].rstrip("-")


HELM_RELEASE = "kpca"  # the release name the docs install with


def test_helm_scheduler_address_in_the_docs_is_the_one_the_chart_creates():
    """The chart's Service is ``<fullname>-scheduler``; every document that tells a user
    where the Helm scheduler is names exactly that, whatever the release is called."""
    values = yaml.safe_load((DEPLOY / "helm" / "dask-values.yaml").read_text())
    for release in (HELM_RELEASE, "nightly", "my-dask"):
        assert _helm_fullname(release, values) == "kpca-dask"  # fixed by fullnameOverride
    address = (
        f"tcp://{_helm_fullname(HELM_RELEASE, values)}-scheduler.kpca.svc.cluster.local:8786"
    )
    docs = {
        "deploy/README.md": (DEPLOY / "README.md").read_text(),
        "docs/cluster.md": (ROOT / "docs" / "cluster.md").read_text(),
        "deploy/helm/dask-values.yaml": (DEPLOY / "helm" / "dask-values.yaml").read_text(),
    }
    for name, text in docs.items():
        assert f"helm install {HELM_RELEASE} dask/dask" in text, name
        assert address in text, f"{name} does not name the chart's scheduler {address}"
        assert "kpca-scheduler." not in text, f"{name} names a Service the chart never creates"
    # the Kubernetes deployments reach the Helm scheduler as well as the operator's
    prefect = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())
    for d in prefect["deployments"]:
        if d["work_pool"]["name"] == "kpca-kubernetes":
            params = d["parameters"]
            assert (params.get("config") or params)["cluster"]["address"] == address


@pytest.mark.slow  # needs the helm binary and the network (the chart repository)
@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed here")
def test_helm_template_renders_the_documented_service(tmp_path):
    res = subprocess.run(
        ["helm", "template", HELM_RELEASE, "dask", "--repo", "https://helm.dask.org"]
        + ["-n", "kpca", "-f", str(DEPLOY / "helm" / "dask-values.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0 and "dial tcp" in res.stderr + res.stdout:
        pytest.skip("the dask chart repository is not reachable from here")
    assert res.returncode == 0, res.stderr
    objs = [d for d in yaml.safe_load_all(res.stdout) if d]
    services = {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    assert "kpca-dask-scheduler" in services
    (worker,) = [
        o for o in objs if o["kind"] == "Deployment" and "worker" in o["metadata"]["name"]
    ]
    (c,) = worker["spec"]["template"]["spec"]["containers"]
    args = [str(a) for a in c["args"]]
    assert args[args.index("--memory-limit", args.index("--memory-limit") + 1) + 1] == "7GiB"


def _chart_worker_args(values: dict) -> list[str]:
    """The worker command dask/templates/dask-worker-deployment.yaml builds from values
    (resources.limits set: --nthreads and --memory-limit from them, then extraArgs)."""
    w = values["worker"]
    service = f"{_helm_fullname(HELM_RELEASE, values)}-scheduler"
    return [
        f"{service}:{values['scheduler']['servicePort']}",
        "--nthreads",
        str(w.get("threads_per_worker") or w["resources"]["limits"]["cpu"]),
        "--memory-limit",
        str(w["resources"]["limits"]["memory"]),
        "--no-dashboard",
        "--dashboard-address",
        str(w.get("portDashboard", 8790)),
        *map(str, w.get("extraArgs") or []),
    ]


def test_workers_have_memory_headroom_above_the_dask_limit():
    """Every worker's Dask memory limit (as distributed's own command line parser reads
    the arguments) is below its container's limit, by at least 512 MiB."""
    from dask.utils import parse_bytes
    from distributed.cli.dask_worker import main as dask_worker

    def parsed(args: list[str]) -> dict:
        return dask_worker.make_context("dask worker", list(args)).params

    values = yaml.safe_load((DEPLOY / "helm" / "dask-values.yaml").read_text())
    limits = {"helm": (_chart_worker_args(values), values["worker"]["resources"]["limits"])}
    for f in ("dask-cluster.yaml", "dask-cluster-tls.yaml"):
        (w,) = _containers(yaml.safe_load((K8S / f).read_text())["spec"]["worker"])
        args = [a for a in w["args"][2:] if not a.startswith("--tls")]
        args = [a for a in args if not a.startswith("/etc/dask/tls")]
        limits[f] = (args, w["resources"]["limits"])
    for name, (args, container) in limits.items():
        p = parsed(args)
        dask_limit = parse_bytes(p["memory_limit"])
        assert dask_limit + parse_bytes("512MiB") <= parse_bytes(container["memory"]), name
        assert int(p["nthreads"]) <= int(container["cpu"]), name


def test_tls_example_is_mutual_tls_end_to_end(tmp_path):
    """deploy/kubernetes/dask-cluster-tls.yaml: scheduler and workers (as distributed's
    command line parsers read them) speak tls:// with the CA, certificate and key mounted
    from a Secret; the flow's cluster section in its header is a valid config."""
    from distributed.cli.dask_scheduler import main as dask_scheduler
    from distributed.cli.dask_worker import main as dask_worker

    from pipeline.config import ClusterConfig

    text = (K8S / "dask-cluster-tls.yaml").read_text()
    spec = yaml.safe_load(text)
    name, ns = spec["metadata"]["name"], spec["metadata"]["namespace"]
    address = f"tls://{name}-scheduler.{ns}.svc.cluster.local:8786"
    certs = tmp_path / "tls"
    certs.mkdir()
    for f in ("ca.pem", "tls.crt", "tls.key"):
        (certs / f).write_text("PEM")

    def local(args):  # the mounted files, here
        return [a.replace("/etc/dask/tls", str(certs)) for a in args]

    (s,) = _containers(spec["spec"]["scheduler"])
    sp = dask_scheduler.make_context("dask scheduler", local(s["args"][2:])).params
    assert sp["protocol"] == "tls" and sp["tls_key"] and sp["tls_cert"] and sp["tls_ca_file"]
    (w,) = _containers(spec["spec"]["worker"])
    wp = dask_worker.make_context("dask worker", local(w["args"][2:])).params
    assert wp["scheduler"] == address
    assert wp["tls_key"] and wp["tls_cert"] and wp["tls_ca_file"]
    for part, c in (("scheduler", s), ("worker", w)):
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "true", part
        (mount,) = c["volumeMounts"]
        assert mount["mountPath"] == "/etc/dask/tls" and mount["readOnly"] is True
        (vol,) = spec["spec"][part]["spec"]["volumes"]
        assert vol["name"] == mount["name"] and vol["secret"]["secretName"] == "kpca-dask-tls"
    assert spec["spec"]["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == name
    # the flow side, from the header comment
    block = re.search(r"^#   cluster:\n((?:#     .*\n)+)", text, re.M)
    assert block, "the header shows the flow's cluster section"
    cluster = yaml.safe_load("\n".join(line[6:] for line in block.group(1).splitlines()))
    cfg = ClusterConfig.model_validate(cluster)
    assert cfg.address == address and cfg.tls is not None
    assert cfg.tls.ca_file.startswith("/etc/dask/tls/")
