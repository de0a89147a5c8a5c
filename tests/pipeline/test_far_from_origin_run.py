"""`kpca run` with ``preprocess.scale: none`` on rows far from the origin (issue 29).

Before the fix a verified run published 702.9/156.7/153.4/58.3 where the kernel's
spectrum is 133.7/128.9/122.1/120.1 (rbf, rows shifted by a constant). The published
spectrum is compared with an independent reference: ``scipy.linalg.eigh`` of the
centred kernel matrix computed by explicit differences on the UNSHIFTED rows, in
float64. Both exact paths are run: kernel blocks evaluated by the solver, and the
materialised kernel store (built by the pipeline's kernel stage, then read by the fit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import yaml
import zarr

import kpca_dask
from tests.published import version_dir

pytestmark = pytest.mark.cluster  # its tests start processes

ROOT = Path(__file__).resolve().parents[2]
N, D, GAMMA, K, OFFSET = 500, 8, 0.2, 4, 1e8


def reference(X: np.ndarray) -> np.ndarray:
    diff = X[:, None, :] - X[None, :, :]
    Km = np.exp(-GAMMA * np.einsum("ijk,ijk->ij", diff, diff))
    H = np.eye(len(X)) - 1.0 / len(X)
    return scipy.linalg.eigh(H @ Km @ H, eigvals_only=True)[::-1][:K]


@pytest.mark.parametrize(
    "materialize",
    # moved out of the default run (its 20-minute budget, 2026-11-28)
    ["never", pytest.param("always", marks=pytest.mark.slow)],
)
def test_published_spectrum_far_from_origin_equals_reference(tmp_path, materialize):
    X0 = np.random.default_rng(0).standard_normal((N, D))
    np.save(tmp_path / "x.npy", X0 + OFFSET)
    cfg = {
        "input": {"path": str(tmp_path / "x.npy")},
        "preprocess": {"scale": "none"},
        "kernel": {"name": "rbf", "gamma": GAMMA},
        "solver": {"n_components": K, "eigen_solver": "dense", "dtype": "float64"},
        "chunks": {"block_rows": 128},
        "kernel_store": {"materialize": materialize},
        "output": {"path": str(tmp_path / "out"), "parquet": False},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1, "threads_per_worker": 2},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PREFECT_HOME": os.environ.get("PREFECT_HOME") or str(tmp_path / "prefect"),
    }
    r = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(tmp_path / "run.yaml")]
        + ["--no-prefect", "--no-progress"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    model = kpca_dask.load(version_dir(tmp_path / "out") / "model")
    assert model.n_samples_fit_ == N  # no held-out split: the reference's rows
    published = np.asarray(
        zarr.open_group(str(version_dir(tmp_path / "out")), mode="r")["spectrum"][
            "eigenvalues"
        ][...]
    )
    ref = reference(X0)
    np.testing.assert_allclose(published, ref, rtol=1e-6)
    span = X0.max(axis=0) - X0.min(axis=0)  # the centre: the mean, to 2^-13 of the range
    assert np.all(np.abs(model.kernel_.center - (X0.mean(axis=0) + OFFSET)) <= span / 8192)
    # the published model embeds new rows as the unshifted kernel does
    new0 = np.random.default_rng(1).standard_normal((20, D))
    plain = kpca_dask.KernelPCA(K, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(X0)
    emb, ref_emb = model.transform(new0 + OFFSET), plain.transform(new0)
    signs = np.sign(np.sum(emb * ref_emb, axis=0))
    np.testing.assert_allclose(emb * signs, ref_emb, atol=1e-6 * np.abs(ref_emb).max())
