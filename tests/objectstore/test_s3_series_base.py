"""A series' base re-run on an S3-protocol server (moto's standalone server, a process on
127.0.0.1; the endpoint only in ``storage_options``): the rows a hold names outlive the
rebuild of the output's ``work/ingest.zarr`` (a server-side copy at
``work/ingest/<fingerprint>.zarr``), the lineage reads them there, and the copy is removed
once the hold is released (issue 36). The whole series on local disk:
tests/pipeline/test_series_base.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import kpca_dask
from pipeline.output.export import open_run
from tests.objectstore.test_s3_lineage import _kpca, _run
from tests.objectstore.test_s3_pipeline import s3  # noqa: F401
from tests.pipeline.test_series_base import (
    _draw,
    _reference,
    _table,
    base_config,
    check_held_rows,
    held_rows_scenario,
)


def test_rows_a_hold_names_outlive_a_rebuild_on_s3(s3_server, s3_bucket, tmp_path):
    opts = s3_server.storage_options
    r = held_rows_scenario(tmp_path, f"s3://{s3_bucket}/series/v1", opts)
    check_held_rows(r)
    fs = s3_server.filesystem()
    holds = fs.ls(f"{s3_bucket}/series/v1/holds")
    assert len(holds) == 1 and holds[0].endswith(".json")
    # the rebuilt store holds the third rows; no kept copy is left under work/ingest/
    fs.invalidate_cache()
    assert fs.find(f"{s3_bucket}/series/v1/work/ingest/") == []
    assert fs.exists(f"{s3_bucket}/series/v1/work/ingest.zarr/zarr.json")


@pytest.mark.slow  # 7 commands, each with its own local cluster: ~2-4 min
def test_series_on_s3_survives_its_base_rerun_on_the_same_and_on_new_rows(s3, tmp_path):
    """v1 (labelled: a split), v2, v3; the base re-run on the same rows with another seed
    (``keep_versions: 1``: its old version goes), v4 (refit); the base re-run on new rows
    at the same input key, v5 (refit). Each refit equals a fit, computed here, of the rows
    the series was built from."""
    server, bucket = s3
    opts = server.storage_options
    flag = json.dumps(opts)
    fs = server.filesystem()

    def put(name, X, lab, first_id):
        _table(tmp_path / name, X, lab, first_id)
        fs.put(str(tmp_path / name), f"{bucket}/in/{name}")

    X0, l0 = _draw(500, 0)
    put("x.parquet", X0, l0, 0)
    batches = {i: _draw(80, i) for i in (1, 2, 3, 4)}
    for i, (X, lab) in batches.items():
        put(f"b{i}.parquet", X, lab, 10_000 * i)
    series = f"s3://{bucket}/series"

    def run_base(seed):
        cfg = base_config(tmp_path, tmp_path / "unused", seed=seed)
        cfg["input"].update(path=f"s3://{bucket}/in/x.parquet", storage_options=opts)
        cfg["output"].update(path=f"{series}/v1", storage_options=opts, overwrite=True)
        cfg["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "dashboard_address": None}
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
        res = _run(tmp_path / "run.yaml")
        assert res.returncode == 0, res.stderr[-3000:]

    def update(i, *extra):
        res = _kpca(
            "update", series, f"s3://{bucket}/in/b{i}.parquet", "--storage-options", flag,
            "--input-storage-options", flag, "--no-prefect", "--no-progress", *extra,
        )  # fmt: skip
        assert res.returncode == 0, f"update {i}: {res.stderr[-3000:]}"

    run_base(0)
    update(1)
    update(2)
    split0 = np.asarray(open_run(f"{series}/v2", opts).location.open_group("r")["split"][:500])
    split0 = split0.astype(bool)
    assert 0 < split0.sum() < 500

    def check(night, batches_in):
        pub = open_run(f"{series}/v{night}", opts)
        assert pub.manifest["update"]["action"] == "refit"
        model = kpca_dask.load(pub.model.zarr_source())
        train = np.vstack([X0[split0]] + [batches[i][0] for i in batches_in])
        assert model.n_samples_fit_ == len(train)
        ref = _reference(model, train)
        err = np.abs(model.eigenvalues_ - ref.eigenvalues) / ref.eigenvalues
        assert np.max(err) < 1e-10, (night, err)

    run_base(5)  # the same rows, another fit: retention removes v1's old version
    update(3, "--policy", "refit")
    check(4, (1, 2, 3))
    Xn, ln = _draw(500, 7, shift=1.5)
    put("x.parquet", Xn, ln, 0)  # the nightly base job: new rows at the same key
    run_base(0)
    update(4, "--policy", "refit")
    check(5, (1, 2, 3, 4))
    fs.invalidate_cache()
    kept = [p for p in fs.ls(f"{bucket}/series/v1/work/ingest") if p.endswith(".zarr")]
    assert len(kept) == 1, kept  # the held original rows, copied before the rebuild
