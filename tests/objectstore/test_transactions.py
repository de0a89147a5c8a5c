"""Publishing is a transaction on every store (pipeline/output/versions.py), shown on a real
S3-protocol server (moto's standalone server, a process on 127.0.0.1) and on local disk.

For ``kpca run``, ``kpca transform`` and ``kpca update`` with ``--overwrite``: a writer
that fails late (a NaN past the rows checked before the start; a stage failure) or is
SIGKILLed while it writes its version leaves the previously published result byte for
byte as it was (every object compared, except ``work/`` and the lock), ``kpca info``
still verifies it, and the next writer succeeds; it leaves the dead writer's version,
begun less than a writer's lease ago (a later writer removes it once it is older:
tests/integrity/test_lifecycle_recovery.py).
Two writers at once to one output: exactly one publishes, the other exits 2 in one line.
A series is read as of an earlier version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.objectstore.s3server import CREDENTIAL_ENV
from tests.published import held_by, s3_tree_bytes, tree_bytes, without_holds
from tests.reliability.helpers import ROOT, blobs, env

pytestmark = pytest.mark.distributed

N, D = 600, 6


class Store:
    """One place to write outputs: a local folder or a prefix of a bucket on the server."""

    def __init__(self, kind: str, tmp: Path, server=None, bucket: str | None = None):
        self.kind, self.tmp, self.server, self.bucket = kind, tmp, server, bucket
        self.prefix = uuid.uuid4().hex[:8]

    @property
    def options(self) -> dict:
        return self.server.storage_options if self.kind == "s3" else {}

    def url(self, name: str) -> str:
        if self.kind == "s3":
            return f"s3://{self.bucket}/{self.prefix}/{name}"
        return str(self.tmp / name)

    def put(self, array: np.ndarray, name: str) -> str:
        local = self.tmp / f"{uuid.uuid4().hex[:6]}-{name}"
        np.save(local, array)
        if self.kind == "s3":
            self.server.filesystem().put(str(local), f"{self.bucket}/{self.prefix}/in/{name}")
            return self.url(f"in/{name}")
        return str(local)

    def objects(self, name: str) -> dict[str, bytes]:
        """Every object of the output ``name`` with its bytes (``work/`` and the lock left
        out)."""
        if self.kind == "s3":
            fs = self.server.filesystem()
            return s3_tree_bytes(fs, f"{self.bucket}/{self.prefix}/{name}")
        return tree_bytes(self.tmp / name)

    def versions(self, name: str) -> list[str]:
        return sorted(self.listing(name))

    def listing(self, name: str) -> dict[str, list[str]]:
        """The version folders of the output ``name`` with their top-level entries."""
        if self.kind == "s3":
            fs = self.server.filesystem()
            base = f"{self.bucket}/{self.prefix}/{name}/versions"
            try:
                vids = [p.rstrip("/").rpartition("/")[2] for p in fs.ls(base, detail=False)]
                return {
                    v: [p.rpartition("/")[2] for p in fs.ls(f"{base}/{v}", detail=False)]
                    for v in vids
                }
            except FileNotFoundError:
                return {}
        base = self.tmp / name / "versions"
        try:
            return {v: os.listdir(base / v) for v in os.listdir(base)}
        except FileNotFoundError:
            return {}

    def flags(self) -> list[str]:
        return ["--storage-options", json.dumps(self.options)] if self.kind == "s3" else []


@pytest.fixture(scope="module")
def server_env(s3_server):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIAL_ENV.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        yield s3_server


#: the s3 cases take minutes each (a real server, SIGKILLed writers): `-m slow`
@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def store(request, tmp_path, server_env):
    """A local folder, then a bucket on the server."""
    if request.param == "s3":
        bucket = server_env.make_bucket(f"kpca-{uuid.uuid4().hex[:12]}")
        return Store("s3", tmp_path, server_env, bucket)
    return Store("local", tmp_path)


@pytest.fixture
def s3store(tmp_path, server_env):
    """A bucket on the server (the local-disk cases of transform are tests/safety's)."""
    bucket = server_env.make_bucket(f"kpca-{uuid.uuid4().hex[:12]}")
    return Store("s3", tmp_path, server_env, bucket)


def kpca(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, args)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(*args: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *map(str, args)],
            cwd=ROOT,
            env=env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def config(store: Store, inp: str, out: str, path: Path, **over) -> Path:
    opts = {"storage_options": store.options} if store.kind == "s3" else {}
    cfg = {
        "input": {"path": inp, **opts},
        "kernel": {"name": "rbf", "gamma": 0.02},
        "solver": {
            "n_components": 3,
            "eigen_solver": "randomized",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01, "block_rows": 100},
        "kernel_store": {"materialize": "never"},
        "output": {"path": out, "parquet": True, **opts},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "dashboard_address": None},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    return kpca("run", cfg, "--no-prefect", "--no-progress", *extra)


def one_line(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    return lines[0]


def assert_unchanged(store: Store, name: str, before: dict[str, bytes], dead_ok: bool = False):
    """The published result is byte for byte as before; with ``dead_ok`` a killed writer's
    unpublished version may lie beside it (nothing points to it), nothing else."""
    after = store.objects(name)
    extra = set(after) - set(before)
    if dead_ok:
        dead = {k.split("/")[1] for k in extra}
        assert all(k.startswith("versions/") for k in extra) and len(dead) <= 1, sorted(extra)
    else:
        assert not extra, sorted(extra)
    assert set(before) <= set(after), sorted(set(before) - set(after))
    changed = [k for k in before if before[k] != after[k]]
    assert not changed, changed


def info_ok(store: Store, name: str) -> dict:
    res = kpca("info", store.url(name), *store.flags())
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(kpca("info", store.url(name), "--json", *store.flags()).stdout)


def wait_for_new_version(store: Store, name: str, known: set[str], proc, timeout=240) -> str:
    """Poll (listing only) until the writer has created a version of its own and put an
    object in it beyond its marker; its id."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        for vid, entries in store.listing(name).items():
            if vid not in known and set(entries) - {"_kpca-dask.json"}:
                return vid
        assert proc.poll() is None, f"the writer ended (rc {proc.returncode}) before writing"
        time.sleep(0.02)
    raise AssertionError("no new version appeared")


def kill(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    assert proc.returncode == -signal.SIGKILL


# ----------------------------------------------------------------------- kpca run
# moved out of the default run (its 20-minute budget, 2026-11-28): ~75 s;
# tests/safety/test_flow_publish.py and tests/integrity/test_lifecycle_*.py keep a failed
# writer's previous run published
@pytest.mark.slow
def test_run_overwrite_failing_or_killed_keeps_the_published_run(store, tmp_path):
    x = blobs(N, D)
    inp = store.put(x, "x.npy")
    out = store.url("run")
    good = config(store, inp, out, tmp_path / "good.yaml")
    assert run(good).returncode == 0
    first = info_ok(store, "run")
    before = store.objects("run")
    assert store.versions("run") == [first["version"]]

    # a NaN past the rows checked before the run starts: found by ingest
    bad = x.copy()
    bad[-3, 1] = np.nan
    nan_cfg = config(store, store.put(bad, "nan.npy"), out, tmp_path / "nan.yaml")
    res = run(nan_cfg, "--overwrite")
    assert res.returncode == 2 and "NaN" in one_line(res), res.stderr[-2000:]
    assert_unchanged(store, "run", before)
    assert info_ok(store, "run") == first

    # a stage failure after the new version has been written to (solve)
    big = config(store, inp, out, tmp_path / "big.yaml", solver={"n_components": N + 50})
    res = run(big, "--overwrite")
    assert res.returncode == 2, res.stderr[-2000:]
    assert_unchanged(store, "run", before)

    # SIGKILLed while it writes its version (another gamma: every stage writes)
    other = config(store, inp, out, tmp_path / "other.yaml", kernel={"gamma": 0.05})
    proc = start(
        "run", other, "--overwrite", "--no-prefect", "--no-progress", log=tmp_path / "k.log"
    )
    try:
        dead = wait_for_new_version(store, "run", {first["version"]}, proc)
        time.sleep(0.3)
    finally:
        kill(proc)
    assert_unchanged(store, "run", before, dead_ok=True)
    assert info_ok(store, "run") == first

    # the next run publishes; the dead writer's version, younger than a writer's lease, is
    # left (a complete copy of the published one or a part: never published either way)
    res = run(other, "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    now = info_ok(store, "run")
    assert now["version"] not in (first["version"], dead)
    assert [h["version"] for h in now["history"] if "expired" not in h] == [first["version"]]
    assert set(store.versions("run")) - {dead} == {first["version"], now["version"]}
    assert now["config"]["kernel"]["gamma"] == 0.05
    # the first night is still readable as it was
    old = kpca("info", out, "--version", first["version"], "--json", *store.flags())
    assert old.returncode == 0 and json.loads(old.stdout)["config"]["kernel"]["gamma"] == 0.02


@pytest.mark.slow
def test_two_runs_at_once_only_one_publishes(s3store, tmp_path):
    store = s3store
    inp = store.put(blobs(N, D), "x.npy")
    out = store.url("run")
    cfgs = [
        config(store, inp, out, tmp_path / f"c{i}.yaml", kernel={"gamma": g})
        for i, g in enumerate((0.02, 0.03))
    ]
    procs = [
        start("run", c, "--no-prefect", "--no-progress", log=tmp_path / f"{i}.log")
        for i, c in enumerate(cfgs)
    ]
    for p in procs:
        p.wait(300)
    codes = sorted(p.returncode for p in procs)
    logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
    assert codes == [0, 2], logs
    loser = logs[[p.returncode for p in procs].index(2)]
    lines = [ln for ln in loser.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in loser, loser[-2000:]
    assert "locked" in lines[0] or "published by another writer" in lines[0], lines
    m = info_ok(store, "run")
    winner = [p.returncode for p in procs].index(0)
    assert m["config"]["kernel"]["gamma"] == (0.02, 0.03)[winner]
    assert store.versions("run") == [m["version"]]


# ----------------------------------------------------------------- kpca transform
@pytest.fixture
def model_run(s3store, tmp_path):
    """A published run on the server to transform and update."""
    store = s3store
    inp = store.put(blobs(N, D), "x.npy")
    cfg = config(store, inp, store.url("model-run"), tmp_path / "model.yaml")
    assert run(cfg).returncode == 0
    return store.url("model-run")


def transform(store, model, data, out, *extra):
    return kpca("transform", model, data, out, "--no-progress", *store.flags(), *extra)


@pytest.mark.slow
def test_transform_overwrite_failing_or_killed_keeps_the_published_output(
    s3store, model_run, tmp_path
):
    store = s3store
    from pipeline.output.versions import open_output

    out = store.url("emb.zarr")
    batch = store.put(blobs(40, D, seed=1), "b.npy")
    assert transform(store, model_run, batch, out).returncode == 0
    before = store.objects("emb.zarr")
    pub = open_output(out, store.options)
    rows = pub.data.open_group("r")["embedding"][...]

    bad = blobs(4000, D, seed=2)
    bad[-5, 0] = np.nan  # found while the new version is written
    res = transform(store, model_run, store.put(bad, "bad.npy"), out, "--overwrite")
    assert res.returncode == 2 and "NaN" in one_line(res), res.stderr[-2000:]
    assert_unchanged(store, "emb.zarr", before)

    # SIGKILLed while it writes its version: a batch of many small chunks
    slow = store.put(blobs(60000, D, seed=3), "slow.npy")
    proc = start(
        "transform", model_run, slow, out, "--overwrite", "--no-progress",
        "--chunk-mb", "0.005", *store.flags(), log=tmp_path / "t.log",
    )  # fmt: skip
    try:
        dead = wait_for_new_version(store, "emb.zarr", {pub.version}, proc)
    finally:
        kill(proc)
    assert_unchanged(store, "emb.zarr", before, dead_ok=True)
    again = open_output(out, store.options)
    assert again.version == pub.version
    np.testing.assert_array_equal(again.data.open_group("r")["embedding"][...], rows)

    # the next transform publishes; the dead one's version, younger than a writer's lease,
    # is left for a later writer
    res = transform(store, model_run, batch, out, "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    now = open_output(out, store.options)
    assert set(store.versions("emb.zarr")) - {dead} == {pub.version, now.version}


@pytest.mark.slow
def test_two_transforms_at_once_only_one_publishes(s3store, model_run, tmp_path):
    store = s3store
    from pipeline.output.versions import open_output

    out = store.url("shared.zarr")
    batches = [store.put(blobs(60000 + i, D, seed=i), f"b{i}.npy") for i in range(2)]
    procs = [
        start(
            "transform",
            model_run,
            b,
            out,
            "--overwrite",
            "--no-progress",
            "--chunk-mb",
            "0.005",
            *store.flags(),
            log=tmp_path / f"{i}.log",
        )  # fmt: skip
        for i, b in enumerate(batches)
    ]
    for p in procs:
        p.wait(300)
    logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
    assert sorted(p.returncode for p in procs) == [0, 2], logs
    loser = logs[[p.returncode for p in procs].index(2)]
    lines = [ln for ln in loser.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in loser, loser[-2000:]
    winner = [p.returncode for p in procs].index(0)
    pub = open_output(out, store.options)
    assert pub.data.open_group("r")["embedding"].shape[0] == 60000 + winner
    assert store.versions("shared.zarr") == [pub.version]


# -------------------------------------------------------------------- kpca update
@pytest.mark.slow
def test_update_overwrite_failing_or_killed_keeps_the_published_update(
    s3store, model_run, tmp_path
):
    store = s3store
    out = store.url("run-v2")

    def update(batch, *extra):
        return kpca(
            "update", model_run, batch, "--output", out, "--policy", "refit", "--no-prefect",
            "--no-progress", *store.flags(), *extra,
        )  # fmt: skip

    res = update(store.put(blobs(120, D, seed=1), "b1.npy"))
    assert res.returncode == 0, res.stderr[-3000:]
    first = info_ok(store, "run-v2")
    before = store.objects("run-v2")
    base_before = store.objects("model-run")

    bad = blobs(600, D, seed=2)
    bad[-2, 3] = np.nan
    res = update(store.put(bad, "bad.npy"), "--overwrite")
    assert res.returncode == 2 and "NaN" in one_line(res), res.stderr[-2000:]
    assert_unchanged(store, "run-v2", before)

    log = tmp_path / "u.log"
    proc = start(
        "update", model_run, store.put(blobs(200, D, seed=4), "b4.npy"), "--output", out,
        "--policy", "refit", "--overwrite", "--no-prefect", "--no-progress", *store.flags(),
        log=log,
    )  # fmt: skip
    try:
        dead = wait_for_new_version(store, "run-v2", {first["version"]}, proc)
        time.sleep(0.3)
    finally:
        kill(proc)
    assert_unchanged(store, "run-v2", before, dead_ok=True)
    assert info_ok(store, "run-v2") == first

    res = update(store.put(blobs(150, D, seed=5), "b5.npy"), "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    now = info_ok(store, "run-v2")
    assert now["update"]["batch_rows"] == 150
    # the dead writer's version is younger than a writer's lease: left for a later writer
    assert set(store.versions("run-v2")) - {dead} == {first["version"], now["version"]}
    # the base run was only read, but for the hold run-v2 keeps on what it reads there,
    # rewritten at each publish (docs/update.md, "Holds")
    base_now = store.objects("model-run")
    assert without_holds(base_now, [out]) == without_holds(base_before, [out])
    assert held_by(base_now, out)["versions"] == [info_ok(store, "model-run")["version"]]
