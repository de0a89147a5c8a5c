"""The checks before anything starts (pipeline/data/validate.py): ``kpca validate`` and the
first
thing ``kpca run`` does. Every bad config below is refused by a real ``kpca run`` (Prefect
mode, the default) in a subprocess that afterwards has imported neither dask, distributed,
zarr nor Prefect -- so no cluster and no Prefect server can have started -- and that left no
file behind. Plus ``--version`` and the global flags on either side of the subcommand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("dask", "distributed", "zarr", "prefect")


def _base(data: Path, out: Path, **over) -> dict:
    cfg = {
        "input": {"path": str(data)},
        "kernel": {"name": "rbf", "gamma": 0.1},
        "solver": {"n_components": 2},
        "output": {"path": str(out)},
        "evaluate": {"enabled": False},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    return cfg


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# each case: (key, config mapping, fragments of its one error line)
def _cases(d: Path) -> list[tuple[str, dict, list[str]]]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 3))
    df = pd.DataFrame(X, columns=["a", "b", "c"]).assign(
        name=[f"r{i}" for i in range(50)], y=np.arange(50) % 2
    )
    df.to_csv(d / "t.csv", index=False)
    df.to_parquet(d / "t.parquet")
    nan = df.copy()
    nan.loc[7, "b"] = np.nan
    nan.to_csv(d / "nan.csv", index=False)
    np.save(d / "x.npy", X)
    np.save(d / "x3.npy", X.reshape(5, 10, 3))
    (d / "afile").write_text("not a folder")
    done = d / "done"
    done.mkdir()
    (done / "manifest.json").write_text(json.dumps({"status": "complete"}))
    (d / "g.zarr").mkdir()
    (d / "g.zarr" / "zarr.json").write_text(
        json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})
    )
    out = d / "out"
    return [
        ("missing-input", _base(d / "nope.csv", out), ["'", "nope.csv", "does not exist"]),
        (
            "label-column",
            _base(d / "t.csv", out, input={"label_column": "label"}),
            ["input.label_column 'label' is not a column", "available"],
        ),
        (
            "id-column",
            _base(d / "t.parquet", out, input={"id_column": "key"}),
            ["input.id_column 'key' is not a column"],
        ),
        (
            "columns",
            _base(d / "t.parquet", out, input={"columns": ["a", "zz"]}),
            ["input.columns ['zz'] are not in", "available"],
        ),
        (
            "types",
            _base(d / "t.csv", out, input={"columns": ["a", "name"]}),
            ["input.columns ['name'] are not numeric", "encode them as numbers"],
        ),
        (
            "nan-sample",
            _base(d / "nan.csv", out),
            ["NaN or infinity in column(s) ['b']", "row 7", "input.nonfinite: drop"],
        ),
        (
            "npy-columns",
            _base(d / "x.npy", out, input={"label_column": "y"}),
            ["NPY input has no named columns"],
        ),
        ("npy-3d", _base(d / "x3.npy", out), ["shape (5, 10, 3)", "need 2-D"]),
        ("zarr-group", _base(d / "g.zarr", out), ["zarr group without an array 'X'"]),
        (
            "output-under-a-file",
            _base(d / "t.csv", d / "afile" / "out"),
            ["cannot create output", "is a file"],
        ),
        ("output-is-a-file", _base(d / "t.csv", d / "afile"), ["is a file, not a folder"]),
        (
            "complete-run",
            _base(d / "t.csv", done),
            ["already holds a complete run", "--overwrite"],
        ),
        (
            "overlap",
            _base(d / "t.csv", d / "t.csv" / "run"),
            ["lies inside the input", "write the output somewhere else"],
        ),
        (
            "evaluate-no-labels",
            _base(d / "t.csv", out, evaluate={"enabled": True}),
            ["evaluate.enabled is true but the input has no label column"],
        ),
    ]


_DRIVER = """
import contextlib, io, json, sys
from flows.cli import main
res = {}
for key, path, cmd in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main([cmd, path])
    res[key] = {"rc": rc, "err": err.getvalue()}
