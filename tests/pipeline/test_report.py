"""The report: PNGs of the documented pixel sizes with real content, report.md, artifacts."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import zarr
from PIL import Image

from pipeline.evaluate import evaluate_run
from pipeline.evaluate.report import (
    FIGSIZES,
    artifact_summary,
    plot_accuracy,
    plot_scatter,
    png_size,
    report_markdown,
    write_report,
)
from tests.pipeline.test_evaluate_run import circles_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXPECTED_PX = {
    "scree": (800, 450),
    "scatter": (700, 600),
    "accuracy_vs_components": (800, 450),
    "novelty": (800, 450),
    "gamma_cv": (800, 450),
}


def png_header_size(data: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, checking the signature and the chunk's CRC."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16 : 16 + length]
    (crc,) = struct.unpack(">I", data[16 + length : 20 + length])
    assert zlib.crc32(kind + body) == crc, "corrupt IHDR"
    w, h = struct.unpack(">II", body[:8])
    return w, h


def assert_real_plot(path: Path, name: str) -> None:
    data = path.read_bytes()
    assert png_header_size(data) == EXPECTED_PX[name] == png_size(name)
    with Image.open(path) as im:
        im.load()  # decodes every pixel: a truncated file fails here
        rgb = np.asarray(im.convert("RGB"))
    assert rgb.shape == (EXPECTED_PX[name][1], EXPECTED_PX[name][0], 3)
    colours = np.unique(rgb.reshape(-1, 3), axis=0)
    assert len(colours) > 20, f"{name}: only {len(colours)} colours"
    ink = np.mean(np.any(rgb < 200, axis=2))
    assert 0.01 < ink < 0.9, f"{name}: {ink:.3f} of the pixels are non-white"


@pytest.fixture(scope="module")
def circles(tmp_path_factory):
    out = circles_run(tmp_path_factory.mktemp("report") / "run")
    metrics = evaluate_run(
        out,
        {
            "report": False,
            "gamma_sweep": [0.5, 2.0],
            "cv_max_rows": 120,
            "cv_folds": 2,
            "max_novelty_points": 100,
        },
    )
    root = zarr.open_group(str(out), mode="r")
    emb = np.asarray(root["embedding"][...])
    labels = np.asarray(root["labels"][...])
    rng = np.random.default_rng(0)
    nov = (rng.gamma(2.0, 0.1, 120), rng.gamma(2.0, 0.1, 280))
    return out, metrics, emb, labels, nov


@pytest.fixture(scope="module")
def written(circles):
    out, metrics, emb, labels, nov = circles
    files = write_report(
        out,
        metrics,
        scatter=(emb, labels),
        novelty=nov,
        title="circles",
        description="two concentric circles",
    )
    return out, metrics, files


def test_figure_sizes_are_documented_constants():
    """png_size is FIGSIZES * DPI: the sizes the module docstring promises."""
    assert {k: png_size(k) for k in FIGSIZES} == EXPECTED_PX


def test_write_report_pngs_exist_with_expected_size_and_content(written):
    """Every plot is a decodable PNG of its fixed size with real content."""
    out, _, files = written
    assert set(files) == {
        "scree",
        "scatter",
        "accuracy_vs_components",
        "novelty",
        "gamma_cv",
        "report",
    }
    for name in EXPECTED_PX:
        assert_real_plot(out / "report" / f"{name}.png", name)
    assert Path(files["report"]) == out / "report" / "report.md"


def test_report_markdown_ties_the_plots_together(written):
    """report.md names the data, kernel, both accuracies with the margin, and every plot."""
    out, metrics, _ = written
    md = (out / "report" / "report.md").read_text()
    assert md.startswith("# circles\n") and "two concentric circles" in md
    assert "rbf (gamma=2)" in md
    kp, pc = metrics["kpca"]["accuracy"], metrics["pca"]["accuracy"]
    assert f"{100 * kp:.2f}%" in md and f"{100 * pc:.2f}%" in md
    assert f"Margin: {100 * (kp - pc):+.2f} percentage points" in md
    for section in (
        "## Accuracy vs number of components",
        "## Spectrum",
        "## First two components",
        "## Novelty scores",
        "## Kernel coefficient by cross-validation",
        "How to read",
    ):
        assert section in md
    for name in EXPECTED_PX:
        assert f"]({name}.png)" in md


def test_plots_left_out_without_their_data(tmp_path, circles):
    """No scatter or novelty data: those PNGs are not drawn and the page does not link them."""
    metrics = dict(circles[1], gamma_sweep=None)
    files = write_report(tmp_path, metrics)
    assert "scatter" not in files and "novelty" not in files
    md = (tmp_path / "report" / "report.md").read_text()
    assert "scatter.png" not in md and "novelty.png" not in md and "scree.png" in md
    assert_real_plot(tmp_path / "report" / "scree.png", "scree")


def test_scatter_subsamples_and_handles_many_classes_and_one_component(tmp_path):
    """Many classes (no legend) and a 1-component embedding (strip) still draw a real plot."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 25, 20_000)
    E = rng.normal(size=(20_000, 2)) + y[:, None]
    plot_scatter(
        E, y, tmp_path / "many.png", classes=[f"c{i}" for i in range(25)], max_points=2000
    )
    assert_real_plot(tmp_path / "many.png", "scatter")
    plot_scatter(E[:, :1], y % 3, tmp_path / "strip.png", classes=["a", "b", "c"])
    assert_real_plot(tmp_path / "strip.png", "scatter")


