"""Feature scaling (config ``preprocess``): fitted on the training rows only, stored in the
model, reproduced by transform, undone by the pre-image; on real data (scikit-learn's
wine and breast-cancer tables, written as CSV/Parquet) kernel PCA then classifies at
least as well as linear PCA at the same k, and the report says so.

References are independent: scikit-learn's StandardScaler / RobustScaler / PCA /
KernelPCA fitted on the same training rows.
"""

from __future__ import annotations

import json

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.decomposition import KernelPCA as SkKernelPCA
from sklearn.preprocessing import RobustScaler, StandardScaler

import kpca_dask
from kpca_dask import KernelPCA
from kpca_dask import preprocess as pre
from pipeline.config import InputConfig, load_config
from pipeline.embed.transform import transform_to_store
from pipeline.runner.run import run_pipeline
from tests.published import version_dir

from ..conftest import align_signs


def table(loader) -> pd.DataFrame:
    """A scikit-learn dataset as a table: id, named feature columns, a string label."""
    bunch = loader(as_frame=True)
    df = bunch.frame.drop(columns=["target"]).copy()
    df.insert(0, "id", np.arange(len(df)) + 100)
    df["label"] = [str(bunch.target_names[t]) for t in bunch.target]
    return df


WINE = table(load_wine)
FEATURES = [c for c in WINE.columns if c not in ("id", "label")]


