"""A series' base re-run on an S3-protocol server (moto's standalone server, a process on
127.0.0.1; the endpoint only in ``storage_options``): the rows a hold names outlive the
rebuild of the output's ``work/ingest.zarr`` (a server-side copy at
``work/ingest/<fingerprint>.zarr``), the lineage reads them there, and the copy is removed
once the hold is released (issue 36). The whole series on local disk:
tests/pipeline/test_series_base.py."""

from __future__ import annotations

from tests.pipeline.test_series_base import check_held_rows, held_rows_scenario


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
