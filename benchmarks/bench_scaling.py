"""Feature scaling on real data: held-out accuracy of kernel PCA and of linear PCA (the
evaluate stage's classifier, same k) with preprocess.scale none / standard / robust.

Runs the real pipeline (plain mode, the threaded scheduler) on scikit-learn's wine,
breast-cancer and digits tables and on the demo's circles and moons, each written as a
CSV file with named columns, an id and a label column. Every run uses the defaults
(rbf kernel, gamma: scale, logistic regression on the embedding, 20 % held out)
except ``solver.n_components``; the demo datasets are also run with the kernel the
demo uses (``kpca demo``: a fixed gamma tuned on the raw values).

    PYTHONPATH=$PWD python benchmarks/bench_scaling.py            # the table (markdown)
    PYTHONPATH=$PWD python benchmarks/bench_scaling.py --only wine  # one dataset

About 2-3 minutes on 2 cores. Accuracies depend on the data and the seeded split, not
on the CPU (up to the last digit of a near-tie in the classifier).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import load_config
from pipeline.data.demo_data import DEMO_DATASETS, demo_frame
from pipeline.runner.run import run_pipeline

SCALES = ("none", "standard", "robust")


def sklearn_frame(name: str) -> pd.DataFrame:
    from sklearn import datasets

    loader = {
        "wine": datasets.load_wine,
        "breast_cancer": datasets.load_breast_cancer,
    }[name]
    bunch = loader(as_frame=True)
    df = bunch.frame.drop(columns=["target"]).copy()
    df.insert(0, "id", np.arange(len(df)))
    df["label"] = [str(bunch.target_names[t]) for t in bunch.target]
    return df


#: (dataset, k, kernel: None for the defaults, "demo" for the demo's, or a kernel section)
CASES = [
    ("wine", 8, None),
    ("breast_cancer", 8, None),
    ("breast_cancer", 8, {"name": "cosine"}),
    ("digits", 32, None),
    ("circles", 2, None),
    ("moons", 4, None),
    ("digits", 32, "demo"),
    ("circles", 2, "demo"),
    ("moons", 4, "demo"),
]


def frame(name: str) -> pd.DataFrame:
    if name in ("wine", "breast_cancer"):
        return sklearn_frame(name)
    return demo_frame(name)


def _kernel_label(kernel: dict | None) -> str:
    if kernel is None:
        return "rbf, gamma: scale"
    if "gamma" in kernel:
        return f"{kernel['name']}, gamma {kernel['gamma']:.3g} (the demo's)"
    return kernel["name"]


def run_one(work: Path, name: str, k: int, kernel: dict | None, scale: str) -> dict:
    csv = work / f"{name}.csv"
    if not csv.exists():
        frame(name).to_csv(csv, index=False)
    tag = "default" if kernel is None else kernel["name"] + str(kernel.get("gamma", ""))
    out = work / f"out-{name}-{scale}-{tag}"
    cfg = {
        "input": {"path": str(csv), "label_column": "label", "id_column": "id"},
        "preprocess": {"scale": scale},
        "solver": {"n_components": k, "random_state": 0},
        "output": {"path": str(out), "overwrite": True, "parquet": False},
        "evaluate": {"enabled": True, "sweep_components": None},
    }
    if kernel:
        cfg["kernel"] = kernel
    run_pipeline(load_config(cfg))
    m = json.loads((out / "report" / "metrics.json").read_text())
    return {
        "dataset": name,
        "kernel": _kernel_label(kernel),
        "n": m["data"]["n_rows"],
        "d": m["data"]["n_features"],
        "k": m["n_components"],
        "scale": scale,
        "gamma": m["model"]["gamma"],
        "kpca": m["kpca_accuracy"],
        "pca": m["pca_accuracy"],
        "pca_k": m["pca"]["n_components"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="one dataset name")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    rows = []
    print("| dataset | n x d | k | kernel | scale | kernel PCA | linear PCA |")
    print("|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, k, demo in CASES:
            if args.only and name != args.only:
                continue
            kernel = DEMO_DATASETS[name].kernel if demo == "demo" else demo
            for scale in SCALES:
                r = run_one(Path(tmp), name, k, kernel, scale)
                rows.append(r)
                print(
                    f"| {r['dataset']} | {r['n']} x {r['d']} | {r['k']} | {r['kernel']} | "
                    f"{r['scale']} | {100 * r['kpca']:.1f} % | {100 * r['pca']:.1f} % |",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
