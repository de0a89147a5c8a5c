"""The pre-start checks on an object store (a real S3-protocol server): the input's header
and first rows are read through input.storage_options, the output is probed for writing
through output.storage_options, and the probe leaves the bucket as it found it."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from pipeline.config import load_config
from pipeline.data.validate import validate


def _cfg(bucket: str, opts: dict, **inp) -> object:
    return load_config(
        {
            "input": {"path": f"s3://{bucket}/in/t.parquet", "storage_options": opts, **inp},
            "output": {"path": f"s3://{bucket}/runs/today", "storage_options": opts},
            "evaluate": {"enabled": False},
        }
    )


def _put_table(fs, bucket: str, df: pd.DataFrame) -> None:
    buf = io.BytesIO()
    df.to_parquet(buf)
    fs.pipe(f"{bucket}/in/t.parquet", buf.getvalue())


def test_remote_input_and_output_pass_and_the_probe_leaves_nothing(s3_server, s3_bucket):
    fs = s3_server.filesystem()
    df = pd.DataFrame(np.random.default_rng(0).standard_normal((30, 3)), columns=list("abc"))
    _put_table(fs, s3_bucket, df.assign(y=np.arange(30) % 2))
    before = sorted(fs.find(s3_bucket))
    v = validate(_cfg(s3_bucket, s3_server.storage_options, label_column="y"))
    assert v.ok, [f.message for f in v.findings]
    assert v.format == "parquet" and v.features == ["a", "b", "c"]
    fs.invalidate_cache()
    assert sorted(fs.find(s3_bucket)) == before


def test_remote_problems_are_found_before_anything_starts(s3_server, s3_bucket):
    fs = s3_server.filesystem()
    df = pd.DataFrame({"a": [1.0, np.nan, 3.0], "b": [1.0, 2.0, 3.0]})
    _put_table(fs, s3_bucket, df)
    v = validate(_cfg(s3_bucket, s3_server.storage_options, label_column="label"))
    assert [f.check for f in v.errors] == ["label"]
    v = validate(_cfg(s3_bucket, s3_server.storage_options))
    assert [f.check for f in v.errors] == ["nonfinite"]
    assert "column(s) ['a'] (first: row 1)" in v.errors[0].message
    # an input that is not there; and a bucket that does not exist for the output
    cfg = _cfg(s3_bucket, s3_server.storage_options)
    cfg.input.path = f"s3://{s3_bucket}/in/missing.parquet"
    cfg.output.path = "s3://no-such-bucket-kpca/runs/today"
    v = validate(cfg)
    checks = {f.check: f.message for f in v.errors}
    assert "does not exist" in checks["input"]
    assert checks["output"].startswith("cannot write to output s3://no-such-bucket-kpca/")
