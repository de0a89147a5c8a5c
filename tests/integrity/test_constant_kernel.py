"""A constant centred kernel gives one message, whichever code path notices it.

Constant rows make the centred kernel matrix zero -- exactly (the solver finds no positive
eigenvalue: kpca_dask's ConstantKernelError) or to rounding (eigenvalues that are noise:
``check_fit``). Which of the two happens depends on the CPU's floating-point kernels (AVX2
vs AVX-512), so the pipeline must say the same thing on both.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from kpca_dask.exceptions import ConstantKernelError
from pipeline.config import load_config
from pipeline.model.solve import CONSTANT_KERNEL, SolveError, solve
from pipeline.output.store import Location

DATA = {
    "zeros": np.zeros((120, 4)),  # kernel exactly constant: centred exactly 0
    "threes": np.full((120, 4), 3.0),  # ||x||^2 + ||y||^2 - 2 x.y: rounding noise
    "tiny-noise": 3.0 + 1e-12 * np.random.default_rng(0).standard_normal((120, 4)),
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("solver", ["dense", "randomized", "nystroem"])
@pytest.mark.parametrize("data", sorted(DATA))
def test_constant_kernel_one_message_on_every_path(data, solver, dtype, tmp_path):
    cfg = load_config(
        {
            "input": {"path": "unused.npy"},
            # the raw rows: standard scaling would blow 1e-12 noise up to unit variance
            "preprocess": {"scale": "none"},
            "kernel": {"name": "rbf", "gamma": 0.1},
            "solver": {"n_components": 3, "eigen_solver": solver, "dtype": dtype},
        }
    )
    X = da.from_array(DATA[data], chunks=(40, -1))
    model = tmp_path / "model"
    with pytest.raises(SolveError) as err:
        solve(X, cfg, Location(str(model)), block_rows=40)
    assert str(err.value) == CONSTANT_KERNEL
    assert not model.exists()  # nothing saved


def test_estimator_raises_the_specific_class():
    """An exactly constant kernel: the estimator's error is a ConstantKernelError, still a
    ValueError for code written against scikit-learn."""
    from kpca_dask import KernelPCA

    with pytest.raises(ConstantKernelError, match="no positive eigenvalue") as err:
        KernelPCA(2, kernel="rbf", gamma=0.5).fit(np.ones((50, 3)))
    assert isinstance(err.value, ValueError)
