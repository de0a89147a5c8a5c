"""The plain (``--no-prefect``) pipeline with its input and output on a real S3-protocol
server (moto's standalone server, a separate process on 127.0.0.1).

The endpoint reaches the pipeline only through the config's ``storage_options`` (and the
commands' ``--storage-options``): AWS_ENDPOINT_URL is unset, so a store reopened without
its options would go to Amazon and fail. The credentials are canaries in the environment,
where botocore reads them; no artifact and no log may hold them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.objectstore.s3server import CREDENTIAL_ENV
from tests.reliability.helpers import ROOT, blobs, env, run_command, start_job, wait_until

pytestmark = pytest.mark.distributed

#: credentials the local server accepts (any) and that must never leave the environment
CANARY = {
    "AWS_ACCESS_KEY_ID": "AKIDKPCACANARY0S3TEST",
    "AWS_SECRET_ACCESS_KEY": "kpca-canary-secret-" + uuid.uuid4().hex,
}
N, D, BLOCK = 600, 8, 100
N_BLOCKS = (N // BLOCK) * (N // BLOCK + 1) // 2  # upper kernel blocks: 21


@pytest.fixture(scope="module")
def s3(s3_server):
    """The server with the canary credentials in this process's environment (inherited by
    every command the tests start) and no endpoint variable; a bucket for the module."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**CREDENTIAL_ENV, **CANARY}.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        bucket = s3_server.make_bucket(f"kpca-{uuid.uuid4().hex[:12]}")
        yield s3_server, bucket


def _config(path: Path, inp: str, out: str, options: dict | None, **input_over) -> Path:
    opts = {"storage_options": options} if options else {}
    cfg = {
        "input": {"path": inp, **opts, **input_over},
        "kernel": {"name": "rbf", "gamma": 0.02},
        "solver": {
            "n_components": 3,
            "eigen_solver": "randomized",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01, "block_rows": BLOCK},
        "kernel_store": {"materialize": "always"},
        "output": {"path": out, "parquet": True, **opts},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 2, "threads_per_worker": 1, "dashboard_address": None},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(cfg: Path, log: Path, *extra: str) -> subprocess.CompletedProcess:
    res = subprocess.run(
        run_command(cfg, *extra),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log.write_text(res.stdout + res.stderr)
    return res


def _kpca(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _artifacts(out: str, options: dict | None) -> dict:
    """A verified run's artifacts: the input fingerprint and the stored kernel matrix
    (hashed), the published arrays, the model's arrays and the Parquet rows."""
    import hashlib

    import kpca_dask
    from pipeline.output.export import open_run
    from pipeline.output.store import Location

    root = Location.at(out, options)
    run = open_run(root)  # the published version, verified
    m, loc = run.manifest, run.location
    g = loc.open_group("r")
    K = root.child("work", "kernel.zarr").open_group("r")["K"][...]
    model = kpca_dask.load(run.model.zarr_source())
    pq = run.child("embedding.parquet")
    df = pd.read_parquet(pq.fs_path, filesystem=pq.fs).sort_values("id")
    return {
        "input": m["input"]["fingerprint"],
        "kernel": hashlib.sha256(np.ascontiguousarray(K).tobytes()).hexdigest(),
        "arrays": {name: np.asarray(g[name][...]) for name in m["checksums"]},
        "model": {
            k: np.asarray(getattr(model, k))
            for k in ("X_fit_", "eigenvalues_", "eigenvectors_")
        },
        "parquet": df.reset_index(drop=True),
    }


def _assert_same_run(a: dict, b: dict) -> None:
    """Identical: the inputs of the solve (fingerprint, kernel store, training rows), the
    published arrays, the model and the Parquet rows, bit for bit. (Block products ask for
    aligned operands, kpca_dask/gram.py: before that, rows arriving unaligned in a Dask
    message were multiplied by numpy's own loop and the runs differed in the last bits.)"""
    assert a["input"] == b["input"] and a["kernel"] == b["kernel"]
    np.testing.assert_array_equal(a["model"]["X_fit_"], b["model"]["X_fit_"])
    assert a["arrays"].keys() == b["arrays"].keys()
    for name, x in a["arrays"].items():
        np.testing.assert_array_equal(x, b["arrays"][name], err_msg=name)
    for k in ("eigenvalues_", "eigenvectors_"):
        np.testing.assert_array_equal(a["model"][k], b["model"][k], err_msg=k)
    pa, pb = a["parquet"], b["parquet"]
    assert list(pa.columns) == list(pb.columns)
    pd.testing.assert_frame_equal(pa, pb, check_exact=True)


def _no_canary(texts: dict[str, bytes]) -> None:
    for name, data in texts.items():
        for k, v in CANARY.items():
            assert v.encode() not in data, f"{k} found in {name}"


@pytest.fixture(scope="module")
def data(tmp_path_factory, s3):
    """The same rows as a local NPY file and in the bucket as NPY, CSV and Parquet."""
    server, bucket = s3
    folder = tmp_path_factory.mktemp("s3-data")
    X = blobs(N, D)
    np.save(folder / "x.npy", X)
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(D)])
    df.insert(0, "row_id", np.arange(N))
    df["label"] = np.arange(N) % 3
    df.to_csv(folder / "x.csv", index=False)
    df.to_parquet(folder / "x.parquet", index=False)
    fs = server.filesystem()
    for name in ("x.npy", "x.csv", "x.parquet"):
        fs.put(str(folder / name), f"{bucket}/in/{name}")
    return folder


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, data):
    """The reference: the same config on local disk."""
    folder = tmp_path_factory.mktemp("local-run")
    cfg = _config(folder / "run.yaml", str(data / "x.npy"), str(folder / "out"), None)
    res = _run(cfg, folder / "run.log")
    assert res.returncode == 0, res.stderr[-3000:]
    return _artifacts(str(folder / "out"), None)


