"""Bad input fails fast: one line naming the problem and the fix, exit status 2 from the
CLI, and nothing published -- for every case of the catalogue (tests/reliability/catalogue.py),
whose messages docs/failures.md tables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .catalogue import BY_KEY, CASES, Ctx, documented_messages, normalise, run_case
from .helpers import ROOT, make_published_run

DOC = ROOT / "docs" / "failures.md"


@pytest.fixture(scope="module")
def published(tmp_path_factory, dask_cluster):
    from distributed import Client

    with Client(dask_cluster):
        return make_published_run(tmp_path_factory.mktemp("published"))


def test_catalogue_is_the_documented_table():
    """Every case has its own key and a row in docs/failures.md, every row a case, and the
    cases span the estimator, the config, the input and the transform (a case dropped from
    the catalogue, or a row left behind in the docs, fails here)."""
    documented = set(documented_messages(DOC.read_text()))
    assert len(BY_KEY) == len(CASES)
    assert documented == set(BY_KEY), (
        f"only in docs/failures.md: {sorted(documented - set(BY_KEY))}; "
        f"only in the catalogue: {sorted(set(BY_KEY) - documented)}"
    )
    assert {"estimator", "config", "input", "transform"} <= {c.layer for c in CASES}


@pytest.mark.parametrize("key", [c.key for c in CASES])
def test_bad_input_is_refused_in_one_line(key, tmp_path, dask_cluster, published):
    case = BY_KEY[key]
    if case.needs_root and os.geteuid() != 0:  # pragma: no cover - this machine has root
        pytest.skip("mounting a tmpfs needs root; out-fsize covers a full disk without it")
    ctx = Ctx(tmp_path / key, dask_cluster.scheduler_address, Path(published))
    outcome = run_case(case, ctx)
    msg = normalise(outcome.message, ctx)
    missing = [f for f in case.expect if f not in msg]
    assert not missing, f"{key}: {missing} not in {msg!r} ({outcome.status})"
    if case.check is not None:
        case.check(outcome.message)  # numbers as bounds (their digits depend on the CPU)
    assert not outcome.extra_lines, outcome.extra_lines  # one line, no traceback
    if case.layer == "estimator":
        assert isinstance(outcome.error, ValueError), outcome.status
    else:
        assert outcome.status == "exit 2"
    assert not outcome.published
    assert documented_messages(DOC.read_text()).get(key) == msg, (
        f"docs/failures.md is stale for {key}: regenerate it with "
        "`python -m tests.reliability.catalogue > docs/failures.md`"
    )
