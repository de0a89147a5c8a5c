"""`kpca plan` of a config whose input is on an object store (a real S3-protocol server:
moto's standalone server) and of a config naming a running cluster: the input's shape is
read through ``input.storage_options`` as `kpca validate` reads it, the cluster's size is
the scheduler's answer, and the I/O stages are priced from the store's calibrated rates."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import yaml

from flows.cli import main
from kpca_dask.cost import Machine

N, D = 5000, 6


def _put_npy(fs, key: str, X: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, X)
    fs.pipe(key, buf.getvalue())


def _config(tmp_path, inp: str, opts: dict | None, **extra) -> str:
    cfg = {
        "input": {"path": inp, **({"storage_options": opts} if opts else {})},
        "solver": {"n_components": 4, "eigen_solver": "nystroem", "n_landmarks": 64},
        "output": {"path": str(tmp_path / "out"), "parquet": True},
        "evaluate": {"enabled": False},
        **extra,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _plan(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_plan_reads_an_s3_input_through_its_storage_options(
    s3_server, s3_bucket, tmp_path, capsys
):
    _put_npy(s3_server.filesystem(), f"{s3_bucket}/in/x.npy", np.ones((N, D)))
    url = f"s3://{s3_bucket}/in/x.npy"
    plan = _plan(capsys, _config(tmp_path, url, s3_server.storage_options))
    assert (plan["n_rows"], plan["n_features"]) == (N, D)
    source = plan["io"]["ingest"]["transfers"][0]
    assert source["url"] == url and source["nbytes"] >= N * D * 8
    # an object that is not there: one line naming it and the fix, exit 2
    missing = f"s3://{s3_bucket}/in/missing.npy"
    assert main(["plan", _config(tmp_path, missing, s3_server.storage_options)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and missing in err[0] and "input.storage_options" in err[0]


def test_plan_prices_reads_from_the_store_at_its_calibrated_rates(
    s3_server, s3_bucket, tmp_path, capsys
):
    """The same S3 input priced with a slow store and a fast one (calibration files): the
    ingest's seconds follow its requests' latency and bytes, the solve's do not move."""
    _put_npy(s3_server.filesystem(), f"{s3_bucket}/in/x.npy", np.ones((N, D)))
    cfg = _config(
        tmp_path,
        f"s3://{s3_bucket}/in/x.npy",
        s3_server.storage_options,
        chunks={"target_chunk_mb": 0.05},  # 1 042 rows a chunk: 5 chunks
    )
    plans = {}
    for name, latency, rate in (("fast", 1e-3, 1e9), ("slow", 1.0, 1e6)):
        store = {"latency": latency, "read": rate, "write": rate}
        store |= {"read_aggregate": rate, "write_aggregate": rate}
        m = Machine(object_stores={"s3": store})
        cal = tmp_path / f"{name}.json"
        cal.write_text(json.dumps(m.to_dict()))
        plans[name] = _plan(capsys, cfg, "--calibration", str(cal), "--workers", "1")
    fast, slow = plans["fast"], plans["slow"]
    assert fast["io"]["ingest"]["chunks"] == slow["io"]["ingest"]["chunks"] == 5
    # 5 range reads of 1 s each on one thread, and 240 kB at 1 MB/s: over 5 s more
    gap = slow["stages"]["ingest"] - fast["stages"]["ingest"]
    assert 5.0 < gap < 5.0 + 2 * N * D * 8 / 1e6
    assert slow["stages"]["solve"] == pytest.approx(fast["stages"]["solve"])
    # the output is a local folder: the ingest store's writes are the disk's, not S3's
    assert slow["io"]["ingest"]["transfers"][1]["url"] == str(tmp_path / "out")


def test_plan_asks_the_running_cluster_at_cluster_address(dask_cluster, tmp_path, capsys):
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((N, D)))
    address = dask_cluster.scheduler_address
    cfg = _config(tmp_path, str(data), None, cluster={"address": address})
    plan = _plan(capsys, cfg)
    cl = plan["fit"]["cluster"]
    assert (cl["workers"], cl["threads"], cl["nodes"]) == (2, 1, 1)
    assert cl["memory"] == pytest.approx(2 * 2**30)  # the fixture's 2GiB limit
    # a flag given replaces its part of the answer
    assert _plan(capsys, cfg, "--threads", "3")["fit"]["cluster"]["threads"] == 3
    assert main(["plan", cfg]) == 0
    assert "2 workers x 1 threads, 2.1 GB each" in capsys.readouterr().out


