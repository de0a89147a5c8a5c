"""Progress of the long stages in the log: the evaluate stage's numbered steps (classifier,
baseline, novelty, each gamma-sweep fit, report) and the solve stage's passes."""

from __future__ import annotations

import logging
import re

import numpy as np

from kpca_dask import KernelPCA
from pipeline.evaluate import evaluate_run
from tests.pipeline.test_evaluate_run import circles_run


def test_evaluate_logs_each_step_and_each_sweep_fit(tmp_path, caplog):
    out = circles_run(tmp_path / "circles", n=300)
    cfg = {"gamma_sweep": [1.0, 4.0], "cv_folds": 2, "cv_max_rows": 100, "report": True}
    with caplog.at_level(logging.INFO, logger="pipeline"):
        evaluate_run(out, cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline"]
    started = [ln for ln in lines if ln.startswith("evaluate [") and ln.endswith("...")]
    assert started == [
        "evaluate [1/5] logistic on the kernel PCA embedding ...",
        "evaluate [2/5] linear PCA baseline, logistic ...",
        "evaluate [3/5] novelty scores ...",
        "evaluate [4/5] gamma cross-validation ...",
        "evaluate [5/5] report ...",
    ]
    done = [ln for ln in lines if re.fullmatch(r"evaluate \[\d/5\] .* done in \d+\.\d s", ln)]
    assert len(done) == 5
    fits = [ln for ln in lines if ", fold " in ln]
    assert fits == [
        "evaluate [4/5] gamma 1, fold 1 of 2 (1/4)",
        "evaluate [4/5] gamma 1, fold 2 of 2 (2/4)",
        "evaluate [4/5] gamma 4, fold 1 of 2 (3/4)",
        "evaluate [4/5] gamma 4, fold 2 of 2 (4/4)",
    ]


def test_the_randomized_solve_logs_every_pass_with_its_bounds(caplog):
    """The solve stage's progress: one INFO line per pass (pass number, the certified
    eigenvalue and angle bounds that decide convergence), on kpca_dask's logger, which
    ``kpca run`` shows and the flow forwards to its run log."""
    X = np.random.default_rng(0).standard_normal((600, 5))
    with caplog.at_level(logging.INFO, logger="kpca_dask"):
        est = KernelPCA(4, kernel="rbf", gamma=0.1, eigen_solver="randomized").fit(X)
    passes = [
        r.getMessage() for r in caplog.records if "randomized solver: pass" in r.getMessage()
    ]
    assert passes and passes[0].startswith("randomized solver: pass 1, ")
    numbers = [int(re.search(r"pass (\d+),", p).group(1)) for p in passes]
    assert numbers == list(range(1, len(passes) + 1)) and est.n_passes_ >= len(passes)
    bound = float(re.search(r"max eigenvalue bound (\S+),", passes[-1]).group(1))
    assert 0 <= bound < 1e-2
