"""scikit-learn's estimator checks (``parametrize_with_checks``) on our KernelPCA (issue 13).

Two estimators: the default one and ``kernel="precomputed"`` (scikit-learn then
passes kernel matrices, through the ``pairwise`` tag). Every check passes for
both; the only one not run is ``check_array_api_input``, which scikit-learn
skips unless ``SCIPY_ARRAY_API=1`` (the estimator does not support the array
API: it computes with numpy and dask). A check listed in EXPECTED_FAILED would
be run as an expected failure with its reason (docs/sklearn.md).
"""

from __future__ import annotations

import warnings

import pytest
from sklearn.utils.estimator_checks import check_estimator, parametrize_with_checks

from kpca_dask import KernelPCA
from kpca_dask.exceptions import KpcaWarning

ESTIMATORS = [KernelPCA(), KernelPCA(kernel="precomputed")]

#: check name -> reason, per estimator (none today).
EXPECTED_FAILED: dict[str, str] = {}

#: The issue's bar: at least 44 of scikit-learn's checks pass on KernelPCA().
MIN_PASSED = 44


def _expected(estimator):
    return EXPECTED_FAILED


@pytest.fixture(autouse=True)
def _kpca_warnings_are_not_errors():
    # the checks fit deliberately odd data (e.g. rank-deficient); our warnings about
    # it are not the subject here (the suite's config turns them into errors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KpcaWarning)
        yield


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=["default", "precomputed"])
def test_at_least_44_checks_pass(estimator):
    results = check_estimator(estimator, on_fail=None, on_skip=None)
    passed = [r["check_name"] for r in results if r["status"] == "passed"]
    others = {r["check_name"]: r["status"] for r in results if r["status"] != "passed"}
    assert len(passed) >= MIN_PASSED, others
    # the only check not passed is the array-API one, skipped without SCIPY_ARRAY_API
    assert set(others) <= {"check_array_api_input"}, others
