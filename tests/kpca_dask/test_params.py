"""kpca_dask/params.py: one parameter's check gives the same verdict and words as the
estimator's whole check, and the module is light (no dask) for the pipeline's config."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kpca_dask import InvalidParameterError, KernelPCA
from kpca_dask.params import PARAM_RULES, check_param, check_params

BAD_OR_GOOD = [0, -1, 2, 0.5, -0.5, float("inf"), "auto", "scale", "nope", None, True, {}]


@pytest.mark.parametrize("name", sorted(PARAM_RULES) + ["dtype"])
def test_one_parameter_is_judged_as_the_whole_check_judges_it(name):
    defaults = KernelPCA().get_params()
    for value in BAD_OR_GOOD:
        try:
            check_params({**defaults, name: value})
            whole = None
        except InvalidParameterError as exc:
            whole = str(exc)
        try:
            check_param(name, value)
            one = None
        except InvalidParameterError as exc:
            one = str(exc)
        if whole is None or "parameter of KernelPCA" in whole:
            assert one == whole, (name, value)
        else:  # a combination the whole check refuses (kernel_params with a named kernel)
            assert name == "kernel_params" and one is None, (name, value, whole)


@pytest.mark.cluster  # a fresh Python process
def test_the_parameter_rules_load_no_dask():
    code = (
        "import sys, kpca_dask.params; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'dask', 'zarr', 'scipy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
