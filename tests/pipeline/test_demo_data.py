"""Demo datasets: real CSV/Parquet files (id, named features, label) that show kPCA off."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kpca_dask import KernelPCA
from pipeline.data.demo_data import DEMO_DATASETS, demo_frame, write_demo_data, write_table
from pipeline.evaluate import evaluate_embeddings, linear_pca_baseline, make_split


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_digits_file_round_trips(tmp_path, fmt):
    """digits.<fmt> holds 1797 rows: id, 64 named pixel columns (0-16), integer label 0-9."""
    paths = write_demo_data(tmp_path, ["digits"], fmt=fmt)
    assert paths["digits"] == tmp_path / f"digits.{fmt}"
    df = pd.read_csv(paths["digits"]) if fmt == "csv" else pd.read_parquet(paths["digits"])
    assert df.shape == (1797, 66)
    assert df.columns[0] == "id" and df.columns[-1] == "label"
    assert list(df.columns[1:4]) == ["pixel_0_0", "pixel_0_1", "pixel_0_2"]
    assert df["id"].is_unique and df["id"].dtype == np.int64
    pixels = df.drop(columns=["id", "label"]).to_numpy()
    assert pixels.min() == 0 and pixels.max() == 16
    assert sorted(df["label"].unique()) == list(range(10))
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_circles_and_moons_have_string_labels(tmp_path):
    """The 2-D sets use class names, exercising label encoding in ingest."""
    paths = write_demo_data(tmp_path, ["circles", "moons"], fmt="csv")
    c, m = pd.read_csv(paths["circles"]), pd.read_csv(paths["moons"])
    assert list(c.columns) == ["id", "x", "y", "label"] == list(m.columns)
    assert set(c["label"]) == {"inner", "outer"} and set(m["label"]) == {"upper", "lower"}
    assert len(c) == len(m) == 1500


@pytest.mark.parametrize("name", ["circles", "moons"])
def test_demo_settings_show_kpca_beating_linear_pca(name):
    """With DEMO_DATASETS' kernel and k, kernel PCA beats linear PCA by a wide margin."""
    spec = DEMO_DATASETS[name]
    df = demo_frame(name)
    X = df[["x", "y"]].to_numpy()
    y = np.unique(df["label"], return_inverse=True)[1]
    split = make_split(y, 0.25, random_state=0).astype(bool)
    params = {k: v for k, v in spec.kernel.items() if k != "name"}
    model = KernelPCA(spec.n_components, kernel=spec.kernel["name"], **params).fit(X[split])
    kp = evaluate_embeddings(
        model.transform(X[split]), y[split], model.transform(X[~split]), y[~split]
    )
    P_tr, P_te, _ = linear_pca_baseline(X[split], X[~split], spec.n_components)
    pc = evaluate_embeddings(P_tr, y[split], P_te, y[~split])
    assert kp["accuracy"] > 0.98
    assert kp["accuracy"] - pc["accuracy"] > 0.08


def test_unknown_names_and_formats_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown demo dataset 'mnist'"):
        write_demo_data(tmp_path, ["mnist"])
    with pytest.raises(ValueError, match="fmt must be 'csv' or 'parquet'"):
        write_demo_data(tmp_path, ["digits"], fmt="json")
    with pytest.raises(ValueError, match="cannot tell the format"):
        write_table(demo_frame("moons"), tmp_path / "moons.txt")
