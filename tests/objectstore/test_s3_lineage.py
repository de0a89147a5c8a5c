"""A chain of updates on a real S3-protocol server (moto's standalone server, a process on
127.0.0.1) with the endpoint only in ``storage_options``: every lineage entry records the
options it needs (never a credential) and the fingerprint of its rows, so a refit at the
third step reads every store of the chain; a store that cannot be reached is one line,
exit 1."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import yaml

from tests.objectstore.test_s3_pipeline import CANARY, data, s3  # noqa: F401
from tests.reliability.helpers import ROOT, blobs, env, run_command

pytestmark = pytest.mark.distributed


def _kpca(*args: str) -> subprocess.CompletedProcess:
    """The ``kpca`` command (generous timeout: the machine may be shared and loaded)."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )


def _run(cfg, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        run_command(cfg, *extra), cwd=ROOT, env=env(), capture_output=True, text=True,
        timeout=1500,
    )  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_error_line(res, command: str) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith(f"kpca {command}: error")]
    assert len(lines) == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return lines[0]


@pytest.mark.slow  # ~2 min; test_s3_nightly.py (also slow) runs five steps
def test_three_step_update_chain_on_s3_with_the_endpoint_only_in_options(s3, data, tmp_path):
    """v1 -> v2 (merge) -> v3 (merge) -> v4 (refit: reads every store of the chain, the
    batches' through the options their entries recorded)."""
    server, bucket = s3
    opts = server.storage_options
    assert set(opts) == {"client_kwargs"}  # the endpoint, nothing else
    d = np.load(data / "x.npy").shape[1]
    base = f"s3://{bucket}/chain/v1"
    cfg = {
        "input": {"path": f"s3://{bucket}/in/x.npy", "storage_options": opts},
        "kernel": {"name": "rbf", "gamma": 0.02},
        "solver": {
            "n_components": 3,
            "eigen_solver": "nystroem",
            "n_landmarks": 60,
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01, "block_rows": 100},
        "kernel_store": {"materialize": "never"},
        "output": {"path": base, "parquet": False, "storage_options": opts},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "dashboard_address": None},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    res = _run(tmp_path / "run.yaml")
    assert res.returncode == 0, res.stderr[-3000:]

    fs = server.filesystem()
    flag = json.dumps(opts)
    prev, n = base, 600
    for step, policy in ((2, "merge"), (3, "merge"), (4, "refit")):
        batch = blobs(60, d, seed=step)
        np.save(tmp_path / f"b{step}.npy", batch)
        fs.put(str(tmp_path / f"b{step}.npy"), f"{bucket}/in/b{step}.npy")
        new = f"s3://{bucket}/chain/v{step}"
        res = _kpca(
            "update", prev, f"s3://{bucket}/in/b{step}.npy", "--output", new,
            "--storage-options", flag, "--policy", policy, "--no-prefect", "--no-progress",
        )  # fmt: skip
        assert res.returncode == 0, f"step {step}: {res.stderr[-3000:]}"
        assert f"{policy} of 60 new rows" in res.stdout, res.stdout
        n += 60
        info = _kpca("info", new, "--storage-options", flag)
        assert info.returncode == 0, info.stderr[-2000:]
        m = json.loads(_kpca("info", new, "--json", "--storage-options", flag).stdout)
        assert m["update"]["version"] == step and m["update"]["n_rows"] == n
        rows = m["update"]["rows"]
        assert len(rows) == step
        assert sum(r["n_rows"] for r in rows) == n
        for r in rows:
            # the options to read it (the endpoint), its fingerprint and digests record
            assert r["storage_options"] == opts, r
            assert r["fingerprint"].startswith("blake2b:"), r
            assert r["digests_sha256"].startswith("sha256:"), r
        assert rows[0]["split_run"] is None or rows[0]["split_checksum"]
        text = json.dumps(m)
        for v in CANARY.values():  # no credential recorded anywhere
            assert v not in text
        prev = new
    # the first run still verifies after the chain
    assert _kpca("info", base, "--storage-options", flag).returncode == 0

    # a chunk of the first run's training rows altered: the next update refuses in one
    # line naming the chunk, exit 2 (never a refit on other values)
    key = f"{bucket}/chain/v1/work/ingest.zarr/X/c/1/0"
    blob = fs.cat(key)
    fs.pipe(key, blob[:-7])  # truncated
    np.save(tmp_path / "b5.npy", blobs(60, d, seed=5))
    fs.put(str(tmp_path / "b5.npy"), f"{bucket}/in/b5.npy")
    res = _kpca(
        "update", prev, f"s3://{bucket}/in/b5.npy", "--output", f"s3://{bucket}/chain/v5",
        "--storage-options", flag, "--policy", "refit", "--no-prefect", "--no-progress",
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-3000:]
    line = _one_error_line(res, "update")
    assert "chain/v1/work/ingest.zarr/X/c/1/0" in line and "cannot be decoded" in line, line
    assert not fs.exists(f"{bucket}/chain/v5/manifest.json")
    fs.pipe(key, blob)


