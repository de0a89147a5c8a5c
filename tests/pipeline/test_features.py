"""Columns by name through the pipeline (issue 15): the features a run used are recorded
(model, manifest, ``kpca info``); ``kpca transform`` selects them by name in any order,
reuses the run's id and label columns, and refuses a missing feature or an unknown column
in one line naming it; the column policy (bool as 0/1; text, categorical and datetime
left out with a warning, recorded); NaN errors name the column."""

from __future__ import annotations

import contextlib
import io
import json
import logging

import numpy as np
import pandas as pd
import pytest
import zarr

import kpca_dask
from pipeline.config import InputConfig, load_config
from pipeline.data.features import FeatureError, match, select
from pipeline.data.ingest import InputError
from pipeline.embed.transform import transform_to_store
from pipeline.runner.run import run_pipeline
from tests.published import version_dir

N = 240
FEATURES = ["f_a", "f_b", "f_c", "flag"]


def table(n=N, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    centres = np.repeat(rng.normal(size=(2, 3)) * 3, n // 2, axis=0)
    X = rng.normal(size=(n, 3)) + centres
    return pd.DataFrame(
        {
            "id": np.arange(n) + 5000,
            "f_a": X[:, 0],
            "f_b": X[:, 1],
            "label": np.repeat(["left", "right"], n // 2),
            "f_c": X[:, 2],
            "flag": X[:, 0] > 0,
        }
    )


def config(tmp, data, out="out", denoise=False, **inp):
    return load_config(
        {
            "denoise": {"enabled": denoise},
            "input": {"path": str(data), "id_column": "id", "label_column": "label", **inp},
            "kernel": {"name": "rbf", "gamma": 0.2},
            "solver": {"n_components": 3, "eigen_solver": "dense", "dtype": "float64"},
            "chunks": {"target_chunk_mb": 0.004, "block_rows": 64},
            "output": {"path": str(tmp / out), "parquet": False},
            "evaluate": {"enabled": False},
        }
    )


def cli(*argv) -> tuple[int, str, str]:
    """The real ``kpca`` command (parser, command, error mapping) in this process."""
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("features")
    table().to_csv(tmp / "train.csv", index=False)
    run_pipeline(config(tmp, tmp / "train.csv", denoise=True))
    return tmp


def embedding(path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(version_dir(path)), mode="r")["embedding"][...])


# ------------------------------------------------------------------ what a run records
def test_the_run_records_its_features(run):
    m = json.loads((run / "out" / "manifest.json").read_text())
    block = m["input"]["features"]
    assert block["names"] == FEATURES  # the table's order, id and label left out
    assert block["dtypes"] == ["float64", "float64", "float64", "bool"]
    assert block["bool_columns"] == ["flag"]
    assert (block["id_column"], block["label_column"]) == ("id", "label")
    assert block["selection"] == "all"
    model = kpca_dask.load(version_dir(run / "out") / "model")
    assert list(model.feature_names_in_) == FEATURES
    assert model.features_ == block  # the model's "features" block is the manifest's


def test_kpca_info_lists_the_features(run):
    rc, out, err = cli("info", run / "out")
    assert rc == 0, err
    start = out.index("features   ")
    listed = " ".join(out[start : out.index("\nmodel ", start)].split())
    assert listed.startswith("features 4 (every column but the id/label):")
    assert "f_a (float64), f_b (float64), f_c (float64), flag (bool)" in listed
    assert "bool as 0/1: flag; id column 'id'" in out


# ------------------------------------------------------------------ transform by name
def test_transform_by_name_in_any_order_reuses_id_and_label(run, tmp_path):
    new = table(60, seed=3)
    new.to_csv(tmp_path / "new.csv", index=False)
    shuffled = new[["flag", "label", "f_c", "id", "f_a", "f_b"]]
    shuffled.to_csv(tmp_path / "shuffled.csv", index=False)
    rc, _, err = cli("transform", run / "out", tmp_path / "new.csv", tmp_path / "a.zarr")
    assert rc == 0, err
    rc, _, err = cli("transform", run / "out", tmp_path / "shuffled.csv", tmp_path / "b.zarr")
    assert rc == 0, err
    a, b = embedding(tmp_path / "a.zarr"), embedding(tmp_path / "b.zarr")
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
    # the model on the rows in the fitted order is what the transform wrote
    model = kpca_dask.load(version_dir(run / "out") / "model")
    np.testing.assert_allclose(a, model.transform(new[FEATURES]), rtol=0, atol=1e-12)
    # and scikit-learn (StandardScaler, the run's default preprocess, then KernelPCA),
    # fitted on the same training columns, agrees up to sign
    from sklearn.decomposition import KernelPCA as SkKernelPCA
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train = table()[FEATURES].astype(float)
    sk = make_pipeline(StandardScaler(), SkKernelPCA(3, kernel="rbf", gamma=0.2)).fit(train)
    ref = sk.transform(new[FEATURES].astype(float))
    np.testing.assert_allclose(np.abs(b), np.abs(ref), rtol=0, atol=1e-8)
    g = zarr.open_group(str(version_dir(tmp_path / "b.zarr")), mode="r")
    np.testing.assert_array_equal(g["ids"][...], new["id"].to_numpy())  # carried, no flags
    assert "labels" in g


def test_transform_refuses_a_missing_feature_naming_it(run, tmp_path):
    table(20, seed=4).drop(columns=["f_b"]).to_csv(tmp_path / "new.csv", index=False)
    rc, _, err = cli("transform", run / "out", tmp_path / "new.csv", tmp_path / "e.zarr")
    assert rc == 2
    line = error_line(err)
    assert "lacks the feature column(s) ['f_b'] the model was fitted on" in line
    assert not (tmp_path / "e.zarr").exists()


def test_transform_refuses_an_unknown_column_unless_told(run, tmp_path):
    new = table(20, seed=5).assign(f_new=1.0)
    new.to_csv(tmp_path / "new.csv", index=False)
    rc, _, err = cli("transform", run / "out", tmp_path / "new.csv", tmp_path / "e.zarr")
    assert rc == 2
    line = error_line(err)
    assert "has column(s) ['f_new'] the model was not fitted on" in line
    assert "--ignore-extra" in line
    assert not (tmp_path / "e.zarr").exists()
    rc, _, err = cli(
        "transform", run / "out", tmp_path / "new.csv", tmp_path / "ok.zarr", "--ignore-extra"
    )
    assert rc == 0, err
    new.drop(columns=["f_new"]).to_csv(tmp_path / "plain.csv", index=False)
    cli("transform", run / "out", tmp_path / "plain.csv", tmp_path / "plain.zarr")
    np.testing.assert_array_equal(
        embedding(tmp_path / "ok.zarr"), embedding(tmp_path / "plain.zarr")
    )


def test_denoise_selects_columns_by_name_too(run, tmp_path):
    new = table(26, seed=8).assign(f_new=0.0)
    new.to_csv(tmp_path / "new.csv", index=False)
    new[["f_new", "f_b", "id", "flag", "f_a", "label", "f_c"]].to_parquet(
        tmp_path / "s.parquet"
    )
    for src, dst in (("new.csv", "a.zarr"), ("s.parquet", "b.zarr")):
        rc, _, err = cli(
            "transform",
            run / "out",
            tmp_path / src,
            tmp_path / dst,
            "--inverse",
            "--ignore-extra",
        )
        assert rc == 0, err
    a = zarr.open_group(str(version_dir(tmp_path / "a.zarr")), mode="r")
    b = zarr.open_group(str(version_dir(tmp_path / "b.zarr")), mode="r")
    np.testing.assert_allclose(b["denoised"][...], a["denoised"][...], rtol=0, atol=1e-12)
    assert b["denoised"].shape == (26, len(FEATURES))
    np.testing.assert_array_equal(b["ids"][...], new["id"].to_numpy())


def test_new_rows_without_id_or_label_and_one_class(run, tmp_path):
    bare = table(30, seed=6)
    bare[FEATURES].to_parquet(tmp_path / "bare.parquet")
    res = transform_to_store(
        str(run / "out"),
        InputConfig(path=str(tmp_path / "bare.parquet")),
        str(tmp_path / "b.zarr"),
    )
    assert res["rows"] == 30
    assert set(
        zarr.open_group(str(version_dir(tmp_path / "b.zarr")), mode="r").array_keys()
    ) == {"embedding"}
    # a label column with one class only: not a reason to refuse new rows
    one = table(30, seed=6).assign(label="left")
    one.to_csv(tmp_path / "one.csv", index=False)
    transform_to_store(
        str(run / "out"), InputConfig(path=str(tmp_path / "one.csv")), str(tmp_path / "o.zarr")
    )
    np.testing.assert_allclose(
        embedding(tmp_path / "o.zarr"), embedding(tmp_path / "b.zarr"), rtol=0, atol=1e-12
    )


def test_listed_columns_ignore_other_columns_at_transform(tmp_path):
    df = table().assign(note="free text", when=pd.Timestamp("2026-01-01"))
    df.to_parquet(tmp_path / "train.parquet")
    run_pipeline(config(tmp_path, tmp_path / "train.parquet", columns=["f_c", "f_a"]))
    block = kpca_dask.load(version_dir(tmp_path / "out") / "model").features_
    assert block["names"] == ["f_c", "f_a"] and block["selection"] == "columns"
    new = table(20, seed=7).assign(other=2.0)
    new.to_csv(tmp_path / "new.csv", index=False)
    rc, _, err = cli("transform", tmp_path / "out", tmp_path / "new.csv", tmp_path / "t.zarr")
    assert rc == 0, err
    model = kpca_dask.load(version_dir(tmp_path / "out") / "model")
    np.testing.assert_allclose(
        embedding(tmp_path / "t.zarr"),
        model.transform(new[["f_a", "f_c"]]),  # a DataFrame: by name, in any order
        rtol=0,
        atol=1e-12,
    )


# ------------------------------------------------------------------ the column policy
def test_policy_leaves_out_text_categorical_and_datetime_naming_them(caplog):
    cols = ["id", "x", "city", "kind", "when", "ok"]
    dtypes = {
        "id": np.dtype("i8"),
        "x": np.dtype("f8"),
        "city": np.dtype(object),
        "kind": pd.CategoricalDtype(["a", "b"]),
        "when": np.dtype("M8[ns]"),
        "ok": np.dtype(bool),
    }
    with caplog.at_level(logging.INFO, logger="pipeline"):
        sel = select("t.parquet", cols, dtypes, id_column="id")
    assert sel.features == ["x", "ok"] and sel.bools == ["ok"] and sel.selection == "all"
    assert sel.ignored == ["city", "kind", "when"]
    assert "leaving out non-numeric column(s) 'city' (text), 'kind' (categorical), " in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        sel = select(
            "t.parquet", cols, dtypes, id_column="id", exclude=["city", "kind", "when"]
        )
    assert (
        sel.features == ["x", "ok"] and sel.ignored == [] and "leaving out" not in caplog.text
    )
    with pytest.raises(FeatureError, match=r"input.columns \['city'\] are not numeric"):
        select("t.parquet", cols, dtypes, columns=["x", "city"])
    with pytest.raises(FeatureError, match=r"input.exclude_columns \['nope'\] are not columns"):
        select("t.parquet", cols, dtypes, exclude=["nope"])
    with pytest.raises(FeatureError, match="has no numeric feature columns"):
        select("t.parquet", ["id", "city"], dtypes, id_column="id")


def test_bool_columns_are_noted(caplog):
    with caplog.at_level(logging.INFO, logger="pipeline"):
        select("t.csv", ["a", "b"], {"a": np.dtype("f8"), "b": np.dtype(bool)})
    assert "bool column(s) ['b'] used as 0/1 features" in caplog.text


def test_match_unit():
    block = {"names": ["a", "b"], "id_column": "id", "label_column": "y", "selection": "all"}
    m = match(block, "n.csv", ["b", "y", "a"])
    assert m.features == ["a", "b"] and m.id_column is None and m.label_column == "y"
    with pytest.raises(FeatureError, match=r"--id-column 'key' is not a column"):
        match(block, "n.csv", ["a", "b"], id_column="key")
    assert match({**block, "selection": "columns"}, "n.csv", ["a", "b", "z"]).ignored == ["z"]


def test_a_run_records_the_columns_it_left_out_and_names_nan_columns(tmp_path):
    df = table().assign(city="oslo", when=pd.Timestamp("2026-01-01"))
    df.to_parquet(tmp_path / "t.parquet")
    run_pipeline(config(tmp_path, tmp_path / "t.parquet"))
    block = json.loads((tmp_path / "out" / "manifest.json").read_text())["input"]["features"]
    assert block["names"] == FEATURES
    assert [c["name"] for c in block["ignored"]] == ["city", "when"]
    rc, out, err = cli("info", tmp_path / "out")
    assert rc == 0, err
    assert "left out (not numeric): city (" in out and "when (datetime64" in out
    # the same table again: the columns the run left out are not "unknown" at transform
    rc, _, err = cli("transform", tmp_path / "out", tmp_path / "t.parquet", tmp_path / "t.zarr")
    assert rc == 0, err
    df = table()
    df.loc[100, "f_c"] = np.nan
    df.to_csv(tmp_path / "n.csv", index=False)
    with pytest.raises(InputError, match=r"\(first: row 100, column 'f_c'\); clean"):
        run_pipeline(config(tmp_path, tmp_path / "n.csv", out="out2"))


def test_info_lines_for_positions_and_runs_without_a_block():
    from flows.cli import feature_lines as _feature_lines

    npy = {"names": [f"x{i}" for i in range(30)], "dtypes": None, "selection": "positions"}
    lines = _feature_lines(npy, [])
    assert lines[0].startswith("features   30 (no names: columns by position): x0, x1,")
    assert "... (6 more: kpca info --json lists all)" in " ".join(lines)
    assert all(len(ln) <= 100 for ln in lines)
    old = _feature_lines(None, ["a", "b"])  # a manifest written before the features block
    assert old == ["features   2: a, b"]
