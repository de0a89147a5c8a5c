"""Every read of a published run and of its lineage is verified (pipeline/output/verify.py,
pipeline/output/lineage.py): a deleted, truncated or altered chunk, or an edited attribute, in
the embedding, spectrum, labels, ids, split or model of a run, or in the training rows
of its lineage (the base's ``work/ingest.zarr``), is refused in one line naming it by
``kpca info``, ``kpca transform`` and ``kpca update`` (exit 2), never read as zeros.

Real components: a run published by the pipeline on a real Dask LocalCluster, real zarr
stores in tmp folders, the ``kpca`` command in subprocesses (the exit status matters)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from pipeline.config import load_config
from pipeline.output.export import verify_run
from pipeline.output.store import Location
from pipeline.output.verify import (
    absent_chunks,
    attrs_digest,
    check_present,
    checked_array,
    describe_store_failure,
)
from pipeline.runner.run import run_pipeline

from ..reliability.helpers import blobs, kpca

N, D = 300, 5


def _table(n: int, seed: int) -> pd.DataFrame:
    df = pd.DataFrame(blobs(n, D, seed=seed), columns=[f"f{i}" for i in range(D)])
    df.insert(0, "row_id", seed * 100_000 + np.arange(n))
    df["label"] = np.array(["a", "b", "c"])[np.arange(n) % 3]
    return df


def _config(folder: Path, data: Path, out: Path, address: str) -> dict:
    return {
        "input": {"path": str(data), "id_column": "row_id", "label_column": "label"},
        "kernel": {"name": "rbf", "gamma": 0.05},
        "solver": {
            "n_components": 3,
            "eigen_solver": "randomized",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01, "block_rows": 100},
        "kernel_store": {"materialize": "never"},
        "output": {"path": str(out), "parquet": False},
        "evaluate": {"enabled": True},
        "cluster": {"address": address},
    }


@pytest.fixture(scope="module")
def published(tmp_path_factory, dask_cluster):
    """A complete run with labels, ids and a split (300 x 5, 2 embedding chunks), and a
    batch of 40 new rows with the same columns."""
    from distributed import Client

    folder = tmp_path_factory.mktemp("verified")
    _table(N, 0).to_parquet(folder / "x.parquet")
    _table(40, 1).to_parquet(folder / "new.parquet")
    address = dask_cluster.scheduler_address
    with Client(dask_cluster):
        run_pipeline(
            load_config(_config(folder, folder / "x.parquet", folder / "run", address))
        )
    m = verify_run(folder / "run")
    assert {"embedding", "labels", "ids", "split"} <= set(m["checksums"])
    assert m["integrity"]["version"] == 1
    return folder


def _copy(published: Path, tmp_path: Path, name: str = "run") -> Path:
    run = tmp_path / name
    shutil.copytree(published / "run", run, symlinks=True)
    return run


def _version(run: Path) -> Path:
    """The folder of the version the run's pointer publishes (where its arrays are)."""
    pointer = json.loads((run / "manifest.json").read_text())
    return run / pointer["version_path"]


def _edit_attrs(node: Path, edit) -> None:
    meta = node / "zarr.json"
    doc = json.loads(meta.read_text())
    edit(doc["attributes"])
    meta.write_text(json.dumps(doc, indent=2))


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _alter_value(run: Path) -> None:
    """One value of the embedding's second chunk changed through zarr: a valid chunk,
    another value."""
    z = zarr.open_group(str(run), mode="r+")["embedding"]
    z[260, 0] = z[260, 0] + 1.0


#: (damage, the object the line must name, the words saying what is wrong)
DAMAGE = {
    "embedding chunk deleted": (
        lambda r: (r / "embedding" / "c" / "1" / "0").unlink(),
        "embedding/c/1/0",
        "is missing",
    ),
    "embedding chunk truncated": (
        lambda r: _truncate(r / "embedding" / "c" / "0" / "0"),
        "embedding/c/0/0",
        "cannot be decoded",
    ),
    "embedding chunk altered": (_alter_value, "'embedding'", "checksum mismatch"),
    "embedding columns edited": (
        lambda r: _edit_attrs(r / "embedding", lambda a: a["columns"].reverse()),
        "'embedding'",
        "attributes",
    ),
    "labels classes edited": (
        lambda r: _edit_attrs(r / "labels", lambda a: a["classes"].reverse()),
        "'labels'",
        "attributes",
    ),
    "labels chunk garbage": (
        lambda r: (r / "labels" / "c" / "1").write_bytes(b"\x00garbage" * 5),
        "labels/c/1",
        "cannot be decoded",
    ),
    "ids chunk deleted": (lambda r: (r / "ids" / "c" / "0").unlink(), "ids/c/0", "is missing"),
    "split chunk deleted": (
        lambda r: (r / "split" / "c" / "1").unlink(),
        "split/c/1",
        "is missing",
    ),
    "spectrum chunk truncated": (
        lambda r: _truncate(r / "spectrum" / "eigenvalues" / "c" / "0"),
        "spectrum/eigenvalues/c/0",
        "cannot be decoded",
    ),
    "model array attribute added": (
        lambda r: _edit_attrs(r / "model" / "eigenvalues", lambda a: a.update(note="x")),
        "'model/eigenvalues'",
        "attributes",
    ),
    "model chunk deleted": (
        lambda r: (r / "model" / "X_fit" / "c" / "0" / "0").unlink(),
        "model/X_fit/c/0/0",
        "is missing",
    ),
    "model chunk truncated": (
        lambda r: _truncate(r / "model" / "eigenvectors" / "c" / "0" / "0"),
        "model/eigenvectors/c/0/0",
        "cannot be decoded",
    ),
}


