"""A series is one output (issue 37): each night's batch is a new version of it.

A base run, then nights through pipeline.series.night.run_night (what ``kpca update``
runs): in-place versions readable at one address (open_run, a plain pyarrow reader of the
pointer), each batch merged once (identity in the lineage), ids unique, dated inputs and
catch-up, retention of the series' versions with the rows its lineage needs kept.

Real components: the pipeline on the session's Dask cluster, files in tmp folders.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import kpca_dask
from pipeline.config import load_config
from pipeline.output.export import open_run
from pipeline.runner.run import run_pipeline
from pipeline.series.night import run_night
from pipeline.update.run import run_update, update_config

FEATURES = ["f0", "f1", "f2", "f3"]


def _table(path: Path, n: int, seed: int, first_id: int) -> None:
    rng = np.random.default_rng(seed)
    c = np.array([[0, 0, 0, 0], [3, 0, 1, 0], [0, 3, 0, 1]], dtype=float)
    lab = rng.integers(0, 3, n)
    df = pd.DataFrame(c[lab] + rng.normal(scale=0.7, size=(n, 4)), columns=FEATURES)
    df["label"] = [f"c{v}" for v in lab]
    df["id"] = np.arange(first_id, first_id + n, dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path)


def _config(folder: Path, out: Path, keep: int = 7) -> dict:
    return {
        "input": {
            "path": str(folder / "x.parquet"),
            "label_column": "label",
            "id_column": "id",
        },
        "preprocess": {"scale": "none"},
        "kernel": {"name": "rbf", "gamma": 0.2},
        "solver": {
            "n_components": 3,
            "eigen_solver": "nystroem",
            "n_landmarks": 40,
            "landmark_method": "uniform",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01},
        "output": {
            "path": str(out),
            "parquet": True,
            "keep_versions": keep,
            "retention_grace_hours": 0,
        },
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1},
    }


def _night(series: Path, new_data: str, **kw):
    return run_night(
        str(series),
        new_data,
        lambda base, batch, out: update_config(base, batch, out),
        run_update,
        **kw,
    )


def plain_read(series: Path) -> pd.DataFrame:
    """The documented reader: the pointer -> the version folder -> embedding.parquet, with
    pyarrow only, in a process that cannot import kpca_dask or pipeline."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["kpca_dask"] = None; sys.modules["pipeline"] = None
        import json, pyarrow.parquet as pq
        root = {str(series)!r}
        pointer = json.load(open(root + "/manifest.json"))
        t = pq.read_table(root + "/" + pointer["version_path"] + "/embedding.parquet")
        t.to_pandas().to_json(sys.stdout.buffer if False else "/dev/stdout", orient="split")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    return pd.read_json(__import__("io").StringIO(out.stdout), orient="split")


@pytest.fixture
def series(tmp_path, dask_client):
    folder = tmp_path
    _table(folder / "x.parquet", 600, 0, 0)
    out = folder / "features"
    run_pipeline(load_config(_config(folder, out, keep=2)))
    return folder, out


def test_a_night_is_a_new_version_of_the_same_output(series):
    folder, out = series
    _table(folder / "in" / "b1.parquet", 150, 1, 10_000)
    first = json.loads((out / "manifest.json").read_text())["version"]
    night = _night(out, str(folder / "in" / "b1.parquet"))
    assert night.ok and len(night.merged) == 1
    pointer = json.loads((out / "manifest.json").read_text())
    assert pointer["version"] == night.merged[0][1] != first
    assert pointer["update"]["base"] == str(out / "versions" / first)
    assert [h["version"] for h in pointer["history"]] == [first]
    # one address: open_run, the plain reader, the model
    run = open_run(out)
    assert run.manifest["update"]["n_rows"] == 750
    df = plain_read(out)
    assert len(df) == 750 and df["id"].is_unique
    kpca_dask.load(run.model.zarr_source())
    # the batch's identity is in the lineage
    src = pointer["update"]["rows"][-1]["source"]
    assert src["path"] == str(folder / "in" / "b1.parquet") and src["sha256"].startswith(
        "sha256:"
    )
    assert src["size"] == (folder / "in" / "b1.parquet").stat().st_size


