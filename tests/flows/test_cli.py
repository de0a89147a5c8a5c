"""The ``kpca`` command line as a user runs it: real processes, real local cluster."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pandas as pd
import pytest
import zarr

from pipeline.output.versions import open_output
from tests.published import version_dir

pytestmark = pytest.mark.cluster  # its tests start processes

RNG = np.random.default_rng(5)
X = RNG.standard_normal((600, 4))


PREFECT_HOME = tempfile.mkdtemp(prefix="kpca-cli-prefect-")
atexit.register(shutil.rmtree, PREFECT_HOME, ignore_errors=True)


def kpca(*args, cwd=None):
    # The CLI runs the Prefect flow on an ephemeral API; keep its database out of ~/.prefect.
    env = {**os.environ, "PREFECT_HOME": os.environ.get("PREFECT_HOME", PREFECT_HOME)}
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    pd.DataFrame(X, columns=list("abcd")).assign(key=np.arange(600)).to_csv(
        tmp / "in.csv", index=False
    )
    (tmp / "run.yaml").write_text(
        f"input:\n  path: {tmp / 'in.csv'}\n  id_column: key\n"
        "kernel:\n  name: rbf\n  gamma: 0.2\n"
        "solver:\n  n_components: 3\n  eigen_solver: randomized\n  dtype: float64\n"
        "chunks:\n  target_chunk_mb: 0.005\n"
        f"output:\n  path: {tmp / 'out'}\n"
        "denoise:\n  enabled: true\n  alpha: 0.05\n"
        "cluster:\n  n_workers: 2\n"
    )
    res = kpca("run", tmp / "run.yaml", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "run complete" in res.stdout
    return tmp


def test_run_publishes_a_verified_run(run_dir):
    m = (run_dir / "out" / "manifest.json").read_text()
    assert '"status": "complete"' in m
    res = kpca("info", run_dir / "out")
    assert res.returncode == 0, res.stderr
    for word in ("verified", "600 rows x 4 features", "randomized solver", "residuals"):
        assert word in res.stdout
    # denoise.enabled: the pre-images of every row sit next to the embedding, checksummed
    import json

    import kpca_dask

    manifest = json.loads(m)
    assert manifest["denoise"]["rows"] == 600 and manifest["denoise"]["method"] == "learned"
    assert "denoised" in manifest["checksums"]
    model = kpca_dask.load(version_dir(run_dir / "out") / "model")
    den = zarr.open_group(str(version_dir(run_dir / "out")), mode="r")["denoised"][...]
    ref = model.inverse_transform(model.eigenvectors_ * np.sqrt(model.eigenvalues_))
    np.testing.assert_allclose(den, ref, rtol=1e-10, atol=1e-10)


def test_transform_inverse_writes_denoised_rows(run_dir):
    import kpca_dask

    new = RNG.standard_normal((40, 4))
    np.save(run_dir / "noisy.npy", new)
    out = run_dir / "den.zarr"
    res = kpca(
        "transform",
        run_dir / "out",
        run_dir / "noisy.npy",
        out,
        "--inverse",
        "--preimage",
        "fixed_point",
        "--overwrite",
    )
    assert res.returncode == 0, res.stderr
    assert "denoised 40 rows (4 features)" in res.stdout
    model = kpca_dask.load(version_dir(run_dir / "out") / "model")
    want = model.inverse_transform(model.transform(new), method="fixed_point")
    g = open_output(str(out)).data.open_group("r")
    assert g.attrs["method"] == "fixed_point"
    np.testing.assert_allclose(g["denoised"][...], want, rtol=1e-10, atol=1e-10)


def test_transform_inverse_needs_a_preimage(run_dir):
    from kpca_dask import KernelPCA

    KernelPCA(2, kernel="rbf", gamma=0.2).fit(X).save(run_dir / "plain-model")
    np.save(run_dir / "rows.npy", X[:10])
    res = kpca(
        "transform",
        run_dir / "plain-model",
        run_dir / "rows.npy",
        run_dir / "d2.zarr",
        "--inverse",
    )
    assert res.returncode == 2
    assert "has no pre-image" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    # moved out of the default run (its 20-minute budget, 2026-11-28)
    "suffix",
    ["new.zarr", pytest.param("new.parquet", marks=pytest.mark.slow)],
)
def test_transform_streams_to_zarr_or_parquet(run_dir, suffix):
    new = RNG.standard_normal((50, 4))
    np.save(run_dir / "new.npy", new)
    out = run_dir / suffix
    res = kpca("transform", run_dir / "out", run_dir / "new.npy", out, "--overwrite")
    assert res.returncode == 0, res.stderr
    import kpca_dask

    expected = kpca_dask.load(version_dir(run_dir / "out") / "model").transform(new)
    got = (
        open_output(str(out)).data.open_group("r")["embedding"][...]
        if suffix.endswith(".zarr")
        else pd.read_parquet(open_output(str(out)).data.local_path)[
            ["kernelpca0", "kernelpca1", "kernelpca2"]
        ].to_numpy()
    )
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_errors_exit_2_with_one_line(run_dir):
    (run_dir / "bad.yaml").write_text(
        "input:\n  path: nowhere.csv\nsolver:\n  n_components: 0\n"
    )
    res = kpca("run", run_dir / "bad.yaml")
    assert res.returncode == 2
    assert "solver.n_components" in res.stderr and "Traceback" not in res.stderr
    res = kpca("transform", run_dir / "out", run_dir / "missing.csv", run_dir / "x.zarr")
    assert res.returncode == 2 and "does not exist" in res.stderr
    res = kpca("info", run_dir)
    assert res.returncode == 2 and "no manifest.json" in res.stderr
    res = kpca("run", run_dir / "run.yaml", "--no-progress")  # complete run exists
    assert res.returncode == 2 and "--overwrite" in res.stderr


def test_transform_refuses_wrong_feature_count(run_dir):
    np.save(run_dir / "wide.npy", RNG.standard_normal((5, 7)))
    res = kpca("transform", run_dir / "out", run_dir / "wide.npy", run_dir / "w.zarr")
    assert res.returncode == 2
    assert "7 feature columns but the model was fitted on 4" in res.stderr


# moved out of the default run (its 20-minute budget, 2026-11-28): ~100 s; `kpca run` with
# Prefect is test_run_publishes_a_verified_run, and CI runs deploy/local-cluster.sh
@pytest.mark.slow
def test_demo_runs_the_whole_job(tmp_path):
    """The README's first command: every stage on the built-in digits, as a Prefect flow."""
    import json

    out = tmp_path / "kpca-demo"
    res = kpca("demo", "--output", out, "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "run complete" in res.stdout and "denoised" in res.stdout
    info = kpca("info", out)
    assert info.returncode == 0, info.stderr
    m = json.loads((out / "manifest.json").read_text())
    held_out = int((zarr.open_group(str(version_dir(out)), mode="r")["split"][...] == 0).sum())
    assert m["denoise"]["rows"] == held_out > 0
    assert {"denoised", "denoised_rows", "embedding"} <= set(m["checksums"])
    assert (version_dir(out) / "report" / "report.md").exists()
    assert m["evaluation"]["kpca_accuracy"] > m["evaluation"]["pca_accuracy"]
    # the demo's own input embeds with no flags: features by name, the run's id carried
    data = tmp_path / "kpca-demo-data" / "digits.parquet"
    assert "features   64 (every column but the id/label" in info.stdout
    assert "pixel_0_0" in info.stdout and "id column 'id'" in info.stdout
    res = kpca("transform", out, data, tmp_path / "again.zarr")
    assert res.returncode == 0, res.stderr
    again = open_output(str(tmp_path / "again.zarr")).data.open_group("r")
    run = zarr.open_group(str(version_dir(out)), mode="r")
    np.testing.assert_array_equal(again["ids"][...], run["ids"][...])
    # every row was a training row or a held-out one: the model reproduces its embedding
    np.testing.assert_allclose(again["embedding"][...], run["embedding"][...], atol=1e-4)
