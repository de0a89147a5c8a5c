"""The evaluate stage end to end on real run folders (real zarr arrays in tmp_path).

``build_run`` writes the layout of docs/artifacts.md the way the pipeline
does: ingested X under work/ingest.zarr, a split chosen before fitting, the
model fitted on training rows only and saved, the embedding of every row by
the saved model's transform, labels with their class names, the spectrum.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import zarr
from sklearn.datasets import load_digits, make_circles

import kpca_dask
from kpca_dask import KernelPCA
from pipeline.evaluate import (
    METRICS_SCHEMA,
    EvaluationError,
    evaluate_embeddings,
    evaluate_run,
    linear_pca_baseline,
    make_split,
)

REPORT_FILES = (
    "metrics.json",
    "report.md",
    "scree.png",
    "scatter.png",
    "accuracy_vs_components.png",
    "novelty.png",
)


def build_run(
    out: Path,
    X: np.ndarray,
    y: np.ndarray,
    classes: list[str],
    split: np.ndarray,
    model: KernelPCA,
    *,
    chunk_rows: int = 500,
    labels: bool = True,
) -> Path:
    """A run folder as the pipeline leaves it before the evaluate stage."""
    n, d = X.shape
    root = zarr.open_group(str(out), mode="w", zarr_format=3)
    ingest = zarr.open_group(str(out / "work" / "ingest.zarr"), mode="w", zarr_format=3)
    ingest.create_array("X", data=X, chunks=(chunk_rows, d))
    model.fit(X[split.astype(bool)])
    model.save(out / "model")
    saved = kpca_dask.load(out / "model")
    emb = saved.transform(X)
    root.create_array("embedding", data=emb, chunks=(chunk_rows, emb.shape[1]))
    if labels:
        lab = root.create_array("labels", data=y.astype(np.int64), chunks=(chunk_rows,))
        lab.attrs["classes"] = list(classes)
        root.create_array("split", data=split.astype(np.uint8), chunks=(chunk_rows,))
    spectrum = root.create_group("spectrum")
    spectrum.create_array("eigenvalues", data=model.eigenvalues_)
    spectrum.create_array("explained_variance_ratio", data=model.explained_variance_ratio_)
    spectrum.create_array("residuals", data=model.residuals_)
    return out


def circles_run(out: Path, n: int = 400) -> Path:
    X, y = make_circles(n, noise=0.08, factor=0.3, random_state=0)
    split = make_split(y, 0.3, random_state=0)
    return build_run(
        out,
        X,
        y,
        ["outer", "inner"],
        split,
        KernelPCA(4, kernel="rbf", gamma=2.0, random_state=0),
        chunk_rows=128,
    )


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """Digits, rbf kernel PCA with k=32 (the demo settings), evaluated once for the module."""
    X, y = load_digits(return_X_y=True)
    split = make_split(y, 0.25, random_state=0)
    out = build_run(
        tmp_path_factory.mktemp("runs") / "digits",
        X.astype(np.float64),
        y,
        [str(i) for i in range(10)],
        split,
        KernelPCA(32, kernel="rbf", gamma=0.3 / 256, random_state=0),
    )
    cfg = {
        "test_fraction": 0.25,
        "gamma_sweep": [0.3 / 256, 12 / 256],
        "cv_max_rows": 300,
        "cv_folds": 2,
        "max_scatter_points": 1000,
        "max_novelty_points": 300,
    }
    metrics = evaluate_run(out, cfg, title="digits", description="8x8 digits")
    return out, metrics, (X, y, split.astype(bool))


def test_metrics_file_matches_schema(digits_run):
    """metrics.json validates against METRICS_SCHEMA and equals the returned dict."""
    out, metrics, _ = digits_run
    on_disk = json.loads((out / "report" / "metrics.json").read_text())
    jsonschema.Draft202012Validator.check_schema(METRICS_SCHEMA)
    jsonschema.validate(on_disk, METRICS_SCHEMA)
    assert on_disk == json.loads(json.dumps(metrics))


def test_metrics_schema_rejects_broken_metrics(digits_run):
    """The schema has teeth: missing sections, bad accuracies and bad types fail it."""
    _, metrics, _ = digits_run
    good = json.loads(json.dumps(metrics))
    for mutate in (
        lambda m: m.pop("kpca"),
        lambda m: m["kpca"].__setitem__("accuracy", 1.3),
        lambda m: m["pca"].__setitem__("method", "svd"),
        lambda m: m["kpca"]["per_class"][0].__setitem__("support", "44"),
        lambda m: m["sweep"]["n_components"].append(0),
        lambda m: m.__setitem__("schema_version", 2),
    ):
        bad = json.loads(json.dumps(good))
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, METRICS_SCHEMA)


def test_stage_agrees_with_array_level_functions(digits_run):
    """Reading the run folder chunk by chunk gives the numbers of the in-memory functions."""
    out, metrics, (X, y, split) = digits_run
    emb = np.asarray(zarr.open_group(str(out), mode="r")["embedding"][...])
    kp = evaluate_embeddings(emb[split], y[split], emb[~split], y[~split])
    P_tr, P_te, _ = linear_pca_baseline(X[split], X[~split], 32)
    pc = evaluate_embeddings(P_tr, y[split], P_te, y[~split])
    assert metrics["kpca"]["confusion_matrix"] == kp["confusion_matrix"]
    assert metrics["pca"]["confusion_matrix"] == pc["confusion_matrix"]
    assert metrics["margin"] == pytest.approx(kp["accuracy"] - pc["accuracy"])
    assert metrics["margin"] > 0.01  # kernel PCA ahead on digits, as in test_evaluate.py


def test_metrics_content(digits_run):
    """Counts, classes, sweep, spectrum and model description are those of the run."""
    _, m, (X, y, split) = digits_run
    assert m["status"] == "complete" and m["schema_version"] == 1
    assert m["data"]["n_rows"] == 1797 and m["data"]["n_features"] == 64
    assert m["data"]["n_train"] == int(split.sum()) and m["data"]["n_test"] == 450
    assert m["data"]["classes"] == [str(i) for i in range(10)]
    assert sum(m["data"]["train_class_counts"]) == int(split.sum())
    assert m["data"]["test_class_counts"] == np.bincount(y[~split]).tolist()
    assert m["model"]["kernel"]["name"] == "rbf" and m["model"]["n_components"] == 32
    assert m["classifier"]["name"] == "logistic"
    assert m["sweep"]["n_components"] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert m["sweep"]["kpca_accuracy"][-1] == m["kpca"]["accuracy"]
    assert m["sweep"]["pca_accuracy"][-1] == m["pca"]["accuracy"]
    assert len(m["spectrum"]["eigenvalues"]) == 32
    assert np.all(np.diff(m["spectrum"]["eigenvalues"]) <= 0)
    cm = np.array(m["kpca"]["confusion_matrix"])
    assert cm.shape == (10, 10) and cm.sum() == 450


def test_gamma_sweep_in_metrics(digits_run):
    """The gamma cross-validation ran on training rows and prefers the sensible gamma."""
    _, m, _ = digits_run
    gs = m["gamma_sweep"]
    assert gs["gamma"] == [0.3 / 256, 12 / 256] and gs["cv_folds"] == 2 and gs["n_rows"] == 300
    assert gs["best"]["gamma"] == 0.3 / 256
    assert gs["fitted_gamma"] == pytest.approx(0.3 / 256)


def test_novelty_scores_summarised(digits_run):
    """score_samples of held-out and training rows are summarised (non-negative, ordered)."""
    _, m, _ = digits_run
    nov = m["novelty"]
    assert nov["n_test_scored"] == 300 and nov["n_train_scored"] == 300
    q = nov["test_quantiles"]
    assert -1e-9 <= q["min"] <= q["median"] <= q["p99"] <= q["max"]
    assert 0.0 <= nov["test_fraction_above_train_p99"] < 0.2


def test_report_folder_written(digits_run):
    """The report folder holds every file, the markdown links the plots."""
    out, _, _ = digits_run
    rep = out / "report"
    for name in REPORT_FILES + ("gamma_cv.png",):
        assert (rep / name).stat().st_size > 500, name
    md = (rep / "report.md").read_text()
    for png in (
        "scree.png",
        "scatter.png",
        "accuracy_vs_components.png",
        "novelty.png",
        "gamma_cv.png",
    ):
        assert f"]({png})" in md
    assert "Margin: +" in md and "# digits" in md and "8x8 digits" in md


def test_rerun_is_idempotent(digits_run, tmp_path):
    """Evaluating the same folder again gives the same numbers (every choice is seeded)."""
    import shutil

    out, m, _ = digits_run
    copy = tmp_path / "digits"
    shutil.copytree(out, copy)  # leave the module's run folder as the fixture wrote it
    again = evaluate_run(
        copy, {"test_fraction": 0.25, "report": False, "max_novelty_points": 300}
    )
    for key in ("kpca", "pca", "margin", "sweep", "data"):
        assert again[key] == m[key], key


def test_sgd_and_incremental_baseline_paths(tmp_path):
    """Forcing SGD and the streamed IncrementalPCA baseline still separates the circles."""
    out = circles_run(tmp_path / "circles")
    m = evaluate_run(
        out,
        {
            "classifier": "sgd",
            "baseline_memory_mb": 0.001,
            "report": False,
            "sweep_components": [1, 2, 8],
        },
    )
    jsonschema.validate(
        json.loads((out / "report" / "metrics.json").read_text()), METRICS_SCHEMA
    )
    assert m["classifier"]["name"] == "sgd" and m["pca"]["method"] == "incremental_pca"
    assert m["pca"]["n_components"] == 2  # linear PCA of 2-D data has 2 components
    assert m["sweep"]["n_components"] == [1, 2, 4] and m["sweep"]["skipped"] == [8]
    assert m["sweep"]["pca_accuracy"][-1] is None and m["sweep"]["pca_max_components"] == 2
    assert m["kpca"]["accuracy"] > 0.95 and m["pca"]["accuracy"] < 0.75
    assert not (out / "report" / "scree.png").exists()  # report: false


def test_unlabelled_run_is_skipped_in_auto_mode(tmp_path):
    """enabled='auto' and no labels: nothing is written, the reason is returned."""
    X, y = make_circles(200, noise=0.05, random_state=0)
    out = build_run(
        tmp_path / "r",
        X,
        y,
        ["a", "b"],
        np.ones(200, np.uint8),
        KernelPCA(2, kernel="rbf", gamma=2.0),
        labels=False,
    )
    res = evaluate_run(out)
    assert res["status"] == "skipped" and "label" in res["reason"]
    assert not (out / "report").exists()
    with pytest.raises(EvaluationError, match="no 'labels' array"):
        evaluate_run(out, {"enabled": True})
    assert evaluate_run(out, {"enabled": False})["status"] == "skipped"


def test_empty_side_of_split_is_an_error(tmp_path):
    """A split with no held-out rows cannot be evaluated; the message says why."""
    X, y = make_circles(200, noise=0.05, random_state=0)
    out = build_run(
        tmp_path / "r",
        X,
        y,
        ["a", "b"],
        np.ones(200, np.uint8),
        KernelPCA(2, kernel="rbf", gamma=2.0),
    )
    with pytest.raises(EvaluationError, match="0 held-out rows"):
        evaluate_run(out)


def test_inconsistent_run_folder_is_an_error(tmp_path):
    """Labels of another length than the embedding: refused before any work."""
    out = circles_run(tmp_path / "c", n=300)
    root = zarr.open_group(str(out), mode="a")
    root.create_array("labels", data=np.zeros(10, np.int64), overwrite=True)
    with pytest.raises(EvaluationError, match="inconsistent"):
        evaluate_run(out)


def test_missing_ingest_is_an_error(tmp_path):
    """The baseline needs work/ingest.zarr/X; its absence is named with the fix."""
    import shutil

    out = circles_run(tmp_path / "c", n=300)
    shutil.rmtree(out / "work")
    with pytest.raises(EvaluationError, match="ingest.zarr"):
        evaluate_run(out, {"report": False})
