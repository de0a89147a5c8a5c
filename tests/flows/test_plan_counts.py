"""`kpca plan`'s I/O counts against a real run of the same config: the objects it prices
for each stage are the chunks and files the run writes, and its storage bytes are what
lands on disk (within the stores' metadata and codec framing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.reliability.helpers import blobs, kpca, write_config

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # a real `kpca run`: ~45 s here


def _files(root, pattern: str) -> list:
    return [p for p in root.glob(pattern) if p.is_file() and p.name != "zarr.json"]


def test_plan_counts_the_chunks_and_files_a_run_writes(tmp_path):
    np.save(tmp_path / "x.npy", blobs(3000, 40))
    out = tmp_path / "out"
    # 0.2 MB chunks of 40 float64 columns: 625 rows, 5 chunks; 15 row blocks of 200
    cfg = write_config(tmp_path / "run.yaml", tmp_path / "x.npy", out)
    planned = kpca("plan", cfg, "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    ran = kpca("run", cfg, "--no-progress", "--no-prefect")
    assert ran.returncode == 0, ran.stderr[-2000:]
    (version,) = (out / "versions").iterdir()
    ingest = _files(out / "work" / "ingest.zarr" / "X", "**/*")
    embedding = _files(version / "embedding", "**/*")
    parquet = list((version / "embedding.parquet").glob("*.parquet"))
    kernel = _files(out / "work" / "kernel.zarr" / "K", "**/*")
    io = plan["io"]
    written = {t["what"]: t for t in io["ingest"]["transfers"] + io["embed"]["transfers"]}
    assert io["ingest"]["chunks"] == io["embed"]["chunks"] == len(ingest) == 5
    assert written["ingest store"]["objects"] == len(ingest)
    assert written["embedding"]["objects"] == len(embedding)
    assert written["parquet"]["objects"] == len(parquet)
    assert io["kernel store"]["transfers"][0]["objects"] == len(kernel) == 15 * 16 // 2
    on_disk = {
        "ingest store": sum(p.stat().st_size for p in ingest),
        "embedding": sum(p.stat().st_size for p in embedding),
        "parquet": sum(p.stat().st_size for p in parquet),
        "kernel store": sum(p.stat().st_size for p in kernel),
    }
    for what, size in on_disk.items():
        assert 0.6 < size / plan["storage_bytes"][what] < 1.4, (what, size)
