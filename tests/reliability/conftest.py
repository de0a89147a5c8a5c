"""Fixtures of the reliability tests: one data set and one undisturbed reference run."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from .helpers import ROOT, artifacts, blobs, env, run_command, write_config


@pytest.fixture(scope="session")
def e2e_data(tmp_path_factory):
    """2400 x 40 clustered rows as NPY (12 kernel blocks of 200 rows: 78 upper blocks)."""
    folder = tmp_path_factory.mktemp("e2e-data")
    np.save(folder / "x.npy", blobs(2400))
    return folder / "x.npy"


@pytest.fixture(scope="session")
def reference_run(e2e_data, tmp_path_factory):
    """The artifacts of an undisturbed run (local cluster of 2 worker processes)."""
    folder = tmp_path_factory.mktemp("reference")
    cfg = write_config(folder / "run.yaml", e2e_data, folder / "out")
    res = subprocess.run(
        run_command(cfg), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return artifacts(folder / "out")