def test_a_batch_merged_once_and_ids_kept_unique(series):
    folder, out = series
    b1 = folder / "in" / "b1.parquet"
    _table(b1, 150, 1, 10_000)
    n1 = _night(out, str(b1))
    v1 = n1.merged[0][1]
    # the same batch again (same name, or the same bytes under another name): a no-op
    (folder / "in" / "copy.parquet").write_bytes(b1.read_bytes())
    before = (out / "manifest.json").read_bytes()
    for spec in (str(b1), str(folder / "in" / "copy.parquet")):
        again = _night(out, spec)
        assert again.ok and not again.merged and again.skipped == [(spec, v1)]
    assert (out / "manifest.json").read_bytes() == before
    # a batch carrying ids the series has: refused in one line naming some, nothing published
    _table(folder / "dup" / "b2.parquet", 100, 2, 10_100)
    bad = _night(out, str(folder / "dup" / "b2.parquet"))
    assert not bad.merged and len(bad.refused) == 1
    assert "already in the series" in bad.refused[0][1] and "10100" in bad.refused[0][1]
    assert (out / "manifest.json").read_bytes() == before
    assert [p.name for p in (out / "versions").iterdir()].count(v1) == 1
    assert len(list((out / "versions").iterdir())) == 2  # the refused night's is gone


def test_dated_batches_catch_up_in_order_and_retention_keeps_the_rows(series):
    folder, out = series
    tpl = str(folder / "batches" / "{date:%Y-%m-%d}" / "*.parquet")
    days = [datetime.datetime(2026, 11, d, 2, 30, tzinfo=datetime.UTC) for d in (24, 25, 26)]
    _table(folder / "batches" / "2026-11-24" / "a.parquet", 100, 3, 20_000)
    _table(folder / "batches" / "2026-11-25" / "a.parquet", 100, 4, 20_100)
    _table(folder / "batches" / "2026-11-25" / "b.parquet", 100, 5, 20_200)
    # the night of the 24th has its batch; the 25th's two batches merge in name order
    assert [p for p, _ in _night(out, tpl, logical_date=days[0]).merged] == [
        str(folder / "batches" / "2026-11-24" / "a.parquet")
    ]
    n25 = _night(out, tpl, logical_date=days[1])
    assert [Path(p).name for p, _ in n25.merged] == ["a.parquet", "b.parquet"]
    # the 26th: nothing landed yet -- a night with no batch
    empty = _night(out, tpl, logical_date=days[2])
    assert empty.ok and not (empty.merged or empty.skipped or empty.refused)
    # an outage: a glob over every day merges nothing twice
    allb = _night(out, str(folder / "batches" / "*" / "*.parquet"))
    assert not allb.merged and len(allb.skipped) == 3
    m = open_run(out).manifest
    ids = plain_read(out)["id"]
    assert len(ids) == 900 and ids.is_unique
    srcs = [e.get("source", {}).get("path") for e in m["update"]["rows"]][1:]
    assert [Path(s).parent.name + "/" + Path(s).name for s in srcs] == [
        "2026-11-24/a.parquet",
        "2026-11-25/a.parquet",
        "2026-11-25/b.parquet",
    ]
    # retention: keep_versions 2, grace 0 -> two version folders; every night's rows kept
    assert len(list((out / "versions").iterdir())) == 2
    kept = sorted(p.name for p in (out / "work" / "ingest").iterdir())
    assert len(kept) == 3  # the first run's rows and two nights'; the last is ingest.zarr
    # a refit reads every row of the lineage: all still there and verified
    _table(folder / "late.parquet", 80, 6, 30_000)
    cfg = update_config(str(out), str(folder / "late.parquet"), policy="refit")
    run_update(cfg)
    assert open_run(out).manifest["update"]["n_rows"] == 980


def test_killed_night_folder_is_never_served_and_cleaned(series):
    """A night killed mid-write leaves a version folder no pointer names (its id dates it
    older than a writer's lease here): never read, removed by the next night."""
    folder, out = series
    pointer = json.loads((out / "manifest.json").read_text())
    dead = out / "versions" / "20260101T000000000000Z-dead00"
    dead.mkdir()
    (dead / "zarr.json").write_text("{}")
    from pipeline.output.ownership import mark_folder
    from pipeline.output.store import Location

    mark_folder(Location.at(str(dead)), "version")
    assert open_run(out).manifest["created"] == pointer["created"]
    _table(folder / "b.parquet", 50, 7, 40_000)
    night = _night(out, str(folder / "b.parquet"))
    assert not dead.exists() and night.ok
    assert open_run(out).manifest["update"]["n_rows"] == 650