def test_calibrating_a_store_measures_it_and_leaves_nothing(s3_server, s3_bucket):
    from kpca_dask.cost.calibration_io import _store_rates

    fs = s3_server.filesystem()
    fs.pipe(f"{s3_bucket}/keep/me", b"1")
    before = sorted(fs.find(s3_bucket))
    r = _store_rates(f"s3://{s3_bucket}/keep", s3_server.storage_options, 1 << 20, 2)
    assert 0 < r["latency"] < 5
    assert all(r[k] > 1e5 for k in ("read", "write", "read_aggregate", "write_aggregate"))
    fs.invalidate_cache()
    assert sorted(fs.find(s3_bucket)) == before


@pytest.mark.cluster
def test_calibrate_measures_the_store_on_a_worker_at_a_chunks_size(s3_server, s3_bucket):
    """The store's rates come from a task on a worker (where the stages move their
    chunks), with objects of a chunk's size (8 MiB quick, 64 MiB otherwise: 64 MiB
    objects read at a third of 32 MiB ones' rate on the S3 server), and leave nothing.
    The cluster is started here: its worker reads the credentials from its environment,
    as a run's workers do."""
    from distributed import Client, LocalCluster, get_task_stream

    from kpca_dask.cost import calibrate

    fs = s3_server.filesystem()
    fs.pipe(f"{s3_bucket}/keep/me", b"1")
    before = sorted(fs.find(s3_bucket))
    url = f"s3://{s3_bucket}/cal"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
        get_task_stream(client) as ts,
    ):
        m = calibrate(client, quick=True, store=url, storage_options=s3_server.storage_options)
        workers = set(client.scheduler_info(n_workers=-1)["workers"])
    ran = [t for t in ts.data if "_store_rates" in str(t["key"])]
    assert len(ran) == 1 and ran[0]["worker"] in workers, ran
    r = m.object_stores["s3"]
    assert r["measured_at"] == url and r["object_bytes"] == 8 << 20 and r["streams"] >= 2
    assert all(r[k] > 1e5 for k in ("read", "write", "read_aggregate", "write_aggregate"))
    assert Machine.from_dict(m.to_dict()).object_store("s3")["read"] == r["read"]
    fs.invalidate_cache()
    assert sorted(fs.find(s3_bucket)) == before


@pytest.mark.cluster
def test_a_stores_stage_fixed_part_is_measured_by_a_tiny_run_and_priced(
    s3_server, s3_bucket, tmp_path, capsys
):
    """`kpca calibrate --store`'s last step: tiny real runs of the stages on the store
    (three, each on its own local cluster), each stage's time less its chunks' price, the
    median; the plan of a run writing to that kind of store then adds exactly that to each
    stage. The runs leave nothing on the store."""
    from pipeline.runtime.stage_calibration import measure_stage_seconds

    fs = s3_server.filesystem()
    fs.pipe(f"{s3_bucket}/keep/me", b"1")
    before = sorted(fs.find(s3_bucket))
    m = Machine()
    fixed = measure_stage_seconds(f"s3://{s3_bucket}/tmp", s3_server.storage_options, m)
    assert set(fixed) == {"ingest", "split", "embed"}, fixed
    # the client's requests at least: a stage on the store is never free
    assert fixed["ingest"] > 0.05 and fixed["embed"] > 0.05, fixed
    assert all(v < 60 for v in fixed.values()), fixed
    fs.invalidate_cache()
    assert sorted(fs.find(s3_bucket)) == before

    out = f"s3://{s3_bucket}/out"
    cfg = _config(tmp_path, str(tmp_path / "x.npy"), None)
    doc = yaml.safe_load(open(cfg))
    doc["output"].update(path=out, storage_options=s3_server.storage_options)
    open(cfg, "w").write(yaml.safe_dump(doc))
    bare, cal = tmp_path / "bare.json", tmp_path / "cal.json"
    bare.write_text(json.dumps(m.to_dict()))
    cal.write_text(json.dumps({**m.to_dict(), "stage_seconds": {"s3": fixed}}))
    shape = ("--rows", "100000", "--features", "8", "--passes", "1")
    a = _plan(capsys, cfg, *shape, "--calibration", str(bare))["stages"]
    b = _plan(capsys, cfg, *shape, "--calibration", str(cal))["stages"]
    for stage, sec in fixed.items():
        assert b[stage] == pytest.approx(a[stage] + sec), stage
    assert b["solve"] == a["solve"]
