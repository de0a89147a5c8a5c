"""`kpca update` with the base run, the batch and the new run on a real S3-protocol server
(moto's standalone server, a process on 127.0.0.1): the endpoint only in the base run's
config and the command's ``--storage-options``; the base run is never modified."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from tests.objectstore.test_s3_pipeline import CANARY, _kpca, _run, data, s3  # noqa: F401
from tests.reliability.helpers import blobs

pytestmark = pytest.mark.distributed


def _objects(fs, prefix: str) -> dict[str, str]:
    """Every object under ``prefix`` with its ETag (what changes when it is rewritten)."""
    return {k: v.get("ETag", "") for k, v in fs.find(prefix, detail=True).items()}


# moved out of the default run (its 20-minute budget; 2026-11-28, second cut): ~90 s; the S3
# series nights are tests/objectstore/test_series_nights.py (slow)
@pytest.mark.slow
def test_kpca_update_on_s3_merges_and_leaves_the_base_run_unchanged(s3, data, tmp_path):
    server, bucket = s3
    opts = server.storage_options
    base = f"s3://{bucket}/runs/nys"
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
        "output": {"path": base, "parquet": False, "storage_options": opts},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 2, "threads_per_worker": 1, "dashboard_address": None},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    res = _run(tmp_path / "run.yaml", tmp_path / "run.log")
    assert res.returncode == 0, res.stderr[-3000:]

    fs = server.filesystem()
    batch = blobs(120, np.load(data / "x.npy").shape[1], seed=1)
    np.save(tmp_path / "batch.npy", batch)
    fs.put(str(tmp_path / "batch.npy"), f"{bucket}/in/batch.npy")
    before = _objects(fs, f"{bucket}/runs/nys")

    new = f"s3://{bucket}/runs/nys-v2"
    flag = json.dumps(opts)
    res = _kpca(
        "update", base, f"s3://{bucket}/in/batch.npy", "--output", new,
        "--storage-options", flag, "--policy", "merge", "--no-prefect", "--no-progress",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "merge of 120 new rows" in res.stdout, res.stdout

    info = _kpca("info", new, "--storage-options", flag)
    assert info.returncode == 0, info.stderr[-2000:]
    manifest = json.loads(_kpca("info", new, "--json", "--storage-options", flag).stdout)
    assert manifest["update"]["version"] == 2
    assert manifest["update"]["n_rows"] == 600 + 120
    # the published run is never modified, and it still verifies; the update added only
    # its hold on the base's version and rows (holds/, issue 36), naming the new run
    after = _objects(fs, f"{bucket}/runs/nys")
    held = [k for k in after if k.startswith(f"{bucket}/runs/nys/holds/")]
    assert len(held) == 1 and {k: v for k, v in after.items() if k not in held} == before
    hold = json.loads(fs.cat(held[0]))
    assert hold["kind"] == "hold" and hold["holder"].rstrip("/").endswith("runs/nys-v2")
    assert _kpca("info", base, "--storage-options", flag).returncode == 0
    # no credential in any object the update wrote, nor in its output
    for key in fs.find(f"{bucket}/runs/nys-v2"):
        blob = fs.cat(key)
        for v in CANARY.values():
            assert v.encode() not in blob, key
    for v in CANARY.values():
        assert v not in res.stdout + res.stderr


@pytest.mark.slow  # ~15 s; the endpoint advice is tested fast in test_store_faults.py
def test_kpca_update_without_the_endpoint_is_one_line(s3, tmp_path):
    """The base run on s3 but no --storage-options: the endpoint is nowhere, so the base
    cannot be read; one line, not a traceback."""
    _, bucket = s3
    res = _kpca("update", f"s3://{bucket}/runs/none", str(tmp_path / "b.npy"), "--no-prefect")
    assert res.returncode in (1, 2), res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("kpca update: error")]
    assert len(lines) == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
