"""The Nyström solve stage's reads of the ingest store (issue 17: 11 whole reads at n = 2M).

Measured on a real ingest store and a real LocalCluster: the bytes zarr's local store
returns inside the worker processes, counted by a wrapper installed there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kpca_dask import KernelPCA
from pipeline.config import load_config
from pipeline.runner.run import stage_begin
from pipeline.stages import stage_ingest, stage_kernel, stage_solve, stage_split

N, D, M = 40_000, 8, 200


def _install_counter() -> None:
    """In a worker process: count what zarr's LocalStore.get returns for chunk keys."""
    import zarr.storage

    cls = zarr.storage.LocalStore
    if getattr(cls, "_test_counts", None) is not None:
        return
    orig = cls.get
    counts = {"bytes": 0, "calls": 0}

    async def get(self, key, prototype=None, byte_range=None):
        buf = await orig(self, key, prototype, byte_range)
        if buf is not None and "ingest.zarr" in str(self.root) and key.startswith("X/c"):
            counts["bytes"] += len(buf)
            counts["calls"] += 1
        return buf

    cls.get = get
    cls._test_counts = counts


def _counts() -> dict:
    import zarr.storage

    return dict(zarr.storage.LocalStore._test_counts)


def _read(client) -> int:
    return sum(c["bytes"] for c in client.run(_counts).values())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, D)) + rng.standard_normal((8, D))[rng.integers(0, 8, N)] * 2
    path = tmp_path_factory.mktemp("nys-io") / "X.npy"
    np.save(path, X)
    return X, path


def _config(tmp_path: Path, path: Path):
    return load_config(
        {
            "input": {"path": str(path)},
            "preprocess": {"scale": "none"},  # compared with the estimator on raw rows
            "kernel": {"name": "rbf", "gamma": 0.05},
            "solver": {
                "n_components": 4,
                "eigen_solver": "nystroem",
                "n_landmarks": M,
                "dtype": "float64",
                "random_state": 0,
            },
            # ingest chunks of 7812 rows: the solver's 6667-row blocks straddle them
            "chunks": {"target_chunk_mb": 0.5},
            "output": {"path": str(tmp_path / "out")},
            "evaluate": {"enabled": False},
        }
    )


def _solve(cfg, client):
    stage_begin(cfg)
    ing = stage_ingest(cfg)
    split = stage_split(cfg, ing)
    kernel = stage_kernel(cfg, ing, split)
    store = sum(
        f.stat().st_size
        for f in (Path(ing.store.local_path) / "X").rglob("*")
        if f.is_file() and f.name != "zarr.json"
    )
    before = _read(client)
    solved = stage_solve(cfg, ing, split, kernel)
    return solved.to_dict(), _read(client) - before, store


def test_nystroem_solve_reads_the_ingest_store_once(tmp_path, data, dask_client, monkeypatch):
    """Rows that fit the memory budget are read once for the whole fit; above it, once per
    pass plus the NaN check, the gamma sample and the landmark sample -- never more (a
    re-chunking that re-read whole chunks per block would read each chunk ~once per
    block). Both give the in-memory estimator's eigenvalues."""
    X, path = data
    dask_client.run(_install_counter)
    import kpca_dask

    solved, read, store = _solve(_config(tmp_path / "a", path), dask_client)
    assert solved["solver"] == "nystroem" and solved["rows_in_memory"] is True
    ref = KernelPCA(
        4,
        kernel="rbf",
        gamma=0.05,
        eigen_solver="nystroem",
        n_landmarks=M,
        random_state=0,
        remove_zero_eig=True,
    ).fit(X)
    assert solved["block_rows"] == ref.chunk_size_ == 6667  # the estimator's own blocks
    assert store > 0.9 * X.nbytes  # the counted store is the whole X (noise: no compression)
    assert store <= read <= 1.05 * store, f"{read / store:.2f} reads of the store for one fit"
    model = kpca_dask.load(solved["path"])

    # the same solve with no memory to spare: the store is re-read, once per pass
    monkeypatch.setattr("pipeline.model.solve.PERSIST_FRACTION", 0.0)
    solved2, read2, store2 = _solve(_config(tmp_path / "b", path), dask_client)
    assert solved2["rows_in_memory"] is False
    reads = solved2["n_passes"] + 3  # + NaN check, gamma sample, landmark sample
    assert store2 <= read2 <= 1.05 * reads * store2, (
        f"{read2 / store2:.2f} reads, {reads} steps"
    )
    model2 = kpca_dask.load(solved2["path"])

    np.testing.assert_allclose(model.eigenvalues_, ref.eigenvalues_, rtol=1e-9)
    np.testing.assert_allclose(model2.eigenvalues_, ref.eigenvalues_, rtol=1e-9)
    np.testing.assert_array_equal(model.landmark_indices_, ref.landmark_indices_)