def test_the_next_night_merges_what_earlier_nights_left_oldest_first(series, monkeypatch):
    """A template catches up: the night of the 12th also merges the 11th's batch (its
    night never ran: killed, or the host down); re-running the 11th is then a no-op; a
    refused batch stays pending, refused again each night until it is fixed, then merged;
    merged batches are not read again (their path, size and mtime name them), and a
    pending one is read once a night."""
    from pipeline.series import batches

    folder, out = series
    tpl = str(folder / "b" / "{date:%Y-%m-%d}" / "*.parquet")

    def day(d: int) -> datetime.datetime:
        return datetime.datetime(2026, 11, d, 2, 30, tzinfo=datetime.UTC)

    def land(d: int, name: str, n: int, seed: int, first: int) -> None:
        _table(folder / "b" / f"2026-11-{d:02d}" / name, n, seed, first)

    def rel(pairs) -> list[str]:
        return [str(Path(p).relative_to(folder / "b")) for p, _ in pairs]

    land(10, "a.parquet", 50, 1, 40_000)
    land(11, "a.parquet", 50, 2, 40_100)
    land(12, "a.parquet", 30, 3, 40_000)  # bad: ids the 10th merged
    land(12, "b.parquet", 50, 4, 40_200)
    land(13, "a.parquet", 50, 5, 40_300)
    land(20, "a.parquet", 50, 9, 50_000)  # a later date: never taken before its night
    assert rel(_night(out, tpl, logical_date=day(10)).merged) == ["2026-11-10/a.parquet"]
    # the 11th's night never ran; the 12th's merges it first, then its own
    n12 = _night(out, tpl, logical_date=day(12))
    assert rel(n12.merged) == ["2026-11-11/a.parquet", "2026-11-12/b.parquet"]
    assert rel(n12.refused) == ["2026-11-12/a.parquet"]
    assert "already in the series" in n12.refused[0][1]
    # the 11th re-run by an operator: already merged, by the 12th's night
    n11 = _night(out, tpl, logical_date=day(11))
    assert n11.ok and not n11.merged and rel(n11.skipped) == ["2026-11-11/a.parquet"]
    assert n11.skipped[0][1] == n12.merged[0][1]
    # the 13th: its own batch merged, the refused one refused again; nothing merged is read
    read: list[str] = []
    hash_file = batches._hash_file

    def counted(fs, path, h):
        read.append(str(Path(path).relative_to(folder / "b")))
        return hash_file(fs, path, h)

    monkeypatch.setattr(batches, "_hash_file", counted)
    monkeypatch.setattr(batches, "_HASHED", {})  # a night is a process of its own
    n13 = _night(out, tpl, logical_date=day(13))
    assert rel(n13.merged) == ["2026-11-13/a.parquet"] and not n13.ok
    assert rel(n13.refused) == ["2026-11-12/a.parquet"]
    # each unmerged batch read once: listed and hashed, then its update takes that hash
    assert sorted(read) == ["2026-11-12/a.parquet", "2026-11-13/a.parquet"], read
    # the refused batch fixed in place (new rows, new bytes): the next night merges it
    land(12, "a.parquet", 30, 6, 40_400)
    n14 = _night(out, tpl, logical_date=day(14))
    assert n14.ok and rel(n14.merged) == ["2026-11-12/a.parquet"]
    m = open_run(out).manifest
    srcs = [Path(e["source"]["path"]) for e in m["update"]["rows"][1:]]
    assert [str(s.relative_to(folder / "b")) for s in srcs] == [
        "2026-11-10/a.parquet",
        "2026-11-11/a.parquet",
        "2026-11-12/b.parquet",
        "2026-11-13/a.parquet",
        "2026-11-12/a.parquet",
    ]
    ids = plain_read(out)["id"]
    assert len(ids) == 600 + 4 * 50 + 30 and ids.is_unique