def test_accuracy_plot_without_pca_points_above_dimension(tmp_path):
    """Linear PCA stops at d; the plot draws what exists and returns PNG bytes."""
    sweep = {
        "n_components": [1, 2, 4, 8],
        "kpca_accuracy": [0.5, 0.9, 0.95, 0.97],
        "pca_accuracy": [0.5, 0.6, None, None],
        "skipped": [],
        "pca_max_components": 2,
    }
    data = plot_accuracy(sweep, tmp_path / "acc.png", majority=0.5)
    assert data == (tmp_path / "acc.png").read_bytes()
    assert_real_plot(tmp_path / "acc.png", "accuracy_vs_components")


def test_artifact_summary_for_prefect(circles):
    """Markdown + a JSON-able table with one row per k, keyed for Prefect artifacts."""
    import json
    import re

    _, metrics, *_ = circles
    art = artifact_summary(metrics, report_dir="/runs/x/report")
    assert re.fullmatch(r"[a-z0-9-]+", art["key"])
    assert [r["n_components"] for r in art["table"]] == metrics["sweep"]["n_components"]
    last = art["table"][-1]
    assert last["kpca_accuracy"] == metrics["sweep"]["kpca_accuracy"][-1]
    json.dumps(art["table"])
    assert "Margin:" in art["markdown"] and "/runs/x/report/report.md" in art["markdown"]
    skipped = artifact_summary({"status": "skipped", "reason": "no labels"})
    assert "no labels" in skipped["markdown"] and skipped["table"] == []


def test_report_markdown_marks_undefined_values():
    """None (undefined precision, missing baseline point) shows as a dash, not 'None'."""
    metrics = {
        "data": {
            "n_rows": 10,
            "n_train": 6,
            "n_test": 4,
            "n_features": 2,
            "classes": ["a", "b"],
            "test_class_counts": [4, 0],
        },
        "model": {
            "kernel": {"name": "rbf", "gamma": 1.0},
            "n_components": 2,
            "eigen_solver": "dense",
        },
        "classifier": {"name": "logistic", "C": 1.0, "standardize": True},
        "kpca": {
            "n_components": 2,
            "accuracy": 1.0,
            "balanced_accuracy": 1.0,
            "macro_f1": 1.0,
            "converged": True,
            "confusion_matrix": [[4, 0], [0, 0]],
            "per_class": [
                {"class": "a", "precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 4},
                {"class": "b", "precision": None, "recall": None, "f1": None, "support": 0},
            ],
        },
        "pca": {
            "n_components": 1,
            "accuracy": 0.5,
            "balanced_accuracy": 0.5,
            "macro_f1": 0.3,
            "converged": True,
            "method": "pca",
        },
        "margin": 0.5,
        "sweep": {
            "n_components": [1, 2],
            "kpca_accuracy": [0.5, 1.0],
            "pca_accuracy": [0.5, None],
            "skipped": [],
        },
        "spectrum": {"eigenvalues": [2.0, 1.0], "explained_variance_ratio": [0.5, 0.25]},
    }
    md = report_markdown(metrics, images={"scree": "scree.png"})
    assert "None" not in md and "| b | — | — | — | 0 |" in md