def _one_line(res, command: str) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith(f"kpca {command}: error")]
    assert len(lines) == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return lines[0]


def _refused(res, command: str, obj: str, what: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    line = _one_line(res, command)
    assert obj in line and what in line, line


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_info_refuses_damage_anywhere_in_a_published_run(published, tmp_path, damage):
    run = _copy(published, tmp_path)
    assert kpca("info", run).returncode == 0
    apply, obj, what = DAMAGE[damage]
    apply(_version(run))
    _refused(kpca("info", run), "info", obj, what)


@pytest.mark.parametrize(
    "damage",
    [
        "model chunk truncated",
        # moved out of the default run (its 20-minute budget, 2026-11-28): ~10 s each
        pytest.param("embedding chunk deleted", marks=pytest.mark.slow),
        pytest.param("labels classes edited", marks=pytest.mark.slow),
    ],
)
def test_transform_and_update_refuse_a_damaged_run(published, tmp_path, damage):
    run = _copy(published, tmp_path)
    apply, obj, what = DAMAGE[damage]
    apply(_version(run))
    new = published / "new.parquet"
    res = kpca("transform", run, new, tmp_path / "t", "--id-column", "row_id")
    _refused(res, "transform", obj, what)
    assert not (tmp_path / "t").exists()
    res = kpca("update", run, new, "--output", tmp_path / "u", "--no-prefect")
    _refused(res, "update", obj, what)
    assert not (tmp_path / "u" / "manifest.json").exists()


def test_a_manifest_without_the_integrity_record_still_verifies(published, tmp_path):
    """Runs published before the record: verified on values as before (no attribute
    digests), not refused."""
    run = _copy(published, tmp_path)
    for manifest in (run / "manifest.json", _version(run) / "manifest.json"):
        m = json.loads(manifest.read_text())
        del m["integrity"]
        manifest.write_text(json.dumps(m))
    assert kpca("info", run).returncode == 0
    _alter_value(_version(run))  # values are still covered
    _refused(kpca("info", run), "info", "'embedding'", "checksum mismatch")


# ------------------------------------------------------------------ the lineage
def _ingest_chunk(run: Path, key: str = "1/0") -> Path:
    return run / "work" / "ingest.zarr" / "X" / "c" / Path(key)


@pytest.mark.slow  # ~1 min: a chain of updates, damaged step by step
def test_lineage_reads_are_verified(published, tmp_path, dask_cluster):
    """Base -> v2 (refit), then the base's training rows damaged: the next refit from v2
    (which reads them through the lineage) is refused in one line naming the chunk, never
    refitted on zeros or other values; restored, it succeeds."""
    from distributed import Client

    base = tmp_path / "base"  # its own run: a copy's manifest names the original's stores
    address = dask_cluster.scheduler_address
    with Client(dask_cluster):
        run_pipeline(load_config(_config(tmp_path, published / "x.parquet", base, address)))
    new = published / "new.parquet"
    v2 = tmp_path / "v2"
    res = kpca("update", base, new, "--output", v2, "--policy", "refit", "--no-prefect")
    assert res.returncode == 0, res.stderr[-3000:]
    m = verify_run(v2)
    rows = m["update"]["rows"]
    assert [r["n_rows"] for r in rows] == [N, 40]
    first = json.loads((base / "manifest.json").read_text())
    assert rows[0]["fingerprint"] == first["input"]["fingerprint"]
    # the training mask of the base's rows: read from v2's own split (issue 36)
    assert rows[0]["split_run"] == str(_version(v2)) and rows[0]["split_checksum"]
    assert rows[0]["split_rows"] == [0, N]
    assert rows[1]["fingerprint"] == m["input"]["fingerprint"]
    assert all(r["storage_options"] == {} and r["digests_sha256"] for r in rows)

    chunk = _ingest_chunk(base)
    good = chunk.read_bytes()
    # v3 merges another batch: `new` is in v2 already, and a batch already merged is a
    # no-op night answered before the lineage is read (exactly once, issue 37)
    _table(40, 2).to_parquet(tmp_path / "new2.parquet")

    def update_v3():
        return kpca(
            "update", v2, tmp_path / "new2.parquet", "--output", tmp_path / "v3",
            "--policy", "refit", "--no-prefect",
        )  # fmt: skip

    chunk.unlink()  # deleted: never zeros
    _refused(update_v3(), "update", "ingest.zarr/X/c/1/0", "is missing")
    chunk.write_bytes(good[: len(good) // 3])  # truncated
    _refused(update_v3(), "update", "ingest.zarr/X/c/1/0", "cannot be decoded")
    chunk.write_bytes(good)
    g = zarr.open_group(str(base / "work" / "ingest.zarr"), mode="r+")
    g["X"][260, 2] = g["X"][260, 2] + 1.0  # a valid chunk with another value
    _refused(update_v3(), "update", "ingest.zarr/X/c/1/0", "differs from the digest")
    # also straight from the base (the first entry is built from its manifest)
    res = kpca("update", base, new, "--output", tmp_path / "w", "--policy", "refit")
    _refused(res, "update", "ingest.zarr/X/c/1/0", "differs from the digest")
    chunk.write_bytes(good)
    assert not (tmp_path / "v3" / "manifest.json").exists()

    # the base re-run on other data with the same number of rows: its ingest store now
    # has another fingerprint, but v2 holds the rows its lineage needs, so the rebuild kept
    # them (work/ingest/<fingerprint>.zarr, issue 36): the refit reads them there
    _table(N, 7).to_parquet(tmp_path / "other.parquet")
    cfg = _config(tmp_path, tmp_path / "other.parquet", base, address)
    cfg["output"]["overwrite"] = True
    with Client(dask_cluster):
        run_pipeline(load_config(cfg))
    res = update_v3()
    assert res.returncode == 0, res.stderr[-3000:]
    first3 = verify_run(tmp_path / "v3")["update"]["rows"][0]
    assert first3["fingerprint"] == rows[0]["fingerprint"]
    assert first3["store"].startswith(str(base / "work" / "ingest") + "/")


# ------------------------------------------------------------------ the helpers
def test_checked_reads_name_the_chunk_and_allow_recorded_absences(tmp_path):
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(40, 2), chunks=(10, 2), dtype="f8")
    z[...] = 0.0
    z[10:20] = 1.0  # zarr writes only this chunk: the others equal the fill value
    assert absent_chunks(z) == ["c/0/0", "c/2/0", "c/3/0"]
    check_present(z, allowed=absent_chunks(z))
    np.testing.assert_array_equal(checked_array(z).compute(), z[...])
    (tmp_path / "a.zarr" / "c" / "1" / "0").unlink()
    from pipeline.errors import CorruptObjectError

    with pytest.raises(CorruptObjectError, match=r"a\.zarr/c/1/0 \(rows 10-19\) is missing"):
        check_present(z, allowed=["c/0/0", "c/2/0", "c/3/0"])
    before = attrs_digest(z)
    z.attrs["columns"] = ["x", "y"]
    assert attrs_digest(zarr.open_array(str(tmp_path / "a.zarr"))) != before


@pytest.mark.parametrize("chunks", [(40, 2), (10, 2)])
def test_checked_chunks_keep_their_keys_in_every_optimised_graph(tmp_path, chunks):
    """Every graph that reads the checked array (all of it, its first row, a reduction)
    defines each chunk under its own key, never under a fused and renamed one: with the
    store as a key of its own, dask fused it into a one-chunk array's read and renamed
    it ("checked-zarr-checked-..."), so graphs submitted to one cluster at once defined
    the same chunk differently; in CI a run then lost a worker and died with a KeyError
    for the renamed key."""
    import dask

    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(40, 2), chunks=chunks, dtype="f8")
    z[...] = np.arange(80.0).reshape(40, 2)
    x = checked_array(z)
    own = {(x.name, i, 0) for i in range(x.numblocks[0])}
    (whole,) = dask.optimize(x)
    assert set(dict(whole.__dask_graph__())) == own
    for part in (x[:1], x.sum(axis=0), x.map_blocks(np.negative)):
        (opt,) = dask.optimize(part)
        renamed = [
            k
            for k in dict(opt.__dask_graph__())
            if isinstance(k, tuple) and x.name in k[0] and k[0] != x.name
        ]
        assert not renamed, renamed
    np.testing.assert_array_equal(x.compute(), z[...])


def test_store_failures_are_described_with_the_object(tmp_path):
    loc = Location(str(tmp_path / "ro" / "x.json"))
    err = PermissionError(13, "Permission denied", str(loc))
    line = describe_store_failure(err, str(tmp_path))
    assert line.startswith(f"cannot use {loc}: permission denied"), line
    # a comms OSError of the cluster (no storage frame, no file): not a store failure
    assert describe_store_failure(ConnectionResetError("peer"), "") is None
    assert describe_store_failure(FileNotFoundError(2, "No such file", "x"), "") is None
    # an SDK's error (not an OSError) is recognised by its class's module
    from botocore.exceptions import EndpointConnectionError

    line = describe_store_failure(
        EndpointConnectionError(endpoint_url="http://h:1"), "s3://b/r"
    )
    assert line.startswith("cannot use s3://b/r: the store failed"), line
    assert "endpoint goes in storage_options" in line
