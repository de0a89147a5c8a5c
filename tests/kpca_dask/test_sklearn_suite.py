"""scikit-learn's own KernelPCA tests, run against ours (issue 13).

The test file shipped inside the installed scikit-learn
(``sklearn/decomposition/tests/test_kernel_pca.py``) is copied to a temporary
folder with only its ``KernelPCA`` import swapped for ``kpca_dask.KernelPCA``
(PCA and every other helper stay scikit-learn's), and run with pytest in a
subprocess (~30-90 s). Every test that fails must be listed below with the
reason; docs/sklearn.md gives the same list.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import sklearn

ORIGINAL_IMPORT = "from sklearn.decomposition import PCA, KernelPCA"
SWAPPED_IMPORT = "from sklearn.decomposition import PCA\nfrom kpca_dask import KernelPCA"

#: Deliberate differences (docs/sklearn.md, "scikit-learn's own tests").
DELIBERATE = {
    "test_remove_zero_eig": "constant data in feature space (every row identical) is refused "
    "with an error naming the problem; scikit-learn returns an empty (n, 0) embedding",
    "test_precomputed_kernel_not_psd[randomized]": "our randomized solver returns the largest "
    "eigenvalues by value (52.7, 7.65: both positive, the right answer); scikit-learn's "
    "picks them by modulus, so the test expects its error",
}

#: Failures another part of issue 13 fixes, listed with their reason until it is merged
#: (the randomized solver on numerically low-rank kernels, branch solver-trust: merged;
#: measured on main + this branch: 37 of 39 pass, the two above fail).
PENDING: dict[str, str] = {}

#: Tests in scikit-learn's file (1.9.x); at least 36 must pass (issue 13): here 37.
N_TESTS = 39
MIN_PASSED = N_TESTS - len(DELIBERATE) - len(PENDING)


def sklearn_test_file() -> Path:
    return Path(sklearn.__file__).parent / "decomposition" / "tests" / "test_kernel_pca.py"


def swapped_source() -> str:
    text = sklearn_test_file().read_text()
    assert text.count(ORIGINAL_IMPORT) == 1, (
        f"scikit-learn {sklearn.__version__}'s test file no longer has the line "
        f"{ORIGINAL_IMPORT!r}: update the swap in {__file__}"
    )
    return text.replace(ORIGINAL_IMPORT, SWAPPED_IMPORT)


def run_suite(folder: Path) -> dict[str, str]:
    """Run the swapped file in ``folder``; returns {test id: outcome}."""
    (folder / "test_kernel_pca_kpca.py").write_text(swapped_source())
    # scikit-learn's conftest provides this fixture (its default seed is 42)
    (folder / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef global_random_seed():\n    return 42\n"
    )
    (folder / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    report = folder / "report.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(folder / "pytest.ini"),
            "--rootdir",
            str(folder),
            f"--junitxml={report}",
            str(folder / "test_kernel_pca_kpca.py"),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = (
            "failed"
            if kinds & {"failure", "error"}
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
        outcomes[case.get("name")] = outcome
    return outcomes


def test_kernel_pca_import_is_the_only_change():
    original = sklearn_test_file().read_text()
    swapped = swapped_source()
    assert swapped.replace(SWAPPED_IMPORT, ORIGINAL_IMPORT) == original
    assert "from kpca_dask import KernelPCA" in swapped


@pytest.mark.cluster  # a fresh Python process
def test_sklearn_own_kernel_pca_tests_pass_against_ours(tmp_path):
    outcomes = run_suite(tmp_path)
    failed = sorted(t for t, o in outcomes.items() if o == "failed")
    passed = [t for t, o in outcomes.items() if o == "passed"]
    known = set(DELIBERATE) | set(PENDING)
    unexpected = [t for t in failed if t not in known]
    assert not unexpected, f"failures not listed with a reason: {unexpected}"
    assert set(DELIBERATE) <= set(failed), (
        f"listed as deliberate differences but passing now (update the list and "
        f"docs/sklearn.md): {sorted(set(DELIBERATE) - set(failed))}"
    )
    assert len(outcomes) >= N_TESTS
    assert len(passed) >= MIN_PASSED, f"{len(passed)} of {len(outcomes)} passed: {failed}"
