"""A series whose base is re-run (issue 36, "Series broken by their base").

A base run (``v1``, ``keep_versions: 1``, a labelled table: its ``split`` marks the training
rows), two updates (``v2``, ``v3``), then the base re-run -- on the same rows (another
solver seed: a new version is published, the old one goes by retention) and on new rows
(the input file rewritten: ``work/ingest.zarr`` is rebuilt) -- and a fourth update that
refits on every row of the lineage. The refit must read the rows the series was built
from: its eigenvalues are checked against a Nyström fit of those rows computed here with
the model's landmarks, its embedding against the model's transform of those rows.

Real components: the pipeline on the session's Dask cluster, zarr stores in tmp folders.
"""

from __future__ import annotations

import json
from pathlib import Path

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr

import kpca_dask
from kpca_dask.kernels import make_kernel
from kpca_dask.solvers.nystroem import nystroem_basis, nystroem_eigh
from pipeline.config import load_config
from pipeline.output.export import verify_run
from pipeline.runner.run import run_pipeline
from pipeline.update.run import run_update, update_config
from tests.published import version_dir

K = 3
FEATURES = ["f0", "f1", "f2", "f3"]


def _draw(n, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    c = np.array([[0, 0, 0, 0], [3, 0, 1, 0], [0, 3, 0, 1]], dtype=float)
    lab = rng.integers(0, 3, n)
    return c[lab] + shift + rng.normal(scale=0.7, size=(n, 4)), lab


def _table(path: Path, X, lab, first_id: int) -> None:
    df = pd.DataFrame(X, columns=FEATURES)
    df["label"] = [f"c{v}" for v in lab]
    df["id"] = np.arange(first_id, first_id + len(X), dtype=np.int64)
    df.to_parquet(path)


def base_config(folder: Path, out: Path, seed: int = 0, address: str = "") -> dict:
    return {
        "input": {
            "path": str(folder / "x.parquet"),
            "label_column": "label",
            "id_column": "id",
        },
        "preprocess": {"scale": "none"},  # compared with fits on the raw rows
        "kernel": {"name": "rbf", "gamma": 0.2},
        "solver": {
            "n_components": K,
            "eigen_solver": "nystroem",
            "n_landmarks": 40,
            "landmark_method": "uniform",
            "dtype": "float64",
            "random_state": seed,
        },
        "chunks": {"target_chunk_mb": 0.01},
        "output": {"path": str(out), "parquet": False, "keep_versions": 1},
        # a split (the training rows), without the report's plots and sweeps
        "evaluate": {
            "enabled": True,
            "test_fraction": 0.25,
            "report": False,
            "sweep_components": None,
        },
        # the tests' cluster (the updates inherit the base run's cluster section)
        "cluster": {"address": address} if address else {"n_workers": 1},
    }


def _reference(model, X):
    """A Nyström fit of the rows ``X`` with the model's landmarks, kernel and shift."""
    kern = make_kernel("rbf", gamma=model.gamma_)
    basis = nystroem_basis(model.landmarks_, kern, np.float64, shift=model.statistics_.shift)
    return nystroem_eigh(da.from_array(X, chunks=(97, -1)), basis, K, method="covariance")


def build_series(folder: Path, rerun: str, address: str = "") -> dict:
    """v1, v2, v3, the base re-run (``same`` rows, or ``new`` rows), v4 (a refit)."""
    X0, l0 = _draw(500, 0)
    _table(folder / "x.parquet", X0, l0, 0)
    batches = {}
    for i, seed in ((1, 1), (2, 2), (3, 3)):
        batches[i] = _draw(80, seed)
        _table(folder / f"b{i}.parquet", *batches[i], 10_000 * i)
    series = folder / "series"
    v1 = series / "v1"
    run_pipeline(load_config(base_config(folder, v1, address=address)))
    first_version = version_dir(v1).name
    split0 = zarr.open_group(str(version_dir(v1)), mode="r")["split"][...].astype(bool)
    assert 0 < split0.sum() < len(split0)  # the base's split marks its training rows
    run_update(update_config(str(v1), str(folder / "b1.parquet"), str(series / "v2")))
    run_update(update_config(str(series), str(folder / "b2.parquet")))  # -> v3
    assert (series / "v3" / "manifest.json").exists()

    if rerun == "new":  # the nightly base job: the same input path, new rows
        Xn, ln = _draw(500, 7, shift=1.5)
        _table(folder / "x.parquet", Xn, ln, 0)
        cfg = base_config(folder, v1, address=address)
    else:  # the same rows, another fit: a new version, the old one removed by retention
        cfg = base_config(folder, v1, seed=5, address=address)
    cfg["output"]["overwrite"] = True
    run_pipeline(load_config(cfg))
    assert version_dir(v1).name != first_version
    run_update(update_config(str(series), str(folder / "b3.parquet"), policy="refit"))
    train = np.vstack([X0[split0]] + [batches[i][0] for i in (1, 2, 3)])
    every = np.vstack([X0] + [batches[i][0] for i in (1, 2, 3)])
    return {
        "series": series,
        "first_version": first_version,
        "train": train,
        "every": every,
    }


@pytest.fixture(scope="module", params=["same", "new"])
def rerun_series(request, tmp_path_factory, dask_cluster):
    from distributed import Client

    folder = tmp_path_factory.mktemp(f"series-{request.param}")
    with Client(dask_cluster):
        return build_series(folder, request.param, dask_cluster.scheduler_address)


@pytest.mark.slow  # the series: 5 runs, ~60-120 s on the shared machine
def test_update_after_the_base_is_rerun_reads_the_original_rows(rerun_series):
    """The fourth update succeeds and refits on the rows the series was built from, not
    the base's new ones."""
    series = rerun_series["series"]
    m = verify_run(series / "v4")
    assert m["update"]["action"] == "refit" and m["update"]["n_rows"] == 740
    model = kpca_dask.load(version_dir(series / "v4") / "model")
    train = rerun_series["train"]
    assert model.n_samples_fit_ == len(train)
    ref = _reference(model, train)
    assert np.max(np.abs(model.eigenvalues_ - ref.eigenvalues) / ref.eigenvalues) < 1e-10
    # every landmark is one of the series' training rows
    rows = {r.tobytes() for r in np.ascontiguousarray(train)}
    assert all(r.tobytes() in rows for r in np.ascontiguousarray(model.landmarks_))
    # the embedding of every row: the original rows, embedded by the refitted model
    emb = zarr.open_group(str(version_dir(series / "v4")), mode="r")["embedding"][...]
    np.testing.assert_allclose(emb, model.transform(rerun_series["every"]), rtol=0, atol=1e-9)


@pytest.mark.slow
def test_the_lineage_reads_no_earlier_version_and_holds_what_it_needs(rerun_series):
    """v4's lineage reads the training mask from v4's own version (never an earlier
    night's, which retention may remove), and v4 holds in v1, v2 and v3 the versions and
    rows (fingerprints) its lineage names: one hold file per holder, ours."""
    series = rerun_series["series"]
    m = verify_run(series / "v4")
    rows = m["update"]["rows"]
    own = str(version_dir(series / "v4"))
    assert rows[0]["split_run"] == own and rows[0]["split_rows"] == [0, 500]
    assert all(r["split_run"] in (None, own) for r in rows)
    v4 = str(series / "v4")
    for name in ("v1", "v2", "v3"):
        holds = [
            json.loads(p.read_text()) for p in sorted((series / name / "holds").glob("*.json"))
        ]
        mine = [h for h in holds if h["holder"] == v4]
        assert len(mine) == 1, holds
        h = mine[0]
        assert h["written_by"] == "kpca-dask" and h["kind"] == "hold" and h["updated"]
        entry = next(r for r in rows if r["store"].startswith(str(series / name) + "/"))
        assert h["versions"] and all((series / name / "versions" / v).is_dir() for v in
                                     h["versions"] if name != "v1")  # fmt: skip
        assert entry["fingerprint"] in {r["fingerprint"] for r in h["rows"]}
    # the holds of v4 are recorded, to be released at its next publish
    assert {h["url"] for h in m["update"]["holds"]} == {
        str(series / n) for n in ("v1", "v2", "v3")
    }


@pytest.mark.slow
def test_rows_of_a_base_rerun_on_new_data_are_kept_while_held(rerun_series):
    """After the base is re-run on new rows, its held original rows are at
    ``work/ingest/<fingerprint>.zarr`` (hard links: no byte copied) and v4's lineage names
    that location."""
    series = rerun_series["series"]
    rows = verify_run(series / "v4")["update"]["rows"]
    first = rows[0]
    kept = list((series / "v1" / "work" / "ingest").glob("*.zarr"))
    if verify_run(series / "v1")["input"]["fingerprint"] == first["fingerprint"]:
        # the same rows: the store was reused, nothing kept aside
        assert kept == [] and first["store"].endswith("/v1/work/ingest.zarr")
        return
    assert len(kept) == 1 and first["store"] == str(kept[0])
    X = zarr.open_group(str(kept[0]), mode="r")["X"]
    assert X.shape == (500, 4)
    # the kept copy shares the original's blocks on disk (hard links)
    now = series / "v1" / "work" / "ingest.zarr" / "X"
    assert now.exists()
    some = next(p for p in (kept[0] / "X").rglob("*") if p.is_file() and p.name != "zarr.json")
    assert some.stat().st_nlink >= 1


@pytest.mark.slow
def test_retention_keeps_the_versions_a_series_holds(rerun_series):
    """The base's first version, which the series' lineage names (``run``) and holds,
    outlives the base's re-run although ``keep_versions`` is 1: retention
    (pipeline/output/versions.py) obeys the holds (``held_versions``)."""
    series = rerun_series["series"]
    first = rerun_series["first_version"]
    held = {
        v
        for p in (series / "v1" / "holds").glob("*.json")
        for v in json.loads(p.read_text())["versions"]
    }
    assert first in held
    assert (series / "v1" / "versions" / first / "manifest.json").is_file()


# ------------------------------------------------ the rows' location, fast (any store)
def held_rows_scenario(folder: Path, root: str, options: dict | None) -> dict:
    """An output ``root`` whose ingest store is rebuilt three times: with other rows while
    a hold names the first rows (kept), then after the hold is released (the kept copy
    removed). Returns what the checks need; shared by the local and S3 tests."""
    from pipeline.config import ChunkConfig, InputConfig
    from pipeline.data.ingest import ingest
    from pipeline.output.lineage import (
        entry_record,
        entry_rows,
        hold_file,
        lineage_needs,
        read_holds,
        rows_location,
        write_holds,
    )
    from pipeline.output.ownership import mark_folder
    from pipeline.output.store import Location

    out = Location.at(root, options)
    mark_folder(out, "run")  # an output of ours (its kept copies are ours to remove)
    store = out.child("work", "ingest.zarr")
    chunks = ChunkConfig(target_chunk_mb=0.002)
    X1, X2, X3 = (_draw(120, s)[0] for s in (11, 12, 13))
    np.save(folder / "x.npy", X1)
    inp = InputConfig(path=str(folder / "x.npy"))
    first = ingest(inp, chunks, store, min_classes=1)
    entry = entry_record(
        store, n_rows=120, fingerprint=first.fingerprint, run=f"{out.url}/versions/V1"
    )
    holder = Location.at(str(folder / "series" / "v2"))
    write_holds(holder, lineage_needs([entry]))
    inodes = _inodes(store)
    np.save(folder / "x.npy", X2)  # the base's input rewritten: the store is rebuilt
    second = ingest(inp, chunks, store, min_classes=1)
    kept = rows_location(entry)
    kept_inodes = _inodes(kept)
    read_back = np.asarray(entry_rows(entry).compute())
    # released (the holder's next publish needs nothing here), then rebuilt again
    write_holds(holder, {}, ({"url": out.url, "storage_options": out.storage_options},))
    released = [h for h in read_holds(out) if h["holder"] == holder.url]
    np.save(folder / "x.npy", X3)
    ingest(inp, chunks, store, min_classes=1)
    return {
        "out": out,
        "first": first,
        "second": second,
        "kept": kept,
        "read_back": read_back,
        "X1": X1,
        "hold": hold_file(out, holder.url),
        "released": released,
        "kept_after_release": kept.exists(),
        "inodes": (inodes, kept_inodes),
    }


def _inodes(loc) -> dict[str, int]:
    """The inode of each chunk file of ``X`` (local stores; empty on object stores)."""
    if not loc.is_local:
        return {}
    x = Path(loc.url) / "X"
    return {
        str(p.relative_to(x)): p.stat().st_ino
        for p in x.rglob("*")
        if p.is_file() and p.name != "zarr.json"
    }


def check_held_rows(r: dict) -> None:
    assert r["first"].fingerprint != r["second"].fingerprint
    # the lineage reads the first rows from their kept copy, whose name is their fingerprint
    assert r["kept"].url.endswith(".zarr") and "/work/ingest/" in r["kept"].url
    assert r["kept"].url.rpartition("/")[2].startswith("blake2b-")
    np.testing.assert_array_equal(r["read_back"], r["X1"])
    # the hold: one file of ours named from the holder, then released (empty)
    assert r["released"] and r["released"][0]["versions"] == []
    assert r["released"][0]["rows"] == [] and r["released"][0]["kind"] == "hold"
    assert r["hold"].url.endswith(".json") and "/holds/" in r["hold"].url
    # no hold names them any more: the next rebuild removed the kept copy
    assert not r["kept_after_release"]


def test_rows_a_hold_names_outlive_a_rebuild_of_the_ingest_store(tmp_path, dask_client):
    r = held_rows_scenario(tmp_path, str(tmp_path / "series" / "v1"), None)
    check_held_rows(r)
    # on local disk the kept copy is hard links to the original's chunk files: no byte
    # of X copied
    before, kept = r["inodes"]
    assert before and kept == before
