"""Job crash and resume: SIGKILL the whole pipeline process group part way through the
kernel build; the same command resumes and publishes the artifacts of an undisturbed run."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import numpy as np
import psutil
import pytest
import zarr

from pipeline.output.lock import LOCK_NAME

from .helpers import (
    ROOT,
    artifacts,
    done_blocks,
    env,
    kpca,
    read_json,
    run_command,
    start_job,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.distributed, pytest.mark.cluster]

N_BLOCKS = 12 * 13 // 2  # 2400 rows in blocks of 200: upper blocks


# moved out of the default run (its 20-minute budget, 2026-11-28): ~85 s; a stopped run resuming
# is tests/flows/test_cli_prefect.py's SIGTERM test
@pytest.mark.slow
def test_killed_job_resumes_and_publishes_identical_artifacts(
    tmp_path, e2e_data, reference_run
):
    """The job (driver + local cluster: one process group, as a batch scheduler would kill
    it) dies by SIGKILL during the kernel build. Nothing is published and readers say so.
    Re-running the same command breaks the dead run's lock, reuses the ingest, verifies and
    keeps exactly the blocks that were finished (the log counts them), computes only the
    rest, and the artifacts are identical to an undisturbed run's."""
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "run.yaml", e2e_data, out)
    cmd = run_command(cfg)
    job = start_job(cmd, tmp_path / "killed.log")
    try:
        ok = wait_until(lambda: done_blocks(out) >= N_BLOCKS // 4, 120, proc=job)
        group = [job.pid] + [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the job's own process group
        job.wait(timeout=30)
    assert ok, (tmp_path / "killed.log").read_text()[-3000:]
    assert job.returncode == -signal.SIGKILL
    assert len(group) >= 3  # the driver and its local cluster's processes died together
    assert wait_until(
        lambda: (
            not any(
                psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                for p in group
            )
        ),
        10,
    )

    # the crash left work behind but published nothing
    done = zarr.open_group(str(out / "work" / "kernel.zarr"), mode="r")["done"][...]
    finished = int(np.count_nonzero(done))
    assert 0 < finished < N_BLOCKS, finished
    assert not (out / "manifest.json").exists()
    assert read_json(out / LOCK_NAME)["pid"] == job.pid  # the dead run's lock is still there
    info = kpca("info", out)
    assert info.returncode == 2 and "no manifest.json: the run did not finish" in info.stderr
    new = tmp_path / "new.npy"
    np.save(new, np.zeros((3, 40)))
    tr = kpca("transform", out / "model", new, tmp_path / "emb.zarr")
    assert tr.returncode == 2 and not (tmp_path / "emb.zarr").exists()

    # the same command again: resumes
    res = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert f"breaking the stale lock of {out}" in log and f"pid {job.pid}" in log
    assert "ingest: reusing" in log
    m = re.search(r"kernel store: (\d+) blocks computed, (\d+) verified and kept", log)
    assert m, log[-3000:]
    assert (int(m.group(1)), int(m.group(2))) == (N_BLOCKS - finished, finished)
    assert not (out / LOCK_NAME).exists()
    assert artifacts(out) == reference_run
