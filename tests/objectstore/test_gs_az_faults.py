"""Connections dropped mid-write on gs:// and az://, for ``kpca transform --overwrite`` and
``kpca update --overwrite``: gcp-storage-emulator and azurite (processes on 127.0.0.1),
each behind its fault proxy (tests/objectstore/faultproxy.py, a process), the endpoint
only in ``storage_options``. The s3 cases (and HTTP 500s) are test_store_faults.py's;
``kpca run`` on all three stores is test_gs_az.py's.

Each command first publishes; then a new writer of the same output has the writes of its
version's ``embedding`` objects dropped (the connection closed without an answer) once a
few have gone through. Which requests those are differs per store: on azure the object
name is the request's path; gcsfs writes each small object as a multipart upload that
names it in its body (the proxy matches that name too) and copies objects with
``rewriteTo`` requests naming both objects in the path. The copies (a run or an update
starts its version as a server-side copy of the published one) are let through, then
the data writes fail. Only uploads fail (PUT, POST): the failed writer's removal of its
version (DELETEs, one per object on both emulators) goes through, as it does on s3
where it is one batch request.

After the failure: exit 1 in one error line naming the output, no traceback; every
object of the output (``work/`` and the lock aside) byte for byte as it was, and no
version folder beside the published ones; the published result verifies (``kpca info``
for an update; a transform output is read back through
:func:`pipeline.output.versions.open_output`, verified and compared); with the proxy cleared
the same command publishes.

``slow``: a few minutes each (gcsfs and the Azure SDK retry every failed write with
backoff before giving up); run with ``-m slow``.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

from tests.objectstore.test_gs_az import kpca, write_config
from tests.published import held_by, store_tree_bytes, without_holds
from tests.reliability.helpers import blobs

pytestmark = pytest.mark.distributed

N, D = 600, 6
#: matching writes of data let through before the fault: the command is under way by then
AFTER = 2
#: the writes a fault may hit (not DELETE: the failed writer's clean-up goes through)
UPLOADS = ("PUT", "POST")


class Prefix:
    """A fresh prefix of the test's bucket: URLs for commands (through the proxy), and
    the objects under it read straight from the server (unaffected by faults)."""

    def __init__(self, store, tmp: Path):
        self.store, self.tmp = store, tmp
        self.prefix = uuid.uuid4().hex[:8]
        self.fs = store.filesystem()

    def url(self, name: str) -> str:
        return self.store.url(self.prefix, name)

    def key(self, name: str) -> str:
        return self.store.path(self.prefix, name)

    def put(self, seed: int, rows: int = N) -> str:
        local = self.tmp / f"x{seed}-{rows}.npy"
        np.save(local, blobs(rows, D, seed=seed))
        self.fs.put(str(local), self.key(f"in/{local.name}"))
        return self.url(f"in/{local.name}")

    def objects(self, name: str) -> dict[str, bytes]:
        """Every object of the output ``name`` with its bytes (``work/`` and the lock
        left out)."""
        return store_tree_bytes(self.fs, self.key(name))

    def versions(self, name: str) -> list[str]:
        """The version folders present under the output ``name`` (listed, not read)."""
        base = self.key(f"{name}/versions")
        self.fs.invalidate_cache()
        return sorted({str(f)[len(base) + 1 :].split("/")[0] for f in self.fs.find(base)})

    def flags(self) -> list[str]:
        return ["--storage-options", self.store.options_json]


@pytest.fixture
def where(object_store, tmp_path) -> Prefix:
    return Prefix(object_store, tmp_path)


def drop_writes(where: Prefix, skip: int = 0) -> None:
    """Drop the uploads of the new version's ``embedding`` objects from the
    ``skip + AFTER + 1``-th on (``skip``: server-side copies of the published version's,
    made before any data is written)."""
    where.store.proxy.reset()
    where.store.proxy.fault(
        "drop", methods=UPLOADS, path_contains="embedding", after=skip + AFTER
    )


def injected(where: Prefix, name: str, published: set[str], res) -> list[dict]:
    """The requests the proxy dropped, after checking each was an upload of data (not a
    copy) into a version of ``name`` that is not a published one."""
    state = where.store.proxy.state()
    reqs = state["injected_requests"]
    assert reqs, ("no fault was injected", state, (res.stdout + res.stderr)[-3000:])
    base = f"{where.prefix}/{name}/versions/"
    for r in reqs:
        assert r["method"] in UPLOADS and not r["copy"], r
        obj = r.get("object") or unquote(r["path"])  # gcs: the name is in the body
        assert base in obj and "embedding" in obj, r
        assert obj.split(base, 1)[1].split("/")[0] not in published, r
    return reqs


def store_failure(res: subprocess.CompletedProcess, where: Prefix, name: str) -> str:
    """Exit 1 (the environment), one error line naming the output, no traceback."""
    text = res.stdout + res.stderr
    assert res.returncode == 1, (res.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, res.stderr[-3000:]
    assert where.key(name) in errors[0], errors[0]
    return errors[0]


def assert_unchanged(where: Prefix, name: str, before: dict[str, bytes]) -> None:
    """Byte for byte as before: no object added (no version left), none gone or changed."""
    after = where.objects(name)
    assert not set(after) - set(before), sorted(set(after) - set(before))
    assert not set(before) - set(after), sorted(set(before) - set(after))
    assert [k for k in before if before[k] != after[k]] == []


def copies(before: dict[str, bytes], vid: str) -> int:
    """The published version's ``embedding`` objects, which a new version of a run or an
    update starts as server-side copies of."""
    return sum(k.startswith(f"versions/{vid}/") and "embedding" in k for k in before)


def info(where: Prefix, name: str) -> dict:
    """``kpca info`` verifies the output; its manifest (``--json``)."""
    res = kpca("info", where.url(name), *where.flags())
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[complete, verified]" in res.stdout, res.stdout
    res = kpca("info", where.url(name), "--json", *where.flags())
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def publish_run(where: Prefix, name: str, seed: int) -> str:
    folder = where.tmp / f"cfg-{name}"
    folder.mkdir()
    cluster = {"n_workers": 1, "threads_per_worker": 2, "dashboard_address": None}
    cfg = write_config(folder, where.store, where.put(seed), where.url(name), cluster=cluster)
    res = kpca("run", str(cfg), "--no-progress", "--no-prefect")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    return where.url(name)


# ----------------------------------------------------------------- kpca transform
@pytest.mark.slow  # minutes: the clients retry each dropped write with backoff
@pytest.mark.parametrize("object_store", ["gs", "az"], indirect=True)
def test_transform_dropped_connections_keep_the_published_output(where, object_store):
    from pipeline.embed.transform import verify_transform_output
    from pipeline.output.versions import open_output

    model = publish_run(where, "model-run", 0)
    model_before = where.objects("model-run")
    out = where.url("emb.zarr")
    rows = 400  # a few chunks of ~100 rows at 0.005 MB

    def transform(seed: int, *extra: str) -> subprocess.CompletedProcess:
        return kpca(
            "transform", model, where.put(10 + seed, rows + seed), out, "--no-progress",
            "--chunk-mb", "0.005", *where.flags(), *extra,
        )  # fmt: skip

    def read():  # straight from the server (the proxy's certificate is the commands')
        pub = open_output(out, object_store.direct)
        verify_transform_output(pub.data, n_rows=pub.manifest["rows"], n_components=3,
                                parquet=False)  # fmt: skip
        return pub, np.asarray(pub.data.open_group("r")["embedding"][...])

    res = transform(0)
    assert res.returncode == 0, res.stderr[-3000:]
    published, emb = read()
    assert emb.shape == (rows, 3) and np.isfinite(emb).all()

    before = where.objects("emb.zarr")
    drop_writes(where)
    t0 = time.monotonic()
    res = transform(1, "--overwrite")
    took = time.monotonic() - t0
    reqs = injected(where, "emb.zarr", {published.version}, res)
    object_store.proxy.clear()
    line = store_failure(res, where, "emb.zarr")
    assert_unchanged(where, "emb.zarr", before)
    assert where.versions("emb.zarr") == sorted(h["version"] for h in published.history)
    again, emb_again = read()
    assert again.version == published.version and again.pointer == published.pointer
    np.testing.assert_array_equal(emb_again, emb)

    # the store healthy again: the same command publishes
    res = transform(1, "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    now, emb_now = read()
    assert now.version != published.version and emb_now.shape == (rows + 1, 3)
    assert now.history[1]["version"] == published.version
    assert where.objects("model-run") == model_before  # the model was only read
    print(f"{object_store.scheme} transform: {len(reqs)} dropped in {took:.0f} s; {line}")


# -------------------------------------------------------------------- kpca update
@pytest.mark.slow  # minutes: the clients retry each dropped write with backoff
@pytest.mark.parametrize("object_store", ["gs", "az"], indirect=True)
def test_update_dropped_connections_keep_the_published_update(where, object_store):
    base = publish_run(where, "base", 0)
    base_before = where.objects("base")
    out = where.url("run-v2")

    def update(seed: int, *extra: str) -> subprocess.CompletedProcess:
        return kpca(
            "update", base, where.put(20 + seed, 100 + seed), "--output", out, "--policy",
            "merge", "--no-prefect", "--no-progress", *where.flags(), *extra,
        )  # fmt: skip

    res = update(0)
    assert res.returncode == 0, res.stderr[-3000:]
    published = info(where, "run-v2")

    before = where.objects("run-v2")
    drop_writes(where, skip=copies(before, published["version"]))
    t0 = time.monotonic()
    res = update(1, "--overwrite")
    took = time.monotonic() - t0
    reqs = injected(where, "run-v2", {published["version"]}, res)
    object_store.proxy.clear()
    line = store_failure(res, where, "run-v2")
    assert_unchanged(where, "run-v2", before)
    assert where.versions("run-v2") == sorted(
        [published["version"], *(h["version"] for h in published["history"])]
    )
    assert info(where, "run-v2") == published

    # the store healthy again: the same command publishes
    res = update(1, "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    now = info(where, "run-v2")
    assert now["version"] != published["version"]
    assert now["history"][0]["version"] == published["version"]
    assert now["update"]["batch_rows"] == 101
    # the base run was only read, but for the hold run-v2 keeps on what it reads there
    # (the base's published version: docs/update.md, "Holds")
    base_now = where.objects("base")
    assert without_holds(base_now, [out]) == base_before
    assert held_by(base_now, out)["versions"] == [info(where, "base")["version"]]
    print(f"{object_store.scheme} update: {len(reqs)} dropped writes in {took:.0f} s; {line}")


@pytest.mark.parametrize("object_store", ["s3", "gs", "az"], indirect=True)
def test_a_lock_and_a_pointer_written_after_their_folder_was_listed_are_read(object_store):
    """A writer lists its output (checking it), then takes the lock and re-reads it; a
    reader re-reads a pointer another process replaced. adlfs answers ``open`` from the
    cached listing of the folder: without dropping that listing too, the lock just
    written read as missing ("locked by an unknown holder") on an existing output."""
    from dataclasses import asdict

    from pipeline.output.lock import LOCK_NAME, LockHolder, create_object, read_lock
    from pipeline.output.store import Location
    from pipeline.output.versions import read_pointer

    out = Location.at(object_store.url(uuid.uuid4().hex[:8], "out"), object_store.direct)
    out.fs.pipe_file(out.child("manifest.json").fs_path, b'{"version": "a"}')
    out.fs.ls(out.fs_path)  # the folder's listing, now cached by this process
    holder = LockHolder.me()
    assert create_object(out.child(LOCK_NAME), json.dumps(asdict(holder)).encode())
    now = read_lock(out)
    assert now is not None and now.token == holder.token
    # the pointer replaced by another process (another filesystem instance), longer
    other = object_store.filesystem()
    other.pipe_file(out.child("manifest.json").fs_path, b'{"version": "b", "history": []}')
    assert read_pointer(out) == {"version": "b", "history": []}