loaded = {m.split(".")[0] for m in sys.modules}
res["__modules__"] = sorted(loaded & set(sys.argv[2].split(",")))
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Every case through ``kpca run`` (and ``kpca validate``) in ONE fresh process."""
    d = tmp_path_factory.mktemp("prestart")
    cases = _cases(d)
    runs = []
    for key, cfg, _ in cases:
        path = d / f"{key}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        runs += [(key, str(path), "run"), (f"validate:{key}", str(path), "validate")]
    before = _files(d)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(d / "prefect-home")}
    res = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(runs), ",".join(HEAVY)],
        cwd=d,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return {
        "cases": {key: frags for key, _, frags in cases},
        "results": json.loads(res.stdout.splitlines()[-1]),
        "new_files": _files(d) - before,
    }


@pytest.mark.cluster  # `refused` runs the commands in a fresh Python
def test_nothing_started_nothing_left(refused):
    """No dask/distributed/zarr/Prefect module was even imported: no cluster, no scheduler
    port, no Prefect server. And not one file was written by the 28 refused commands."""
    assert refused["results"]["__modules__"] == []
    assert refused["new_files"] == set()


@pytest.mark.cluster  # `refused` runs the commands in a fresh Python
@pytest.mark.parametrize(
    "key",
    [
        "missing-input",
        "label-column",
        "id-column",
        "columns",
        "types",
        "nan-sample",
        "npy-columns",
        "npy-3d",
        "zarr-group",
        "output-under-a-file",
        "output-is-a-file",
        "complete-run",
        "overlap",
        "evaluate-no-labels",
    ],
)
def test_each_check_refuses_in_one_line(refused, key):
    frags = refused["cases"][key]
    for cmd, run_key in (("run", key), ("validate", f"validate:{key}")):
        r = refused["results"][run_key]
        assert r["rc"] == 2, r["err"]
        lines = [ln for ln in r["err"].splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith(f"kpca {cmd}: error: ")]
        assert len(errors) == 1 and "Traceback" not in r["err"], r["err"]
        for frag in frags:
            assert frag in errors[0], (frag, errors[0])


def test_every_problem_gets_its_own_line(tmp_path):
    from pipeline.config import load_config
    from pipeline.data.validate import validate

    pd.DataFrame({"a": [1.0, 2.0], "b": ["x", "y"]}).to_csv(tmp_path / "t.csv", index=False)
    cfg = load_config(
        _base(
            tmp_path / "t.csv",
            tmp_path / "out",
            input={"label_column": "lab", "id_column": "key", "columns": ["a", "q"]},
        )
    )
    v = validate(cfg)
    assert [f.check for f in v.errors] == ["label", "id", "columns"]
    assert all("\n" not in f.message for f in v.errors)
    assert not (tmp_path / "out").exists()


def test_a_good_config_passes_and_the_output_probe_leaves_nothing(tmp_path):
    from flows.cli import main

    pd.DataFrame(
        {"a": np.arange(5.0), "flag": ["u", "v", "u", "v", "u"], "y": [0, 1, 0, 1, 0]}
    ).to_csv(tmp_path / "t.csv", index=False)
    out = tmp_path / "deep" / "er" / "out"
    cfg = _base(tmp_path / "t.csv", out, input={"label_column": "y"})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    before = _files(tmp_path)
    assert main(["validate", str(tmp_path / "c.yaml")]) == 0
    assert _files(tmp_path) == before  # the probe made deep/er/out and removed exactly those
    # an output folder of the user's that exists is probed, and kept with its content
    out.mkdir(parents=True)
    (out / "keep.txt").write_text("mine")
    assert main(["validate", str(tmp_path / "c.yaml")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_validate_reports_what_it_read(tmp_path, capsys):
    from flows.cli import main

    pd.DataFrame({"a": [1.0, 2.0], "b": [3, 4], "s": ["x", "y"]}).to_parquet(
        tmp_path / "t.parquet"
    )
    (tmp_path / "c.yaml").write_text(
        yaml.safe_dump(_base(tmp_path / "t.parquet", tmp_path / "o"))
    )
    assert main(["validate", str(tmp_path / "c.yaml")]) == 0
    cap = capsys.readouterr()
    assert "kpca validate: ok:" in cap.out and "2 feature columns" in cap.out
    assert "non-numeric columns ['s'] are not used as features" in cap.err


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.cluster  # a kpca command or a Prefect run
def test_version():
    from kpca_dask import __version__

    res = _cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"kpca-dask {__version__}"


def test_global_flags_before_or_after_the_subcommand():
    from flows.cli import parse_args

    assert parse_args(["-v", "info", "x"]).verbose == 1
    assert parse_args(["info", "x", "-v"]).verbose == 1
    assert parse_args(["-v", "run", "c.yaml", "-v"]).verbose == 2
    assert parse_args(["run", "-q", "c.yaml"]).quiet is True
    q = parse_args(["-q", "run", "c.yaml"])
    assert q.quiet and q.progress is False
    assert parse_args(["validate", "c.yaml", "--quiet"]).quiet is True


# moved out of the default run (its 20-minute budget; 2026-11-28, second cut): ~20 s
@pytest.mark.slow
@pytest.mark.cluster  # a kpca command or a Prefect run
def test_a_run_refused_by_ingest_leaves_no_folder_it_created(tmp_path):
    """A NaN the pre-start checks do not read (a zarr array's values: its metadata only)
    is found by ingest (a real run, plain mode): one line, exit 2, and the output folder
    the run created is gone again (a user error: nothing in it would be resumed). A folder
    that was there before is left in place. The same NaN in an NPY file is found before
    anything starts (the full pass reads every row), with its row and column."""
    import zarr

    from pipeline.data.validate import SAMPLE_ROWS

    X = np.random.default_rng(0).standard_normal((SAMPLE_ROWS + 100, 3))
    X[SAMPLE_ROWS + 50, 1] = np.nan
    np.save(tmp_path / "x.npy", X)
    npy = _base(tmp_path / "x.npy", tmp_path / "out", cluster={"address": "tcp://127.0.0.1:9"})
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(npy))
    res = _cli("run", str(tmp_path / "n.yaml"), "--no-prefect", "--no-progress")
    assert res.returncode == 2, res.stderr
    assert f"(first: row {SAMPLE_ROWS + 50}, column 'x1')" in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()

    zarr.save_array(str(tmp_path / "x.zarr"), X)
    cfg = _base(
        tmp_path / "x.zarr",
        tmp_path / "out",
        solver={"eigen_solver": "dense"},
        cluster={"n_workers": 1, "dashboard_address": None},
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = _cli("run", str(tmp_path / "c.yaml"), "--no-prefect", "--no-progress")
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and "contains NaN or infinity (1 value;" in errors[0], res.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()  # the user's own (empty) folder: kept
    res = _cli("run", str(tmp_path / "c.yaml"), "--no-prefect", "--no-progress")
    assert res.returncode == 2, res.stderr
    assert (tmp_path / "out").is_dir()
