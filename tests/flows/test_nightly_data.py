"""Issue 27, the data side of a nightly job, through the ``kpca`` command line.

Every test runs the real command in a subprocess (against the session's real Dask
cluster on 127.0.0.1, or its own local one for validation): exact ids from CSV, the full
validation pass before anything starts, absolute paths in a series updated from another
folder, missing parents, and ``kpca update``'s column matching, findings, kernel
parameters and solver. Results are read through the CLI (``kpca info --json``) and the
published Parquet/transform outputs, not the run's internal arrays.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.output.versions import open_output

from ..reliability.helpers import env

pytestmark = pytest.mark.cluster  # its tests start processes

BIG = 2**53  # float64 holds every integer only up to here
FEATURES = [f"f{i}" for i in range(5)]


def kpca(*args, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, args)],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _table(n: int, seed: int, first_id: int = BIG, classes=("a", "b", "c"), shift=0.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(len(classes), len(FEATURES)))
    y = rng.integers(0, len(classes), n)
    X = centres[y] + rng.normal(size=(n, len(FEATURES))) + shift
    df = pd.DataFrame(X, columns=FEATURES)
    # consecutive ids above 2**53: as float64 every odd one collapses onto its neighbour
    df.insert(0, "id", np.arange(first_id, first_id + n, dtype=np.int64))
    df["label"] = np.asarray(classes)[y]
    return df


def _config(path: Path, data: Path, cluster: str, **input_) -> Path:
    cfg = {
        "input": {"path": str(data), "id_column": "id", "label_column": "label", **input_},
        "kernel": {"name": "rbf", "gamma": "scale"},
        "solver": {
            "n_components": 3,
            "eigen_solver": "randomized",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.05},
        "evaluate": {"enabled": False},
        "cluster": {"address": cluster},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _parquet(run: Path) -> pd.DataFrame:
    """The run's published Parquet embedding, wherever the run's layout puts it."""
    m = json.loads(kpca("info", run, "--json", cwd=run.parent).stdout)
    files = sorted(run.rglob("embedding.parquet"))
    assert files, f"no embedding.parquet under {run}"
    df = pd.concat([pd.read_parquet(f) for f in files[-1:]], ignore_index=True)
    assert len(df) == int((m.get("update") or {}).get("n_rows", m["input"]["n_rows"]))
    return df


def _info(run: Path) -> dict:
    r = kpca("info", run, "--json", cwd=run.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _strings(o, path=""):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(o, str):
        yield path, o


# ----------------------------------------------------------------------- item 2: ids
def test_csv_ids_above_2_53_are_kept_exactly(tmp_path, dask_cluster):
    """3 000 distinct int64 ids above 2**53 in a CSV whose feature columns have NaNs
    (dropped rows), and text ids: every id published as the source has it, row by row."""
    addr = dask_cluster.scheduler_address
    src = _table(3000, 0)
    src.loc[[5, 777, 2999], "f2"] = np.nan  # NaNs in another column: rows dropped
    src.to_csv(tmp_path / "big.csv", index=False)
    cfg = _config(tmp_path / "run.yaml", tmp_path / "big.csv", addr, nonfinite="drop")
    r = kpca(
        "run", cfg, "--output", tmp_path / "run", "--no-prefect", "--no-progress", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-3000:]
    kept = src.dropna().reset_index(drop=True)
    emb = _parquet(tmp_path / "run")
    assert emb["id"].dtype == np.int64
    assert emb["id"].nunique() == 2997
    assert (emb["id"].to_numpy() == kept["id"].to_numpy()).all()  # row by row
    assert (emb["label"].astype(str).to_numpy() == kept["label"].to_numpy()).all()

    # text ids (leading zeros, letters) from CSV, and int64 ids from Parquet, through
    # transform: ids as the source has them, row by row
    text = _table(40, 1).dropna()
    text["id"] = [f"{i:05d}" if i % 2 else f"k-{i}" for i in range(len(text))]
    text.to_csv(tmp_path / "text.csv", index=False)
    clean = src.dropna()
    clean.to_parquet(tmp_path / "ids.parquet", index=False)
    for data, want in ((tmp_path / "text.csv", text), (tmp_path / "ids.parquet", clean)):
        out = tmp_path / f"{data.stem}-emb.parquet"
        r = kpca("transform", tmp_path / "run", data, out, "--no-progress", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        got = pd.read_parquet(str(open_output(out).data.local_path))
        assert got["id"].tolist() == want["id"].tolist(), data


# ------------------------------------------------------------- item 8: validation
def _dirty(tmp_path: Path) -> dict[str, Path]:
    df = _table(10_000, 2)
    nan = df.copy()
    nan.loc[4297, "f3"] = np.nan
    nan.to_csv(tmp_path / "nan.csv", index=False)
    nan.to_parquet(tmp_path / "nan.parquet", index=False)
    text = df.copy()
    text["f1"] = text["f1"].astype(object)
    text.loc[6001, "f1"] = "n/a?"
    text.to_csv(tmp_path / "text.csv", index=False)
    dup = df.copy()
    dup.loc[8000, "id"] = dup.loc[12, "id"]
    dup.to_csv(tmp_path / "dup.csv", index=False)
    return {
        "nan.csv": tmp_path / "nan.csv",
        "nan.parquet": tmp_path / "nan.parquet",
        "text.csv": tmp_path / "text.csv",
        "dup.csv": tmp_path / "dup.csv",
    }


@pytest.mark.parametrize(
    "name, frags",
    [
        ("nan.csv", ["first: row 4297, column 'f3'", "line 4299 of the file"]),
        ("nan.parquet", ["first: row 4297, column 'f3'"]),
        ("text.csv", ["column 'f1' holds text", "'n/a?' in row 6001", "line 6003"]),
        ("dup.csv", [f"id {BIG + 12} of column 'id' repeats in row 8000", "first in row 12"]),
    ],
)
def test_every_row_is_checked_before_anything_starts(tmp_path, name, frags):
    """Problems far past the old 200-row sample: `kpca validate` and `kpca run` both name
    the exact row and column, exit 2, and the run leaves nothing behind (no output
    folder; the cluster is never started: the config names an address nobody serves)."""
    data = _dirty(tmp_path)[name]
    cfg = _config(tmp_path / "c.yaml", data, "tcp://127.0.0.1:9")
    out = tmp_path / "deep" / "out"
    before = sorted(p.name for p in tmp_path.iterdir())
    for cmd in ("validate", "run"):
        flags = ["--no-prefect", "--no-progress"] if cmd == "run" else []
        r = kpca(cmd, cfg, "--output", out, *flags, cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.stderr)
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith(f"kpca {cmd}: error:")]
        assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
        for frag in frags:
            assert frag in errors[0], (frag, errors[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path / "deep").exists()


def test_validate_reads_every_row_and_says_so(tmp_path):
    _table(5000, 3).to_csv(tmp_path / "ok.csv", index=False)
    cfg = _config(tmp_path / "c.yaml", tmp_path / "ok.csv", "tcp://127.0.0.1:9")
    r = kpca("validate", cfg, "--output", tmp_path / "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "5000 rows x 5 feature columns, every row read" in r.stdout
    assert "ids int64 and unique" in r.stdout


def test_a_wrong_label_column_lists_every_column_closest_first(tmp_path):
    df = _table(50, 4)
    for k in range(30):  # 30 more columns: the right one would be past the 20 shown
        df.insert(1, f"extra{k:02d}", float(k))
    df = df.rename(columns={"label": "zz_label"})
    df.to_csv(tmp_path / "wide.csv", index=False)
    cfg = _config(tmp_path / "c.yaml", tmp_path / "wide.csv", "tcp://127.0.0.1:9")
    cfg.write_text(cfg.read_text().replace("label_column: label", "label_column: zz_lable"))
    r = kpca("validate", cfg, "--output", tmp_path / "out", cwd=tmp_path)
    assert r.returncode == 2
    line = next(ln for ln in r.stderr.splitlines() if "zz_lable" in ln)
    assert "did you mean 'zz_label'?" in line
    assert "available (37 columns)" in line and "'extra00'" in line and "'f4'" in line


# ------------------------------------------------- items 3, 5, 6, 7: update a series
@pytest.fixture(scope="module")
def series(tmp_path_factory, dask_cluster):
    """A series started with a RELATIVE --output, from its own folder."""
    home = tmp_path_factory.mktemp("series")
    _table(600, 10).to_csv(home / "base.csv", index=False)
    cfg = _config(home / "run.yaml", Path("base.csv"), dask_cluster.scheduler_address)
    r = kpca("run", cfg, "--output", "runs/v1", "--no-prefect", "--no-progress", cwd=home)
    assert r.returncode == 0, r.stderr[-3000:]
    return home


def _batch(home: Path, name: str, df: pd.DataFrame) -> Path:
    path = home / "batches" / name
    path.parent.mkdir(exist_ok=True)
    df.to_csv(path, index=False)
    return path


@pytest.mark.slow  # moved out of the default run (its 20-minute budget, 2026-11-28): ~35 s
def test_update_from_another_folder_with_columns_by_name(series, tmp_path):
    """v1 was started as `--output runs/v1` in its folder; `kpca update` from another
    folder finds every path (all absolute in both manifests), takes the batch's columns by
    name in any order, keeps its new class's labels (a finding, not a silent drop), and
    reports ids the base run already has."""
    home = series
    v1 = _info(home / "runs" / "v1")
    batch = _table(150, 11, first_id=BIG + 10_000, classes=("a", "b", "new"))
    batch.loc[0, "id"] = BIG + 1  # an id the base run already has
    shuffled = batch[["label", "f3", "id", "f0", "f4", "f2", "f1"]]
    data = _batch(home, "b1.csv", shuffled)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = kpca(  # the re-sent id is kept (the default refuses it, issue 37)
        "update", home / "runs", data, "--duplicate-ids", "keep", "--no-prefect",
        "--no-progress", cwd=elsewhere,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert not any(elsewhere.iterdir())  # nothing written where the command ran
    v2 = _info(home / "runs" / "v2")
    inside = (".model.path", ".update.report")  # names inside the run folder
    for m in (v1, v2):
        for where, s in _strings(m):
            pathlike = where.endswith((".path", ".store", ".run", ".split_run")) or where in (
                ".update.base",
                ".config.update.base",
            )
            if pathlike and where not in inside:
                assert s.startswith("/") or "://" in s, (where, s)
    upd = v2["update"]
    checks = {f["check"]: f for f in upd["findings"]}
    assert checks["new_classes"]["classes"] == ["new"]
    assert checks["new_classes"]["rows"] == int((batch["label"] == "new").sum())
    assert checks["duplicate_ids"]["rows"] == 1 and checks["duplicate_ids"]["examples"] == [
        BIG + 1
    ]
    assert "new_classes" in r.stdout and "duplicate_ids" in r.stdout
    emb = _parquet(home / "runs" / "v2")
    assert len(emb) == 750
    # every row keeps its label, the new class included; ids exact, in order
    base = pd.read_csv(home / "base.csv")
    assert emb["label"].tolist() == base["label"].tolist() + batch["label"].tolist()
    assert emb["id"].tolist() == base["id"].tolist() + batch["id"].tolist()
    # the features block is the base run's (selection rule included)
    assert v2["input"]["features"]["names"] == FEATURES
    assert v2["input"]["features"]["selection"] == v1["input"]["features"]["selection"]


# moved out of the default run (its 20-minute budget, 2026-11-28): ~35 s;
# tests/pipeline/test_update_pipeline.py::test_update_refuses_in_one_line stays
@pytest.mark.slow
def test_update_refusals_name_the_columns_and_leave_nothing(series, tmp_path):
    home = series
    batch = _table(50, 12, first_id=BIG + 50_000)
    cases = [
        (batch.drop(columns=["f2"]), [], ["lacks the feature column(s) ['f2']", "any order"]),
        (batch.assign(extra=1.0), [], ["has column(s) ['extra']", "--ignore-extra"]),
        (batch.drop(columns=["label"]), [], ["no label column 'label'", "--unlabelled"]),
        (batch.drop(columns=["id"]), [], ["no id column 'id'", "--no-ids"]),
        (
            batch.assign(f1=lambda d: d["f1"].where(d.index != 33)),
            [],
            ["NaN or infinity", "'f1'", "row 33"],
        ),
    ]
    for k, (df, flags, frags) in enumerate(cases):
        data = _batch(home, f"bad{k}.csv", df)
        out = tmp_path / "new" / f"v{k}"
        r = kpca(
            "update",
            home / "runs" / "v1",
            data,
            "--output",
            out,
            "--no-prefect",
            "--no-progress",
            *flags,
            cwd=tmp_path,
        )
        assert r.returncode == 2, r.stderr[-2000:]
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("kpca update: error:")]
        assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
        for frag in frags:
            assert frag in errors[0], (frag, errors[0])
        assert not (tmp_path / "new").exists()  # no half-written version


@pytest.mark.slow  # ~17 s
def test_unlabelled_and_id_less_batches_when_asked(series, tmp_path):
    home = series
    batch = _table(40, 13, first_id=BIG + 70_000)
    data = _batch(home, "nolabel.csv", batch.drop(columns=["label"]))
    out = tmp_path / "a" / "b" / "v2"  # missing parents: created, as `kpca run` does
    r = kpca(
        "update",
        home / "runs" / "v1",
        data,
        "--output",
        out,
        "--unlabelled",
        "--no-prefect",
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    emb = _parquet(out)
    assert emb["label"].iloc[:600].notna().all() and emb["label"].iloc[600:].isna().all()
    assert emb["id"].iloc[600:].tolist() == batch["id"].tolist()
    assert [f["check"] for f in _info(out)["update"]["findings"]] == ["unlabelled_batch"]

    data = _batch(home, "noid.csv", batch.drop(columns=["id"]))
    out = tmp_path / "noid"
    r = kpca(
        "update",
        home / "runs" / "v1",
        data,
        "--output",
        out,
        "--no-ids",
        "--no-prefect",
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no_ids" in [f["check"] for f in _info(out)["update"]["findings"]]
    emb = _parquet(out)
    assert emb["label"].tolist()[600:] == batch["label"].tolist()


@pytest.mark.slow  # ~35 s: three updates of a series
def test_update_keeps_gamma_and_solver_unless_the_policy_changes_them(series, tmp_path):
    """An exact base (gamma: scale, resolved once) with a drifting batch under the auto
    policy: refit with the SAME gamma and solver (not Nyström); an explicit
    refresh_landmarks changes the solver and says so; one-row and one-class batches are
    accepted (updates do not evaluate)."""
    home = series
    base = _info(home / "runs" / "v1")["model"]
    drifted = _table(200, 14, first_id=BIG + 90_000, shift=6.0)
    data = _batch(home, "drift.csv", drifted)
    out = tmp_path / "drift"
    r = kpca(
        "update",
        home / "runs" / "v1",
        data,
        "--output",
        out,
        "--no-prefect",
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    m = _info(out)
    assert m["update"]["drifted"] and m["update"]["action"] == "refit"
    assert m["model"]["solver"] == base["solver"] == "randomized"
    assert m["model"]["gamma"] == base["gamma"]
    ch = m["update"]["changes"]
    assert not ch["gamma"]["changed"] and not ch["solver"]["changed"]
    assert "exact" in m["update"]["reason"]

    out = tmp_path / "refresh"
    r = kpca(
        "update",
        home / "runs" / "v1",
        data,
        "--output",
        out,
        "--policy",
        "refresh_landmarks",
        "--no-prefect",
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    m = _info(out)
    assert m["model"]["solver"] == "nystroem" and m["model"]["gamma"] == base["gamma"]
    ch = m["update"]["changes"]
    assert ch["solver"]["changed"] and "refresh_landmarks" in ch["solver"]["why"]
    assert "solver" in r.stdout and "changed" in r.stdout

    for k, df in enumerate((drifted.iloc[:1], drifted.assign(label="a").iloc[:30])):
        data = _batch(home, f"small{k}.csv", df)
        out = tmp_path / f"small{k}"
        r = kpca(
            "update",
            home / "runs" / "v1",
            data,
            "--output",
            out,
            "--no-prefect",
            "--no-progress",
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        m = _info(out)
        assert m["update"]["batch_rows"] == len(df)
        assert m["model"]["gamma"] == base["gamma"]


# moved out of the default run (its 20-minute budget; 2026-11-28, second cut): ~15 s
@pytest.mark.slow
def test_transform_creates_missing_parents_with_absolute_records(series, tmp_path):
    home = series
    data = _batch(home, "t.csv", _table(30, 15, first_id=BIG + 99_000))
    r = kpca(
        "transform",
        "runs/v1",
        "batches/t.csv",
        tmp_path / "x" / "y" / "t.zarr",
        "--no-progress",
        cwd=home,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    import zarr

    pub = open_output(tmp_path / "x" / "y" / "t.zarr")
    attrs = dict(zarr.open_group(str(pub.data.local_path), mode="r").attrs)
    assert attrs["model"] == str(home / "runs" / "v1") and attrs["input"] == str(data)
