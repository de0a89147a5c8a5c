"""Upgrades on S3 (a moto server on 127.0.0.1): an output the previous release wrote to a
bucket (its own code, from git history: tests/integrity/test_upgrade.py) is read in
place with one line saying how to migrate it, left unchanged by ``kpca migrate
--dry-run``, and migrated by the next night's ``kpca run``: the old night published as
the first version (server-side copies), kept in the history byte for byte, the old
top-level objects gone, the published version the new night."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from tests.integrity.test_upgrade import (  # noqa: F401 - the fixture is used by name
    D,
    N,
    previous_kpca,
    previous_tree,
    write_config,
)
from tests.objectstore.conftest import s3_server  # noqa: F401 - the fixture, by name
from tests.objectstore.s3server import CREDENTIAL_ENV
from tests.published import s3_tree_bytes
from tests.reliability.helpers import ROOT, blobs, env

#: a real server, the previous release's run and a run of today: about a minute
pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def kpca_s3(*args: str) -> object:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, args)],
        cwd=ROOT,
        env=env(**CREDENTIAL_ENV),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_previous_release_output_on_s3_is_migrated_by_the_next_run(
    previous_tree,  # noqa: F811
    s3_server,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    for k, v in CREDENTIAL_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    bucket = s3_server.make_bucket(f"kpca-{uuid.uuid4().hex[:12]}")
    opts = s3_server.storage_options
    flags = ["--storage-options", json.dumps(opts)]
    out = f"s3://{bucket}/nightly"
    fs = s3_server.filesystem()

    np.save(tmp_path / "night1.npy", blobs(N, D, seed=0))
    cfg1 = write_config(
        tmp_path / "n1.yaml", tmp_path / "night1.npy", out, output={"storage_options": opts}
    )
    import subprocess

    res = previous_kpca(previous_tree, "run", cfg1, "--no-prefect", "--no-progress")
    if res.returncode != 0:  # the previous release's run needs the credentials too
        res = subprocess.run(
            res.args,
            cwd=previous_tree,
            env=env(PYTHONPATH=str(previous_tree), **CREDENTIAL_ENV),
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert res.returncode == 0, res.stderr[-3000:]

    def top() -> set[str]:
        fs.invalidate_cache()
        return {p.rstrip("/").rpartition("/")[2] for p in fs.ls(f"{bucket}/nightly")}

    assert {"model", "embedding", "embedding.parquet", "manifest.json"} <= top()
    assert "versions" not in top()
    before = s3_tree_bytes(fs, f"{bucket}/nightly")
    old_manifest = json.loads(before["manifest.json"])

    # a reader of today: read in place, told in one line how to migrate
    res = kpca_s3("info", out, *flags)
    assert res.returncode == 0, res.stderr[-2000:]
    hints = [ln for ln in res.stderr.splitlines() if "earlier kpca-dask" in ln]
    assert len(hints) == 1 and f"kpca migrate {out}" in hints[0], res.stderr[-2000:]
    res = kpca_s3("migrate", out, "--dry-run", *flags)
    assert res.returncode == 0 and "dry run, nothing changed" in res.stdout, res.stderr
    assert s3_tree_bytes(fs, f"{bucket}/nightly") == before

    # the next night, run by today's code, migrates it first
    np.save(tmp_path / "night2.npy", blobs(N, D, seed=1))
    cfg2 = write_config(
        tmp_path / "n2.yaml",
        tmp_path / "night2.npy",
        out,
        output={"storage_options": opts, "overwrite": True},
    )
    res = kpca_s3("run", cfg2, "--no-prefect", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len([ln for ln in res.stderr.splitlines() if "migrate:" in ln]) == 1, res.stderr

    assert top() == {"_kpca-dask.json", "manifest.json", "versions", "work"}, top()
    from pipeline import open_run

    run = open_run(out, opts)
    assert run.manifest["config"]["input"]["path"] == str(tmp_path / "night2.npy")
    (old_id,) = [h["version"] for h in run.history[1:]]
    old = open_run(out, opts, version=old_id)
    assert old.manifest == old_manifest
    moved = s3_tree_bytes(fs, f"{bucket}/nightly/versions/{old_id}")
    assert all(
        moved[k] == v
        for k, v in before.items()
        if not k.startswith("work/") and k != "manifest.json"
    )
    res = kpca_s3(
        "transform", f"{out}/model", tmp_path / "night2.npy", tmp_path / "t.zarr", *flags
    )
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert res.returncode == 2 and len(errors) == 1, res.stderr[-2000:]
    assert f"{out}/model" in errors[0] and not (tmp_path / "t.zarr").exists()
