"""Security: nothing on a load path can run code, store paths stay inside their root,
credentials never come from (or land in) config files and artifacts, the scheduler is
reachable over TLS only with the right certificates, and dashboards bind to localhost."""

from __future__ import annotations

import ast
import datetime
import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest

import kpca_dask
from pipeline.config import ClusterConfig, ConfigError, TLSConfig, load_config
from pipeline.output.export import verify_run
from pipeline.output.store import Location, PathEscapeError
from pipeline.runner.run import run_pipeline, stage_locations
from pipeline.runtime.cluster import ClusterError, dask_client

from .helpers import ROOT, blobs, env, external_cluster, small_config

pytestmark = pytest.mark.cluster  # its tests start processes

PACKAGES = ("kpca_dask", "pipeline", "flows")

#: calls that deserialise code or evaluate text: never on a load path (anywhere in the packages)
FORBIDDEN_CALLS = {
    "eval",
    "exec",
    "compile",
    "__import__",
    "pickle.load",
    "pickle.loads",
    "cPickle.loads",
    "cloudpickle.load",
    "cloudpickle.loads",
    "dill.load",
    "dill.loads",
    "joblib.load",
    "marshal.load",
    "marshal.loads",
    "shelve.open",
    "pd.read_pickle",
    "pandas.read_pickle",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "yaml.load_all",
    "torch.load",
    "importlib.import_module",
    "numcodecs.Pickle",
}
FORBIDDEN_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "cloudpickle",
    "dill",
    "joblib",
    "shelve",
    "marshal",
    "skops",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def test_no_pickle_joblib_or_eval_anywhere_in_the_packages():
    """An AST scan of every module: no unsafe deserialiser imported or called, np.load only
    with allow_pickle=False spelt out, and no Prefect result serializer that pickles."""
    problems = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text(), filename=str(f))
            where = f.relative_to(ROOT)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    bad = {a.name.split(".")[0] for a in node.names} & FORBIDDEN_MODULES
                    problems += [f"{where}:{node.lineno} imports {b}" for b in bad]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    if node.module.split(".")[0] in FORBIDDEN_MODULES:
                        problems.append(f"{where}:{node.lineno} imports from {node.module}")
                    if node.module == "prefect.serializers" and any(
                        "Pickle" in a.name for a in node.names
                    ):
                        problems.append(f"{where}:{node.lineno} uses a pickle serializer")
                elif isinstance(node, ast.Call):
                    name = _dotted(node.func)
                    if name in FORBIDDEN_CALLS:
                        problems.append(f"{where}:{node.lineno} calls {name}()")
                    if name in ("np.load", "numpy.load"):
                        kw = {k.arg: k.value for k in node.keywords}
                        v = kw.get("allow_pickle")
                        if not (isinstance(v, ast.Constant) and v.value is False):
                            problems.append(
                                f"{where}:{node.lineno} np.load without allow_pickle=False"
                            )
                    for k in node.keywords:
                        if (
                            k.arg in ("serializer", "result_serializer")
                            and isinstance(k.value, ast.Constant)
                            and "pickle" in str(k.value.value)
                        ):
                            problems.append(f"{where}:{node.lineno} {k.arg}={k.value.value!r}")
    assert not problems, "\n".join(problems)


