"""A password in a URL-valued storage option (``endpoint_url: http://user:password@host``,
adlfs's ``account_host``) is refused on every store, s3, gs, az and a local output: exit 2
in one error naming the option, the password never echoed and never written anywhere
(every object of the bucket and every file of the test's folder is read).

Before: the option passed the credential screen, the run used it and the password landed
in ``work/ingest.zarr/zarr.json`` (gs).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.objectstore.test_gs_az import kpca, put_npy, write_config
from tests.reliability.helpers import blobs

pytestmark = pytest.mark.distributed


def _with_userinfo(endpoint: str, userinfo: str) -> str:
    if "://" in endpoint:
        scheme, rest = endpoint.split("://", 1)
        return f"{scheme}://{userinfo}@{rest}"
    return f"{userinfo}@{endpoint}"


def leaky_options(store, password: str) -> tuple[dict, str]:
    """The store's options with ``user:password@`` in its endpoint; the option's name."""
    opts = json.loads(json.dumps(store.storage_options))
    userinfo = f"kpca:{password}"
    if store.scheme == "s3":
        url = opts["client_kwargs"]["endpoint_url"]
        opts["client_kwargs"]["endpoint_url"] = _with_userinfo(url, userinfo)
        return opts, "client_kwargs.endpoint_url"
    if store.scheme == "gs":
        opts["endpoint_url"] = _with_userinfo(opts["endpoint_url"], userinfo)
        return opts, "endpoint_url"
    opts["account_host"] = _with_userinfo(opts["account_host"], userinfo)
    return opts, "account_host"


def _files_holding(root: Path, secret: bytes, skip: set[Path]) -> list[str]:
    return [
        str(p)
        for p in root.rglob("*")
        if p.is_file() and p not in skip and secret in p.read_bytes()
    ]


def _objects_holding(store, secret: bytes) -> list[str]:
    fs = store.filesystem()
    fs.invalidate_cache()
    found = fs.find(store.bucket)
    assert found, "the bucket holds the input at least"
    return [k for k in found if secret in fs.cat_file(k)]


def _refused(res, option: str, password: str) -> None:
    text = res.stdout + res.stderr
    assert res.returncode == 2, (res.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, res.stderr[-3000:]
    # a config file's error names the file, then its problems on indented lines
    assert option in res.stderr and "user:password@host" in res.stderr, res.stderr[-3000:]
    assert password not in text, text[-3000:]


@pytest.mark.parametrize("object_store", ["s3", "gs", "az"], indirect=True)
def test_a_password_in_an_endpoint_is_refused_and_written_nowhere(object_store, tmp_path):
    store = object_store
    password = f"pw{uuid.uuid4().hex}"
    opts, option = leaky_options(store, password)
    x = put_npy(store, tmp_path, "x.npy", blobs(200, 4))
    out = store.url("runs", "leak")
    cfg = write_config(tmp_path, store, x, out)
    c = json.loads(json.dumps(__import__("yaml").safe_load(cfg.read_text())))
    c["input"]["storage_options"] = opts
    c["output"]["storage_options"] = opts
    cfg.write_text(json.dumps(c))

    _refused(kpca("run", str(cfg), "--no-progress", "--no-prefect"), option, password)
    # the same options on the command line
    flags = ["--storage-options", json.dumps(opts)]
    _refused(kpca("info", out, *flags), option, password)
    _refused(kpca("transform", out, x, str(tmp_path / "emb"), *flags), option, password)

    assert _objects_holding(store, password.encode()) == []
    assert _files_holding(tmp_path, password.encode(), {cfg}) == []


def test_a_password_in_an_endpoint_is_refused_for_a_local_output(tmp_path):
    password = f"pw{uuid.uuid4().hex}"
    np.save(tmp_path / "x.npy", blobs(200, 4))
    opts = {"client_kwargs": {"endpoint_url": f"http://kpca:{password}@127.0.0.1:9/"}}
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "input": {"path": str(tmp_path / "x.npy"), "storage_options": opts},
                "kernel": {"name": "rbf", "gamma": 0.05},
                "solver": {
                    "n_components": 3,
                    "eigen_solver": "nystroem",
                    "n_landmarks": 40,
                    "random_state": 0,
                },  # fmt: skip
                "output": {"path": str(tmp_path / "out"), "storage_options": opts},
                "evaluate": {"enabled": False},
                "cluster": {
                    "n_workers": 1,
                    "threads_per_worker": 1,
                    "dashboard_address": None,
                },  # fmt: skip
            }
        )
    )
    res = kpca("run", str(cfg), "--no-progress", "--no-prefect")
    _refused(res, "client_kwargs.endpoint_url", password)
    assert _files_holding(tmp_path, password.encode(), {cfg}) == []
