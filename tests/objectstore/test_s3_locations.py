"""Locations with their own storage options, against the real S3-protocol server: the
output's options (never the input's), the commands' ``--storage-options``, the run lock on
a bucket, and remote NPY read by byte ranges (no data in the graph)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.config import ConfigError, OutputConfig, load_config, parse_storage_options
from pipeline.output.layout import run_layout
from pipeline.output.store import Location


# ------------------------------------------------------------------ options
def test_output_storage_options_refuse_credentials_like_the_input_s():
    with pytest.raises(ValueError, match=r"must not hold credentials \(\['secret'\]\)"):
        OutputConfig(path="s3://b/run", storage_options={"secret": "x"})
    with pytest.raises(ValueError, match="client_kwargs.aws_secret_access_key"):
        OutputConfig(
            path="s3://b/run", storage_options={"client_kwargs": {"aws_secret_access_key": "x"}}
        )
    ok = OutputConfig(
        path="s3://b/run", storage_options={"client_kwargs": {"region_name": "x"}}
    )
    assert ok.storage_options == {"client_kwargs": {"region_name": "x"}}


def test_the_output_never_borrows_the_input_s_options():
    cfg = load_config(
        {
            "input": {"path": "s3://a/x.npy", "storage_options": {"anon": True}},
            "output": {"path": "s3://b/run"},
        }
    )
    assert all(loc.storage_options == {} for loc in run_layout(cfg).stores().values())
    local = load_config(
        {"input": {"path": "x.npy"}, "output": {"path": "out", "storage_options": {"anon": 1}}}
    )
    assert run_layout(local).out.storage_options == {}  # a local folder takes none


def test_storage_options_flag_json_or_file(tmp_path):
    assert parse_storage_options(None) == {} and parse_storage_options(" ") == {}
    assert parse_storage_options('{"anon": true}') == {"anon": True}
    f = tmp_path / "s3.yaml"
    f.write_text("client_kwargs:\n  endpoint_url: http://127.0.0.1:9000\n")
    assert parse_storage_options(str(f)) == {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}
    }
    f.write_text("key: AKIAABCDEFGHIJKLMNOP\n")
    with pytest.raises(ConfigError) as e:
        parse_storage_options(str(f))
    assert "must not hold credentials (['key'])" in str(e.value) and "AKIA" not in str(e.value)
    for bad, what in (
        ("{nope", "is not valid JSON"),
        (str(tmp_path / "missing.yaml"), "neither a JSON object nor an existing file"),
        ('{"client_kwargs": {"aws_session_token": "t"}}', "credentials"),
    ):
        with pytest.raises(ConfigError, match=what):
            parse_storage_options(bad)
    f.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_storage_options(str(f))


# ------------------------------------------------------------------ the bucket
def test_run_lock_on_a_bucket_is_taken_released_and_broken(s3_server, s3_bucket):
    """The lock is written and removed through the output's own options; a stale lock
    (its holder gone) is broken by ``kpca unlock`` with --storage-options."""
    from pipeline.output.lock import RunLock, lock_status
    from tests.reliability.helpers import kpca

    out = Location(f"s3://{s3_bucket}/run", s3_server.storage_options)
    with RunLock(out):
        assert lock_status(out)[0] == "held"
        assert out.child(".kpca-run.lock").exists()
    assert not out.child(".kpca-run.lock").exists()

    import datetime

    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    # renewed just now (within its lease): only `kpca unlock` breaks it at once
    stale = {"host": "elsewhere", "pid": 1, "started": now, "renewed": now, "lease": 600}
    with out.fs.open(out.child(".kpca-run.lock").fs_path, "w") as f:
        f.write(json.dumps(stale))
    assert lock_status(out)[0] == "foreign"
    res = kpca("unlock", out.url, "--storage-options", json.dumps(s3_server.storage_options))
    assert res.returncode == 0, res.stderr
    assert "removed the lock" in res.stdout and "host elsewhere" in res.stdout
    assert not s3_server.filesystem().exists(f"{s3_bucket}/run/.kpca-run.lock")


@pytest.mark.parametrize("order", ["C", "F"])
def test_remote_npy_is_read_by_byte_ranges(tmp_path, s3_server, s3_bucket, order):
    """The client reads the header only: the graph holds the file's URL and layout, no
    rows; each chunk is read where it runs. C and Fortran order, big-endian too."""
    import dask

    from pipeline.config import ChunkConfig, InputConfig
    from pipeline.data.readers import RemoteNpyFile, read_input

    rng = np.random.default_rng(0)
    A = np.asarray(rng.standard_normal((1003, 7)), dtype=">f4", order=order)
    np.save(tmp_path / "a.npy", A)
    fs = s3_server.filesystem()
    fs.put(str(tmp_path / "a.npy"), f"{s3_bucket}/a.npy")
    cfg = InputConfig(path=f"s3://{s3_bucket}/a.npy", storage_options=s3_server.storage_options)
    src = read_input(cfg, ChunkConfig(target_chunk_mb=0.01))
    assert len(src.X.chunks[0]) > 4
    graph = dict(src.X.__dask_graph__())
    arrays = [v for v in graph.values() if isinstance(v, np.ndarray)]
    assert sum(a.nbytes for a in arrays) < 1024  # no rows travel in the graph
    sources = [s for v in graph.values() for s in _flatten(v) if isinstance(s, RemoteNpyFile)]
    assert sources and all(s.storage_options == s3_server.storage_options for s in sources)
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(src.X.compute(), A.astype(np.float64))
    f = sources[0]
    np.testing.assert_array_equal(f[5:17, 2:5], A[5:17, 2:5])
    np.testing.assert_array_equal(f[[9, 3, 1000]], A[[9, 3, 1000]])

    fs.pipe(f"{s3_bucket}/t.npy", (tmp_path / "a.npy").read_bytes()[:-10])
    from pipeline.data.readers import InputError

    with pytest.raises(InputError, match="header promises"):
        read_input(cfg.model_copy(update={"path": f"s3://{s3_bucket}/t.npy"}))


def _flatten(v):
    """Every object inside a graph value (tasks, tuples, lists, dicts)."""
    stack = [v]
    while stack:
        x = stack.pop()
        yield x
        if isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        else:
            for attr in ("args", "kwargs", "value"):  # dask Task objects
                inner = getattr(x, attr, None)
                if isinstance(inner, (tuple, list, dict)):
                    stack.append(inner)
                elif inner is not None and attr == "value":
                    stack.append(inner)