def run(tmp_path, path, out="out", **over) -> tuple[dict, object]:
    """The pipeline on ``path`` (plain mode, threaded scheduler); metrics and out folder."""
    cfg = {
        "input": {"path": str(path), "label_column": "label", "id_column": "id"},
        "solver": {"n_components": 8, "dtype": "float64", "random_state": 0},
        "output": {"path": str(tmp_path / out), "parquet": False},
        "evaluate": {"enabled": True, "sweep_components": None},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    run_pipeline(load_config(cfg))
    root = tmp_path / out
    return json.loads((version_dir(root) / "report" / "metrics.json").read_text()), root


def split_mask(root) -> np.ndarray:
    return np.asarray(zarr.open_group(str(version_dir(root)), mode="r")["split"][...]).astype(
        bool
    )


# ----------------------------------------------------------------- the statistics
@pytest.mark.parametrize("method", ["standard", "robust"])
def test_fitted_statistics_match_scikit_learn(method):
    """Distributed reductions over several row blocks give scikit-learn's statistics."""
    X = WINE[FEATURES].to_numpy()
    s = pre.fit_scaler(da.from_array(X, chunks=(40, -1)), method)
    ref = (StandardScaler if method == "standard" else RobustScaler)().fit(X)
    centre = ref.mean_ if method == "standard" else ref.center_
    np.testing.assert_allclose(s.center, centre, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(s.scale, ref.scale_, rtol=1e-13)
    np.testing.assert_allclose(s.transform(X), ref.transform(X), rtol=1e-12, atol=1e-12)
    assert s.exact


def test_constant_column_is_scaled_by_one_and_listed():
    X = np.c_[WINE[FEATURES].to_numpy()[:, :3], np.full(len(WINE), 7.5)]
    s = pre.fit_scaler(da.from_array(X, chunks=(50, -1)), "standard")
    assert s.constant == (3,) and s.scale[3] == 1.0 and s.center[3] == 7.5
    assert np.all(s.transform(X)[:, 3] == 0)


def test_huge_values_do_not_overflow_the_standard_deviation():
    """Values near 1e300 (their squares overflow): the spread is still finite and right."""
    X = 1e300 * (1.0 + np.random.default_rng(0).random((300, 3)))
    s = pre.fit_scaler(da.from_array(X, chunks=(100, -1)), "standard")
    np.testing.assert_allclose(s.scale, (X / 1e300).std(axis=0) * 1e300, rtol=1e-12)
    assert np.all(np.isfinite(s.transform(X))) and np.abs(s.transform(X)).max() < 3


def test_robust_beyond_one_task_is_approximate_and_says_so(monkeypatch):
    """Columns larger than one task: dask's merged per-block percentiles (flagged)."""
    monkeypatch.setattr(pre, "EXACT_QUANTILE_BYTES", 8 * 100)  # fewer rows than wine
    X = WINE[FEATURES].to_numpy()
    s = pre.fit_scaler(da.from_array(X, chunks=(45, -1)), "robust")
    ref = RobustScaler().fit(X)
    assert not s.exact
    # the merged median lies within the row blocks' medians (wine is sorted by class: the
    # blocks differ, the worst case), and the spreads are of the right size
    med = np.array([np.median(X[a : a + 45], axis=0) for a in range(0, len(X), 45)])
    assert np.all((med.min(axis=0) <= s.center) & (s.center <= med.max(axis=0)))
    assert np.all(np.abs(s.center - ref.center_) <= 0.35 * ref.scale_)
    assert np.all((0.5 * ref.scale_ <= s.scale) & (s.scale <= 2 * ref.scale_))


def test_estimator_scaling_matches_scaler_then_kernel_pca(tmp_path):
    """KernelPCA(preprocess="standard") = StandardScaler + scikit-learn's KernelPCA, and the
    saved model reproduces it (the scaling is part of the model)."""
    X = WINE[FEATURES].to_numpy()
    est = KernelPCA(4, kernel="rbf", gamma=0.05, preprocess="standard").fit(X)
    Xs = StandardScaler().fit_transform(X)
    ref = SkKernelPCA(4, kernel="rbf", gamma=0.05).fit(Xs).transform(Xs)
    E = est.transform(X)
    np.testing.assert_allclose(align_signs(E, ref), ref, atol=1e-9)
    est.save(tmp_path / "m")
    loaded = kpca_dask.load(tmp_path / "m")
    assert loaded.preprocess_.method == "standard"
    np.testing.assert_array_equal(loaded.transform(X), E)


# ------------------------------------------------------------ the pipeline on wine
@pytest.fixture(scope="module")
def wine_run(tmp_path_factory):
    """One pipeline run on wine as CSV: standard scaling (the default), denoised rows."""
    tmp = tmp_path_factory.mktemp("wine")
    WINE.to_csv(tmp / "wine.csv", index=False)
    metrics, root = run(tmp, tmp / "wine.csv", denoise={"enabled": True})
    return tmp, metrics, root


def test_scaling_is_fitted_on_training_rows_only(wine_run):
    """The model's statistics are StandardScaler's on the training rows; changing every
    held-out row (x1000) in a second run with the same split leaves them bit-identical."""
    tmp, _, root = wine_run
    mask = split_mask(root)
    model = kpca_dask.load(version_dir(root) / "model")
    s = model.preprocess_
    assert s.method == "standard" and s.n_rows == mask.sum() < len(WINE)
    ref = StandardScaler().fit(WINE[FEATURES].to_numpy()[mask])
    np.testing.assert_allclose(s.center, ref.mean_, rtol=1e-13)
    np.testing.assert_allclose(s.scale, ref.scale_, rtol=1e-13)
    assert s.columns == tuple(FEATURES)

    moved = WINE.copy()
    moved.loc[~mask, FEATURES] *= 1000.0
    moved.to_csv(tmp / "moved.csv", index=False)
    _, root2 = run(tmp, tmp / "moved.csv", out="out-moved")
    assert np.array_equal(split_mask(root2), mask)  # the same split (labels unchanged)
    s2 = kpca_dask.load(version_dir(root2) / "model").preprocess_
    assert np.array_equal(s2.center, s.center) and np.array_equal(s2.scale, s.scale)


def test_transform_reproduces_the_scaled_embedding(wine_run):
    """kpca transform of the raw input applies the stored scaling: held-out rows equal the
    run's embedding to 1e-12 (the same computation), training rows to the solver's
    accuracy (they come from the fit, V sqrt(lambda), in the run)."""
    tmp, _, root = wine_run
    out = tmp / "transformed.zarr"
    transform_to_store(
        str(root),
        InputConfig(path=str(tmp / "wine.csv"), label_column="label", id_column="id"),
        str(out),
    )
    new = np.asarray(zarr.open_group(str(version_dir(out)), mode="r")["embedding"][...])
    emb = np.asarray(zarr.open_group(str(version_dir(root)), mode="r")["embedding"][...])
    mask = split_mask(root)
    scale = np.abs(emb).max()
    assert np.max(np.abs(new[~mask] - emb[~mask])) <= 1e-12 * scale
    assert np.max(np.abs(new[mask] - emb[mask])) <= 1e-8 * scale


def test_preimage_returns_original_units(wine_run):
    """Denoised rows are in the data's units: scikit-learn's KernelPCA pre-image (same
    gamma, all training rows, alpha 1) on StandardScaler'd training rows, then
    StandardScaler.inverse_transform."""
    _, _, root = wine_run
    mask = split_mask(root)
    model = kpca_dask.load(version_dir(root) / "model")
    X = WINE[FEATURES].to_numpy()
    sc = StandardScaler().fit(X[mask])
    sk = SkKernelPCA(
        8, kernel="rbf", gamma=model.gamma_, fit_inverse_transform=True, alpha=1.0
    ).fit(sc.transform(X[mask]))
    ref = sc.inverse_transform(sk.inverse_transform(sk.transform(sc.transform(X))))
    den = np.asarray(zarr.open_group(str(version_dir(root)), mode="r")["denoised"][...])
    assert den.shape == X.shape
    # original units: proline in the hundreds, hue around 1 (not mean 0, std 1)
    assert 300 < den[:, FEATURES.index("proline")].mean() < 1500
    err = np.abs(den - ref) / np.abs(X).max(axis=0)  # relative to each column's range
    assert err.max() <= 1e-6, err.max()


def test_wine_kernel_pca_at_least_linear_pca_and_report_shows_it(wine_run):
    _, m, root = wine_run
    assert m["preprocess"]["scale"] == "standard" and m["preprocess"]["warning"] is None
    assert m["n_components"] == m["pca"]["n_components"] == 8
    assert m["kpca_accuracy"] >= m["pca_accuracy"] >= 0.9
    report = (version_dir(root) / "report" / "report.md").read_text()
    assert "Feature scaling | standard" in report
    assert f"{100 * m['kpca_accuracy']:.2f}%" in report
    assert f"{100 * m['pca_accuracy']:.2f}%" in report


def test_breast_cancer_parquet_kernel_pca_at_least_linear_pca(tmp_path):
    """Breast cancer (Parquet input) is nearly linearly separable: rbf at the median-
    heuristic gamma trails linear PCA at k = 8, and smaller gammas only approach it
    (docs/evaluate.md). The cosine kernel on the standard-scaled features -- similarity
    of direction from the training mean -- classifies at least as well as linear PCA at
    the same k, and the report shows both numbers."""
    df = table(load_breast_cancer)
    df.to_parquet(tmp_path / "bc.parquet", index=False)
    m, root = run(tmp_path, tmp_path / "bc.parquet", kernel={"name": "cosine"})
    assert m["preprocess"]["scale"] == "standard" and m["preprocess"]["spread_ratio"] > 1e3
    assert m["n_components"] == m["pca"]["n_components"] == 8
    assert m["kpca_accuracy"] >= m["pca_accuracy"] >= 0.9
    report = (version_dir(root) / "report" / "report.md").read_text()
    assert f"{100 * m['kpca_accuracy']:.2f}%" in report
    assert f"{100 * m['pca_accuracy']:.2f}%" in report and "Feature scaling" in report


def test_unscaled_wide_spread_warns_in_log_and_report(tmp_path, caplog):
    """scale: none on wine (proline ~1e3, hue ~0.1): one warning line naming the widest and
    narrowest columns, repeated in metrics.json and report.md."""
    WINE.to_csv(tmp_path / "wine.csv", index=False)
    with caplog.at_level("WARNING", logger="pipeline"):
        m, root = run(tmp_path, tmp_path / "wine.csv", preprocess={"scale": "none"})
    lines = [r.getMessage() for r in caplog.records if "feature scales differ" in r.message]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "'proline'" in lines[0] and "preprocess.scale: standard" in lines[0]
    p = m["preprocess"]
    assert p["scale"] == "none" and p["spread_ratio"] > 1e3 and p["widest"] == "proline"
    assert (
        p["warning"]
        and "Warning: feature scales differ"
        in (version_dir(root) / "report" / "report.md").read_text()
    )
    # no scaling: the model's transform is the raw estimator's (the identity scaler)
    model = kpca_dask.load(version_dir(root) / "model")
    assert model.preprocess_.identity


def test_merging_new_rows_into_a_scaled_model_scales_them():
    """kpca update's exact Nyström merge (partial_fit) of a scaled model: the new rows go
    through the model's scaler, the same as merging pre-scaled rows into a model fitted
    on pre-scaled rows."""
    X = WINE[FEATURES].to_numpy()
    X0, X1 = X[::2], X[1::2]
    params = dict(
        n_components=3,
        kernel="rbf",
        gamma=0.05,
        eigen_solver="nystroem",
        n_landmarks=40,
        landmark_method="uniform",
        random_state=0,
    )
    scaled = KernelPCA(preprocess="standard", **params).fit(X0)
    s = scaled.preprocess_
    plain = KernelPCA(**params).fit(s.transform(X0))
    np.testing.assert_array_equal(scaled.landmarks_, plain.landmarks_)
    scaled.partial_fit(X1)
    plain.partial_fit(s.transform(X1))
    np.testing.assert_allclose(scaled.eigenvalues_, plain.eigenvalues_, rtol=1e-12)
    np.testing.assert_allclose(
        scaled.transform(X1), plain.transform(s.transform(X1)), atol=1e-12
    )