def test_model_with_a_pickled_array_is_refused_and_runs_nothing(tmp_path):
    """A model folder whose array is a zarr v2 object array with the pickle codec (the way
    zarr stored Python objects) and a payload that would create a file when unpickled:
    kpca_dask.load and ``kpca transform`` refuse it, and the file is never created."""
    import numcodecs

    X = blobs(40, 3)
    model = tmp_path / "model"
    kpca_dask.KernelPCA(2, gamma=0.5).fit(X).save(model)
    sentinel = tmp_path / "SENTINEL"

    class Payload:
        def __reduce__(self):
            return (open, (str(sentinel), "w"))

    evil = np.empty(2, dtype=object)
    evil[:] = [Payload(), 1.0]
    shutil.rmtree(model / "eigenvalues")
    (model / "eigenvalues").mkdir()
    (model / "eigenvalues" / ".zarray").write_text(
        json.dumps(
            {
                "zarr_format": 2,
                "shape": [2],
                "chunks": [2],
                "dtype": "|O",
                "compressor": None,
                "fill_value": 0,
                "filters": [{"id": "pickle", "protocol": 5}],
                "order": "C",
            }
        )
    )
    (model / "eigenvalues" / "0").write_bytes(numcodecs.Pickle().encode(evil))
    assert not sentinel.exists()
    with pytest.raises(ValueError):
        kpca_dask.load(model)
    np.save(tmp_path / "new.npy", X[:5])
    res = subprocess.run(
        [
            os.sys.executable,
            "-m",
            "flows.cli",
            "transform",
            str(model),
            str(tmp_path / "new.npy"),
            str(tmp_path / "emb.zarr"),
        ],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not sentinel.exists() and not (tmp_path / "emb.zarr").exists()


@pytest.mark.parametrize(
    "part", ["..", "../x", "a/../../x", "/etc", "\\\\server\\share", "s3://other-bucket/x"]
)
def test_store_paths_cannot_leave_their_root(tmp_path, part):
    for root in (Location(str(tmp_path / "out")), Location("s3://bucket/runs/out")):
        with pytest.raises(PathEscapeError, match="escapes its root"):
            root.child(part)


def test_every_store_of_a_run_is_inside_its_output_root(tmp_path):
    cfg = small_config(tmp_path, tmp_path / "out")
    locs = stage_locations(cfg)
    root = locs["out"].local_path
    assert all(loc.local_path.is_relative_to(root) for loc in locs.values())
    with pytest.raises(ConfigError, match="must be a relative path inside the input store"):
        load_config({"input": {"path": "x.zarr", "zarr_array": "/abs/X"}})


@pytest.mark.parametrize(
    "url,opts,what",
    [
        ("s3://b/x.parquet", {"key": "AKIA", "secret": "s"}, "storage_options"),
        ("s3://b/x.parquet", {"client_kwargs": {"aws_session_token": "t"}}, "storage_options"),
        ("gs://b/x.parquet", {"token": "/home/me/creds.json"}, "storage_options"),
        ("abfs://c/x.parquet", {"account_key": "k"}, "storage_options"),
        ("s3://AKIA:secret@b/x.parquet", {}, "embedded credentials"),
        ("https://h/x.csv?sig=abc&se=2030", {}, "query string"),
        ("s3://b/x.csv?X-Amz-Credential=a&X-Amz-Signature=b", {}, "query string"),
    ],
)
def test_credentials_are_refused_in_config(url, opts, what):
    with pytest.raises(ConfigError, match=what):
        load_config({"input": {"path": url, "storage_options": opts}})
    if not opts:  # a URL carrying credentials is refused as the output too
        with pytest.raises(ConfigError, match=what):
            load_config({"input": {"path": "x.csv"}, "output": {"path": url}})


def test_environment_credentials_never_reach_the_artifacts(tmp_path):
    """Credentials in the environment (where fsspec/s3fs/gcsfs read them) are used, not
    recorded: after a real run, no file of the output (manifest, model, work stores,
    Parquet) contains them."""
    secret = "kpca-test-secret-7f3a9c"
    np.save(tmp_path / "x.npy", blobs(300, 5))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "input": {"path": str(tmp_path / "x.npy")},
                "solver": {"n_components": 2, "eigen_solver": "dense"},
                "output": {"path": str(tmp_path / "out")},
                "evaluate": {"enabled": False},
                "cluster": {"n_workers": 1, "dashboard_address": None},
            }
        )
    )
    from .helpers import run_command

    e = env(
        AWS_ACCESS_KEY_ID="AKIA" + secret,
        AWS_SECRET_ACCESS_KEY=secret,
        AZURE_STORAGE_KEY=secret,
        GOOGLE_APPLICATION_CREDENTIALS=f"/tmp/{secret}.json",
    )
    res = subprocess.run(
        run_command(cfg), cwd=ROOT, env=e, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    verify_run(tmp_path / "out")
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert len(files) > 10
    leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert not leaked
    assert secret not in res.stdout + res.stderr


# ------------------------------------------------------------------ TLS
def _certificates(folder: Path, name: str) -> dict[str, Path]:
    """A self-signed CA and one certificate it signs (for 127.0.0.1 / localhost), as PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject, issuer, key, signer, *, ca):
        b = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            ).add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kpca test CA {name}")])
    ca = cert(ca_name, ca_name, ca_key, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
        ca_name,
        key,
        ca_key,
        ca=False,
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "ca": folder / f"{name}-ca.pem",
        "cert": folder / f"{name}.pem",
        "key": folder / f"{name}.key",
    }
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(paths["key"], 0o600)
    return paths


@pytest.mark.distributed
def test_pipeline_runs_over_tls_and_refuses_plain_or_foreign_clients(tmp_path):
    """`dask scheduler`/`dask worker` on tls:// only, with certificates generated here: the
    pipeline runs through ``cluster.tls`` and publishes a verified run; a plain tcp://
    client and a client whose certificate another CA signed are refused."""
    good = _certificates(tmp_path / "pki", "cluster")
    rogue = _certificates(tmp_path / "pki", "rogue")
    np.save(tmp_path / "x.npy", blobs(300, 5))
    with external_cluster(tmp_path / "cluster", n_workers=1, tls=good) as cluster:
        assert cluster.address.startswith("tls://")
        tls = TLSConfig(
            ca_file=str(good["ca"]), client_cert=str(good["cert"]), client_key=str(good["key"])
        )
        cfg = small_config(tmp_path, tmp_path / "out")
        cfg.cluster = ClusterConfig(address=cluster.address, tls=tls, connect_timeout=20)
        with dask_client(cfg.cluster) as client:
            assert client.scheduler.address.startswith("tls://")
            info = client.scheduler_info()
            assert all(w.startswith("tls://") for w in info["workers"])
            run_pipeline(cfg)
        assert verify_run(tmp_path / "out")["status"] == "complete"

        plain = cluster.address.replace("tls://", "tcp://")
        with pytest.raises(
            ClusterError,
            match="cannot reach the Dask scheduler|did not complete a Dask handshake",
        ):
            with dask_client(ClusterConfig(address=plain, connect_timeout=3)):
                pass
        foreign = TLSConfig(
            ca_file=str(good["ca"]),
            client_cert=str(rogue["cert"]),
            client_key=str(rogue["key"]),
        )
        with pytest.raises(
            ClusterError,
            match="cannot reach the Dask scheduler|did not complete a Dask handshake",
        ):
            with dask_client(
                ClusterConfig(address=cluster.address, tls=foreign, connect_timeout=3)
            ):
                pass
        assert cluster.n_workers() == 1  # the refused clients did not disturb the cluster


# ------------------------------------------------------------------ dashboards
def _listening(pids: set[int]) -> set[tuple[str, int]]:
    out = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        out |= {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return out


def _tree() -> set[int]:
    me = psutil.Process()
    return {me.pid} | {c.pid for c in me.children(recursive=True)}


@pytest.mark.distributed
@pytest.mark.parametrize("dashboard", ["default", None, "0.0.0.0:0"])
def test_local_cluster_and_dashboard_bind_to_localhost_unless_configured(dashboard):
    """The local cluster ``kpca`` starts listens on 127.0.0.1 only: scheduler, workers,
    nannies and the dashboard (default) or the scheduler's bare HTTP endpoint (dashboard
    null). Asking for 0.0.0.0 is honoured, for the dashboard alone."""
    before = _listening(_tree())
    cfg = (
        ClusterConfig(n_workers=1)
        if dashboard == "default"
        else ClusterConfig(n_workers=1, dashboard_address=dashboard)
    )
    with dask_client(cfg) as client:
        opened = _listening(_tree()) - before
        link = client.dashboard_link
    assert len(opened) >= 3  # scheduler, worker, nanny (+ HTTP)
    hosts = {ip for ip, _ in opened}
    if dashboard == "0.0.0.0:0":
        assert hosts == {"127.0.0.1", "0.0.0.0"}
        dash_port = int(link.split(":")[2].split("/")[0])
        assert ("0.0.0.0", dash_port) in opened
    else:
        assert hosts == {"127.0.0.1"}, opened
        if dashboard == "default":
            assert link.startswith("http://127.0.0.1:")
