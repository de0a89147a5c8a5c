"""The store failing mid-write, for ``kpca run``, ``kpca transform`` and ``kpca update``
with ``--overwrite``, on the S3 server (moto's standalone server, a process) behind the
fault proxy (tests/objectstore/faultproxy.py, a process), the endpoint only in
``storage_options``.

Each command first publishes a result; then a new writer of the same output fails while
it writes its version's data (the faults target the objects of its ``embedding`` after a
few have been written, so the command is well under way):

- connections dropped mid-body (``drop``: the proxy reads half of each request and resets
  the connection; botocore retries, then gives up);
- HTTP 500 on every such write (``error``, persistent: botocore's retries with backoff all
  fail).

After each: exit 1 (the environment's failure) in one error line naming the output,
without a traceback; the published result byte for byte as it was (every object of the
output compared, ``work/`` and the lock aside) with no version folder left beside it (a
failed writer removes its own: pipeline/output/versions.py), ``kpca info`` verifies it (a
transform output, which ``kpca info`` does not read, is verified by the check its writer
runs and read back); with the proxy cleared the next command publishes. A single
transient 500 is retried by the client and the command publishes as if nothing happened.

The three command tests are ``slow`` (2-5 min each here: six commands, two of which wait
out the client's retries); run them with ``-m slow``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.objectstore import test_transactions as tt
from tests.objectstore.test_transactions import assert_unchanged, info_ok, kpca, one_line, run
from tests.published import held_by, without_holds
from tests.reliability.helpers import blobs

pytestmark = pytest.mark.distributed

N, D = 300, 6
#: matching writes let through before the fault: the command is under way by then
AFTER = 2


class ProxiedStore(tt.Store):
    """test_transactions' Store on a bucket reached through the fault proxy: commands get
    the proxy's endpoint (their only storage option); the test reads and writes objects
    on the server directly, unaffected by faults."""

    def __init__(self, s3_store, server, tmp: Path):
        super().__init__("s3", tmp, server, s3_store.bucket)
        self.proxied = s3_store
        self.proxy = s3_store.proxy

    @property
    def options(self) -> dict:
        return self.proxied.storage_options


@pytest.fixture
def store(s3_store, s3_server, tmp_path) -> ProxiedStore:
    assert set(s3_store.storage_options) == {"client_kwargs"}  # the endpoint, nothing else
    return ProxiedStore(s3_store, s3_server, tmp_path)


def fault(store: ProxiedStore, mode: str, *, skip: int = 0, times: int | None = None) -> None:
    """Fail the writes of the new version's ``embedding`` objects with ``mode`` from the
    ``skip + AFTER + 1``-th on (``skip``: matching writes that are copies of the published
    version, made before any data is written), ``times`` of them (None: all)."""
    store.proxy.reset()
    store.proxy.fault(mode, path_contains="embedding", after=skip + AFTER, times=times)


def injected(store: ProxiedStore, name: str, published: set[str]) -> list[dict]:
    """The requests the proxy failed, after checking they were writes of data (not
    copies) into a version of ``name`` that is not a published one."""
    reqs = store.proxy.state()["injected_requests"]
    assert reqs, "no fault was injected"
    base = f"/{store.bucket}/{store.prefix}/{name}/versions/"
    for r in reqs:
        assert r["method"] == "PUT" and not r["copy"], r
        assert r["path"].startswith(base), r
        assert r["path"][len(base) :].split("/")[0] not in published, r
    return reqs


def store_failure(res, store: ProxiedStore, name: str) -> str:
    """Exit 1 (the environment), one error line naming the output, no traceback."""
    text = res.stdout + res.stderr
    assert res.returncode == 1, (res.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    line = one_line(res)
    assert f"{store.bucket}/{store.prefix}/{name}" in line, line
    # the endpoint in the options was reached: no advice to set one
    assert "endpoint goes in storage_options" not in line, line
    return line


def copies(before: dict[str, bytes], vid: str) -> int:
    """The published version's ``embedding`` objects: the new version of a run or an
    update starts as a server-side copy of the published one (its cached stages kept)."""
    return sum(k.startswith(f"versions/{vid}/") and "embedding" in k for k in before)


def kept(pointer: dict) -> list[str]:
    """The versions a pointer names (the published one and its history), sorted."""
    return sorted([pointer["version"], *(h["version"] for h in pointer["history"])])


def put(store: ProxiedStore, seed: int, rows: int = N) -> str:
    return store.put(blobs(rows, D, seed=seed), f"x{seed}.npy")


# ----------------------------------------------------------------------- kpca run
@pytest.mark.slow  # 2-5 min each on a shared 2-core machine
def test_run_store_failures_keep_the_published_run(store, tmp_path):
    def cfg(seed: int) -> Path:
        return tt.config(store, put(store, seed), out, tmp_path / f"{seed}.yaml")

    out = store.url("run")
    assert run(cfg(0)).returncode == 0
    published = info_ok(store, "run")
    lines = {}
    for mode, seed in (("drop", 1), ("error", 2)):
        before = store.objects("run")
        fault(store, mode, skip=copies(before, published["version"]))
        t0 = time.monotonic()
        res = run(cfg(seed), "--overwrite")
        took = time.monotonic() - t0
        reqs = injected(store, "run", {published["version"]})
        store.proxy.clear()
        lines[mode] = store_failure(res, store, "run")
        assert_unchanged(store, "run", before)
        assert store.versions("run") == kept(published)
        assert info_ok(store, "run") == published
        # the store healthy again: the same command publishes
        res = run(cfg(seed), "--overwrite")
        assert res.returncode == 0, res.stderr[-3000:]
        now = info_ok(store, "run")
        assert now["version"] != published["version"]
        assert now["history"][0]["version"] == published["version"]
        assert now["input"]["fingerprint"] != published["input"]["fingerprint"]
        print(f"run, {mode}: {len(reqs)} failed writes in {took:.0f} s; {lines[mode]}")
        published = now

    # one 500 on one write: botocore retries it and the run publishes as if nothing happened
    before = store.objects("run")
    fault(store, "error", skip=copies(before, published["version"]), times=1)
    res = run(cfg(3), "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(injected(store, "run", {published["version"]})) == 1  # one 500, retried
    now = info_ok(store, "run")
    assert now["version"] != published["version"]
    assert [h["version"] for h in now["history"]][:2] == [
        published["version"],
        published["history"][0]["version"],
    ]
    assert now["input"]["n_rows"] == N
    # the kept versions are as they were
    after = store.objects("run")
    assert all(after[k] == v for k, v in before.items() if k.startswith("versions/")), "changed"


# ----------------------------------------------------------------- kpca transform
@pytest.mark.slow  # 2-5 min each on a shared 2-core machine
def test_transform_store_failures_keep_the_published_output(store, tmp_path):
    from pipeline.embed.transform import verify_transform_output
    from pipeline.output.versions import open_output

    model = store.url("model-run")
    assert run(tt.config(store, put(store, 0), model, tmp_path / "m.yaml")).returncode == 0
    model_before = store.objects("model-run")
    out = store.url("emb.zarr")
    rows = 400  # a few chunks of ~100 rows at 0.005 MB

    def transform(seed: int, *extra: str):
        return kpca(
            "transform", model, put(store, 10 + seed, rows + seed), out, "--no-progress",
            "--chunk-mb", "0.005", *store.flags(), *extra,
        )  # fmt: skip

    def read(vid: str | None = None):
        pub = open_output(out, store.options, version=vid)
        verify_transform_output(pub.data, n_rows=pub.manifest["rows"], n_components=3,
                                parquet=False)  # fmt: skip
        return pub, np.asarray(pub.data.open_group("r")["embedding"][...])

    assert transform(0).returncode == 0
    published, emb = read()
    assert emb.shape == (rows, 3) and np.isfinite(emb).all()
    for mode, seed in (("drop", 1), ("error", 2)):
        before = store.objects("emb.zarr")
        fault(store, mode)
        t0 = time.monotonic()
        res = transform(seed, "--overwrite")
        took = time.monotonic() - t0
        reqs = injected(store, "emb.zarr", {published.version})
        store.proxy.clear()
        line = store_failure(res, store, "emb.zarr")
        assert_unchanged(store, "emb.zarr", before)
        assert store.versions("emb.zarr") == sorted(h["version"] for h in published.history)
        again, emb_again = read()
        assert again.version == published.version and again.pointer == published.pointer
        np.testing.assert_array_equal(emb_again, emb)
        res = transform(seed, "--overwrite")
        assert res.returncode == 0, res.stderr[-3000:]
        now, emb = read()
        assert now.version != published.version and emb.shape == (rows + seed, 3)
        assert now.history[1]["version"] == published.version
        print(f"transform, {mode}: {len(reqs)} failed writes in {took:.0f} s; {line}")
        published = now

    before = store.objects("emb.zarr")
    fault(store, "error", times=1)
    res = transform(3, "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(injected(store, "emb.zarr", {published.version})) == 1  # one 500, retried
    now, emb = read()
    assert now.version != published.version and emb.shape == (rows + 3, 3)
    assert np.isfinite(emb).all()
    assert [h["version"] for h in now.history][1:3] == [
        h["version"] for h in published.history
    ][:2]
    after = store.objects("emb.zarr")
    assert all(after[k] == v for k, v in before.items() if k.startswith("versions/")), "changed"
    assert store.objects("model-run") == model_before  # the model was only read


# -------------------------------------------------------------------- kpca update
@pytest.mark.slow  # 2-5 min each on a shared 2-core machine
def test_update_store_failures_keep_the_published_update(store, tmp_path):
    base = store.url("base")
    assert run(tt.config(store, put(store, 0), base, tmp_path / "b.yaml")).returncode == 0
    base_before = store.objects("base")
    out = store.url("run-v2")

    def update(seed: int, *extra: str):
        return kpca(
            "update", base, put(store, 20 + seed, 100 + seed), "--output", out, "--policy",
            "refit", "--no-prefect", "--no-progress", *store.flags(), *extra,
        )  # fmt: skip

    res = update(0)
    assert res.returncode == 0, res.stderr[-3000:]
    published = info_ok(store, "run-v2")
    for mode, seed in (("drop", 1), ("error", 2)):
        before = store.objects("run-v2")
        fault(store, mode, skip=copies(before, published["version"]))
        t0 = time.monotonic()
        res = update(seed, "--overwrite")
        took = time.monotonic() - t0
        reqs = injected(store, "run-v2", {published["version"]})
        store.proxy.clear()
        line = store_failure(res, store, "run-v2")
        assert_unchanged(store, "run-v2", before)
        assert store.versions("run-v2") == kept(published)
        assert info_ok(store, "run-v2") == published
        res = update(seed, "--overwrite")
        assert res.returncode == 0, res.stderr[-3000:]
        now = info_ok(store, "run-v2")
        assert now["version"] != published["version"]
        assert now["history"][0]["version"] == published["version"]
        assert now["update"]["batch_rows"] == 100 + seed
        print(f"update, {mode}: {len(reqs)} failed writes in {took:.0f} s; {line}")
        published = now

    before = store.objects("run-v2")
    fault(store, "error", skip=copies(before, published["version"]), times=1)
    res = update(3, "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(injected(store, "run-v2", {published["version"]})) == 1  # one 500, retried
    now = info_ok(store, "run-v2")
    assert now["version"] != published["version"] and now["update"]["batch_rows"] == 103
    after = store.objects("run-v2")
    assert all(after[k] == v for k, v in before.items() if k.startswith("versions/")), "changed"
    # the base run was only read, but for the hold run-v2 keeps on what it reads there
    # (the base's published version: docs/update.md, "Holds")
    base_now = store.objects("base")
    assert without_holds(base_now, [out]) == base_before
    assert held_by(base_now, out)["versions"] == [info_ok(store, "base")["version"]]
    print(json.dumps({"versions": store.versions("run-v2")}))


# ------------------------------------------------------------- the line's advice
def test_endpoint_advice_only_when_no_connection_was_made():
    """botocore names the endpoint URL in every connection error; the advice to put an
    endpoint in the storage options belongs to a failure to connect at all, not to a
    connection the store dropped or a read that timed out (the endpoint was right)."""
    from botocore.exceptions import (
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    from pipeline.output.verify import describe_store_failure

    url = "http://127.0.0.1:9/b/out/versions/v/embedding/c/1/0"
    for exc in (ConnectionClosedError(endpoint_url=url), ReadTimeoutError(endpoint_url=url)):
        line = describe_store_failure(exc, "s3://b/out")
        assert line.startswith(f"cannot use s3://b/out: the store failed ({type(exc).__name__}")
        assert "endpoint goes in storage_options" not in line, line
    for exc in (
        EndpointConnectionError(endpoint_url=url),
        ConnectTimeoutError(endpoint_url=url),
    ):
        line = describe_store_failure(exc, "s3://b/out")
        assert "endpoint goes in storage_options (or --storage-options)" in line, line
