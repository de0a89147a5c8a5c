"""The pre-start checks on an object store (a real S3-protocol server): the input's header
and first rows are read through input.storage_options, the output is probed for writing
through output.storage_options, and the probe leaves the bucket as it found it."""

from __future__ import annotations

import io
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.config import load_config
from pipeline.data.validate import validate
from tests.objectstore.faultproxy import WRITE_METHODS
from tests.objectstore.test_gs_az import kpca


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


# ------------------------------------------------ a store that does not answer (a 503)
@pytest.mark.cluster  # a kpca command in a subprocess, through the fault proxy
@pytest.mark.parametrize(
    ("command", "methods"),
    [
        pytest.param("validate", ("GET", "HEAD"), id="validate-reads"),
        pytest.param("run", WRITE_METHODS, id="run-writes", marks=pytest.mark.slow),
        # ~20 s each: the other two pairs on demand
        pytest.param("run", ("GET", "HEAD"), id="run-reads", marks=pytest.mark.slow),
        pytest.param("validate", WRITE_METHODS, id="validate-writes", marks=pytest.mark.slow),
    ],
)
def test_an_output_store_answering_503_is_the_environment_exit_1(
    s3_store, tmp_path, command, methods
):
    """Issue 36: a 503 at the first look into the output (or at the write probe) was told as
    a usage error (exit 2, "check the URL ... credentials"). The store did not answer: that
    is the environment's failure, exit 1 (re-run), one line naming the output."""
    from tests.objectstore.test_gs_az import write_config
    from tests.reliability.helpers import blobs

    x = tmp_path / "x.npy"
    np.save(x, blobs(60, 3))
    out = s3_store.url("runs", "today")
    cfg = write_config(tmp_path, s3_store, str(x), out)
    cfg_data = yaml.safe_load(cfg.read_text())
    cfg_data["input"] = {"path": str(x)}  # a local input: only the output's store fails
    cfg.write_text(yaml.safe_dump(cfg_data))
    s3_store.proxy.fault("error", status=503, methods=methods)
    extra = ("--no-progress", "--no-prefect") if command == "run" else ()
    t0 = time.monotonic()
    r = kpca(command, str(cfg), *extra, timeout=300)
    took = time.monotonic() - t0
    s3_store.proxy.clear()
    assert s3_store.proxy.state()["injected"], "no request met the fault"
    text = r.stdout + r.stderr
    assert r.returncode == 1, (r.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, r.stderr[-3000:]
    assert out in errors[0] and "output" in errors[0], errors[0]
    assert "re-run" in errors[0] or "network" in errors[0], errors[0]
    print(f"{command} {'/'.join(methods)}: exit 1 after {took:.0f} s: {errors[0]}")


def test_an_unanswered_store_is_transient_a_refused_one_is_not():
    from pipeline.data.checks.findings import (
        Finding,
        PrestartError,
        Stop,
        Unreachable,
        unreachable,
    )

    assert unreachable(ConnectionRefusedError("refused")) is Unreachable
    assert unreachable(TimeoutError("slow")) is Unreachable
    assert unreachable(PermissionError("denied")) is Stop
    assert unreachable(FileNotFoundError("no bucket")) is Stop
    both = [Finding("output", "a", transient=True), Finding("input", "b")]
    assert not PrestartError(both).transient  # one user error: exit 2 for the whole
    assert PrestartError(both[:1]).transient
    assert not PrestartError([]).transient