def test_unreachable_store_is_one_line_exit_1(s3, tmp_path):
    """The endpoint at a port nobody listens on: the store cannot be read; one line naming
    the location, exit 1 (the environment), after the client's retries."""
    _, bucket = s3
    dead = {  # tried once (botocore's retries of a refused connection take ~18 s)
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"},
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    res = _kpca("info", f"s3://{bucket}/chain/v1", "--storage-options", json.dumps(dead))
    assert res.returncode == 1, res.stderr[-3000:]
    line = _one_error_line(res, "info")
    assert f"s3://{bucket}/chain/v1" in line and "the store failed" in line, line
    assert "storage_options (or --storage-options)" in line, line


# ------------------------------------------------------------------ a store that fails
class _FaultProxy(BaseHTTPRequestHandler):
    """Forwards S3 requests to the moto server; ``fail(method, path)`` returns an HTTP
    status to answer instead (403 AccessDenied, 500 InternalError), or None."""

    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int] = ("127.0.0.1", 0)
    fail = staticmethod(lambda method, path: None)

    def _forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        status = self.fail(self.command, self.path)
        if status is not None:
            code = {403: "AccessDenied", 500: "InternalError"}[status]
            payload = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{code}</Message></Error>"
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
        r = conn.getresponse()
        data = r.read()
        conn.close()
        self.send_response(r.status, r.reason)
        for k, v in r.getheaders():
            if k.lower() in ("transfer-encoding", "connection"):
                continue
            if k.lower() == "content-length" and self.command != "HEAD":
                continue
            self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, *a):
        pass


@pytest.fixture
def proxy(s3):
    """A fault-injecting proxy in front of the S3 server; its storage options and a
    setter for the fault rule."""
    server, _ = s3
    upstream = server.storage_options["client_kwargs"]["endpoint_url"]
    host, port = upstream.rsplit("//", 1)[1].split(":")
    handler = type("Proxy", (_FaultProxy,), {"upstream": (host, int(port))})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{httpd.server_address[1]}"}}

    def set_fault(rule):
        handler.fail = staticmethod(rule)

    yield opts, set_fault
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, dask_cluster):
    from distributed import Client

    from tests.reliability.helpers import make_published_run

    folder = tmp_path_factory.mktemp("local-run")
    with Client(dask_cluster):
        return make_published_run(folder)


def test_access_revoked_mid_write_is_one_line_naming_the_location(
    s3, proxy, local_run, tmp_path
):
    """Writes of the embedding's chunks denied (the credentials lost the right mid-run):
    one line naming the output and saying permission, exit 1 -- not the bare 'Access
    Denied', not a traceback."""
    _, bucket = s3
    opts, set_fault = proxy
    set_fault(
        lambda m, p: 403 if m == "PUT" and "denied" in p and "/embedding/c/" in p else None
    )
    new = local_run.parent / "new.npy"
    res = _kpca(
        "transform", local_run, new, f"s3://{bucket}/denied", "--storage-options",
        json.dumps(opts), "--no-progress",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-3000:]
    line = _one_error_line(res, "transform")
    assert "permission denied" in line and f"{bucket}/" in line and "denied" in line, line


def test_http_500_on_writes_is_retried_by_the_client(s3, proxy, local_run, tmp_path):
    """The first two writes of each chunk object answered 500: botocore retries them
    with backoff and the transform completes, its output intact."""
    _, bucket = s3
    opts, set_fault = proxy
    seen: dict[str, int] = {}

    def flaky(method, path):
        if method == "PUT" and "flaky" in path and "/embedding/c/" in path:
            seen[path] = seen.get(path, 0) + 1
            return 500 if seen[path] <= 2 else None
        return None

    set_fault(flaky)
    new = local_run.parent / "new.npy"
    res = _kpca(
        "transform", local_run, new, f"s3://{bucket}/flaky", "--storage-options",
        json.dumps(opts), "--no-progress",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert seen and all(v == 3 for v in seen.values()), seen  # each failed twice, then ok
    import zarr

    from pipeline.output.versions import open_output

    emb = open_output(f"s3://{bucket}/flaky", s3[0].storage_options).data.open_group("r")
    got = np.asarray(emb["embedding"][...])
    assert got.shape == (20, 3) and np.isfinite(got).all() and np.abs(got).max() > 0
    assert isinstance(emb, zarr.Group)