@pytest.fixture(scope="module")
def s3_run(tmp_path_factory, s3, data):
    """The NPY run with input and output in the bucket; its url and its log."""
    server, bucket = s3
    folder = tmp_path_factory.mktemp("s3-run")
    out = f"s3://{bucket}/runs/npy"
    cfg = _config(folder / "run.yaml", f"s3://{bucket}/in/x.npy", out, server.storage_options)
    res = _run(cfg, folder / "run.log")
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res.stdout + res.stderr


# moved out of the default run (its 20-minute budget; 2026-11-28, second cut): ~47 s; an S3
# run identical to shared disk is tests/objectstore/test_isolated_workers.py's
@pytest.mark.slow
def test_s3_run_is_identical_to_the_local_run(s3, s3_run, local_run):
    """Input and output on s3://, the endpoint only in the config: the run completes, its
    input fingerprint, kernel store and training rows are the local run's byte for byte,
    and its embedding, spectrum, model and Parquet rows the local run's."""
    server, _ = s3
    out, log = s3_run
    assert "run complete" in log
    _assert_same_run(_artifacts(out, server.storage_options), local_run)


# moved out of the default run (its 20-minute budget, 2026-11-28): ~33 s;
# test_s3_run_is_identical_to_the_local_run stays
@pytest.mark.slow
def test_kpca_info_and_transform_on_the_s3_run(tmp_path, s3, s3_run, data):
    """``kpca info`` and ``kpca transform`` read the run in the bucket with
    ``--storage-options`` (inline JSON, or a YAML file), write their output there, and
    embed like the local model; without the options they fail in one line."""
    server, bucket = s3
    out, _ = s3_run
    opts_json = json.dumps(server.storage_options)
    opts_file = tmp_path / "s3.yaml"
    opts_file.write_text(yaml.safe_dump(server.storage_options))

    info = _kpca("info", out, "--storage-options", opts_json)
    assert info.returncode == 0, info.stderr[-2000:]
    assert f"run        {out}  [complete, verified]" in info.stdout
    assert "embedding.parquet" in info.stdout

    from tests.reliability.helpers import free_port

    nowhere = json.dumps(  # a closed port, tried once (botocore retries take ~18 s)
        {
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
            "config_kwargs": {"retries": {"max_attempts": 1}},
        }
    )
    wrong = _kpca("info", out, "--no-verify", "--storage-options", nowhere)
    assert wrong.returncode == 1, wrong.stderr[-2000:]
    lines = wrong.stderr.strip().splitlines()
    assert len(lines) == 1 and "storage_options (or --storage-options)" in lines[0], lines

    secret = _kpca("info", out, "--storage-options", '{"secret": "x"}')
    assert secret.returncode == 2
    assert "--storage-options must not hold credentials (['secret'])" in secret.stderr

    new = blobs(40, D, seed=1)
    np.save(tmp_path / "new.npy", new)
    server.filesystem().put(str(tmp_path / "new.npy"), f"{bucket}/in/new.npy")
    emb_url = f"s3://{bucket}/transformed/emb.zarr"
    tr = _kpca(
        "transform",
        out,
        f"s3://{bucket}/in/new.npy",
        emb_url,
        "--storage-options",
        str(opts_file),
    )
    assert tr.returncode == 0, tr.stderr[-2000:]
    import kpca_dask
    from pipeline.output.export import open_run
    from pipeline.output.versions import open_output

    got = open_output(emb_url, server.storage_options).data.open_group("r")["embedding"][...]
    model = kpca_dask.load(open_run(out, server.storage_options).model.zarr_source())
    np.testing.assert_allclose(got, model.transform(new), rtol=1e-10, atol=1e-12)

    pq_url = f"s3://{bucket}/transformed/emb.parquet"  # Parquet output, local input
    tr = _kpca(
        "transform", out, str(tmp_path / "new.npy"), pq_url, "--storage-options", opts_json
    )
    assert tr.returncode == 0, tr.stderr[-2000:]
    pq = open_output(pq_url, server.storage_options).data
    df = pd.read_parquet(pq.fs_path, filesystem=pq.fs)
    np.testing.assert_allclose(df.filter(like="pc").to_numpy(), got, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_tabular_inputs_in_the_bucket(tmp_path, s3, s3_run, fmt):
    """CSV and Parquet inputs in the bucket (with id and label columns), read with the
    input's own options: the embedding is the NPY run's."""
    server, bucket = s3
    out = f"s3://{bucket}/runs/{fmt}"
    cfg = _config(
        tmp_path / "run.yaml",
        f"s3://{bucket}/in/x.{fmt}",
        out,
        server.storage_options,
        id_column="row_id",
        label_column="label",
    )
    res = _run(cfg, tmp_path / "run.log")
    assert res.returncode == 0, res.stderr[-3000:]
    from pipeline.output.export import verify_run
    from pipeline.output.store import Location

    m = verify_run(Location(out, server.storage_options))
    ref = verify_run(Location(s3_run[0], server.storage_options))
    assert m["checksums"]["embedding"] == ref["checksums"]["embedding"]
    assert m["input"]["n_rows"] == N and "labels" in m["checksums"]


def _done_blocks(fs, prefix: str) -> list[str]:
    try:
        return fs.find(f"{prefix}/work/kernel.zarr/done/c")
    except FileNotFoundError:
        return []


@pytest.mark.slow  # ~25 s
def test_killed_s3_run_resumes_and_a_corrupted_block_is_recomputed(
    tmp_path, s3, data, local_run
):
    """SIGKILL of the whole job (driver + local cluster) during the kernel build on s3://;
    one finished block's chunk is then corrupted in the bucket. The same command resumes:
    it breaks the dead run's lock, reuses the ingest, verifies the finished blocks, keeps
    the intact ones, recomputes the corrupted one and the rest, and publishes artifacts
    identical to the local run's."""
    server, bucket = s3
    fs = server.filesystem()
    prefix = f"{bucket}/runs/killed"
    out = f"s3://{prefix}"
    cfg = _config(tmp_path / "run.yaml", f"s3://{bucket}/in/x.npy", out, server.storage_options)
    # slow the kernel build down enough to stop it part way: one block at a time
    text = yaml.safe_load(cfg.read_text())
    text["cluster"]["n_workers"] = 1
    cfg.write_text(yaml.safe_dump(text))
    job = start_job(run_command(cfg), tmp_path / "killed.log")
    try:
        ok = wait_until(lambda: len(_done_blocks(fs, prefix)) >= 3, 180, 0.05, proc=job)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    assert ok, (tmp_path / "killed.log").read_text()[-3000:]
    time.sleep(1.0)  # writes in flight from the dead processes land (or never do)
    finished = len(_done_blocks(fs, prefix))
    assert 0 < finished < N_BLOCKS, finished
    assert not fs.exists(f"{prefix}/manifest.json")
    assert fs.exists(f"{prefix}/.kpca-run.lock")

    # corrupt a finished block: its done marker is there, its chunk's bytes change
    i, j = (int(p) for p in sorted(_done_blocks(fs, prefix))[0].split("/")[-2:])
    chunk = f"{prefix}/work/kernel.zarr/K/c/{i}/{j}"
    raw = bytearray(fs.cat(chunk))
    raw[100] ^= 0xFF
    fs.pipe(chunk, bytes(raw))

    res = _run(cfg, tmp_path / "resumed.log")
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert f"breaking the stale lock of {out}" in log and f"pid {job.pid}" in log
    assert "ingest: reusing" in log
    assert f"block ({i}, {j}) failed verification; recomputing" in log
    m = re.search(r"kernel store: (\d+) blocks computed, (\d+) verified and kept", log)
    assert m, log[-3000:]
    computed, kept = int(m.group(1)), int(m.group(2))
    assert computed + kept == N_BLOCKS and kept == finished - 1, (computed, kept, finished)
    assert not fs.exists(f"{prefix}/.kpca-run.lock")
    _assert_same_run(_artifacts(out, server.storage_options), local_run)


def test_no_credential_in_any_object_or_log(tmp_path, s3, s3_run):
    """Every object the runs wrote to the bucket, and the run's log, are free of the
    credentials (which only the environment held); the endpoint is where it belongs."""
    server, bucket = s3
    out, log = s3_run
    fs = server.filesystem()
    objects = {p: fs.cat(p) for p in fs.find(f"{bucket}/runs")}
    assert any(p.endswith("manifest.json") for p in objects)
    _no_canary({**objects, "log": log.encode()})
    manifest = json.loads(objects[f"{out.removeprefix('s3://')}/manifest.json"])
    assert manifest["config"]["output"]["storage_options"] == server.storage_options
