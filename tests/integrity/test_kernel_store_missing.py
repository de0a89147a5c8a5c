"""A kernel store with a chunk file (or a done marker) missing is refused at read, never
read as zeros: whole blocks by their raw chunk file, edge blocks through zarr, both against
their CRC-32C done marker."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from kpca_dask.kernels import RBFKernel
from pipeline.model.kernel_store import KernelBlockReader, KernelStoreError, build_kernel_store
from pipeline.output.store import Location


@pytest.mark.parametrize("which", ["whole", "edge", "marker"])
def test_missing_kernel_chunk_is_refused(tmp_path, which):
    X = np.random.default_rng(0).standard_normal((130, 3))
    Xd = da.from_array(X, chunks=(50, -1))  # blocks 50, 50, 30: (2, 2) is an edge block
    store = Location(str(tmp_path / "kernel.zarr"))
    build_kernel_store(Xd, RBFKernel(0.1), "float64", store, input_fingerprint="fp")
    reader = KernelBlockReader(store.url)
    np.testing.assert_allclose(
        reader(0, 1), RBFKernel(0.1)(X[:50], X[50:100], np.float64), rtol=1e-12
    )
    root = store.local_path
    i, j = {"whole": (0, 1), "edge": (1, 2), "marker": (0, 0)}[which]
    victim = (
        (root / "done" / "c" / str(i) / str(j))
        if which == "marker"
        else (root / "K" / "c" / str(i) / str(j))
    )
    assert victim.exists()
    victim.unlink()
    with pytest.raises(
        KernelStoreError, match=rf"kernel block \({i}, {j}\).*re-run the kernel"
    ):
        KernelBlockReader(store.url)(i, j)
