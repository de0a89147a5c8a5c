"""The issue-17 profiling scripts run against the library as it is (they hook its
internal functions from outside, so a rename must fail here, not in a benchmark run)
and their accounting adds up."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kpca_dask.solvers import randomized_eigh

pytestmark = pytest.mark.cluster  # its tests start processes

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


def test_profile_headline_accounts_for_every_pass(tmp_path):
    out = tmp_path / "profile.json"
    _run("profile_headline.py", "--n", "2500", "--kernel-cache", "memory", "--out", str(out))
    r = json.loads(out.read_text())
    rows = r["per_pass"]
    assert len(rows) == r["passes"] >= 3
    assert r["converged"] and r["kernel_cache"]["tier"] == "memory"
    first, later = rows[0], rows[1:]
    # the cache is filled (kernel evaluated) in the first pass only, read afterwards
    assert first["cache_fill_cs"] > 0 and first["kernel_eval_cs"] > 0
    assert all(p["kernel_eval_cs"] == 0 and p["cache_fill_cs"] == 0 for p in later)
    assert all(p["product_cs"] > 0 and p["wall"] > 0 for p in rows)
    assert rows[-1]["columns"] == 16  # the certification pass multiplies the returned vectors
    # the driver's algebra runs after every iteration pass, not after the certification
    assert all(p["driver_next_block"] > 0 for p in rows[:-2])
    assert r["totals"]["wall"] + r["totals"]["driver"] < r["fit_seconds"]


# moved out of the default run (its 20-minute budget, 2026-11-28): ~11 s;
# test_profile_headline_accounts_for_every_pass stays
@pytest.mark.slow
def test_solver_passes_counts_columns_and_traces_the_certificate(tmp_path):
    out = tmp_path / "passes.json"
    _run(
        "bench_solver_passes.py",
        "--n",
        "1200",
        "--oversamples",
        "24",
        "--tail-tols",
        "0.05",
        "--out",
        str(out),
    )
    runs = json.loads(out.read_text())["runs"]
    default, loose = runs
    # the tail-level run uses the solver's default block
    default_over = inspect.signature(randomized_eigh).parameters["n_oversamples"].default
    for r, over in zip(runs, (24, default_over)):
        assert r["converged"]
        # every iteration pass is traced; the certification pass adds 16 columns
        assert len(r["per_pass"]) == r["passes"]
        assert r["product_columns"] == (16 + over) * (r["passes"] - 1) + 16
        assert r["error_gapped"] < 1e-10
    # a looser tail level stops no later, and its tail is no more accurate
    assert loose["passes"] <= default["passes"]
    assert loose["error_tail"] >= default["error_tail"] * 0.999
    assert default["per_pass"][-1]["bound_tail"] <= 0.01


# moved out of the default run (its 20-minute budget, 2026-11-28): ~11 s;
# test_profile_headline_accounts_for_every_pass stays
@pytest.mark.slow
def test_bench_warm_refit_runs_and_reports_certified_fits(tmp_path):
    out = tmp_path / "warm.json"
    _run(
        "bench_warm_refit.py",
        *("--n", "1500", "--fractions", "0.01", "--data", "clustered", "--out", str(out)),
    )
    (row,) = json.loads(out.read_text())["rows"]
    assert row["certified"] and row["batch"] == 15
    assert 2 <= row["warm_passes"] <= row["cold_passes"]
    assert row["gapped_diff"] < 1e-8 and row["tail_diff"] < 2e-2


# moved out of the default run (its 20-minute budget, 2026-11-28): ~11 s;
# test_profile_headline_accounts_for_every_pass stays
@pytest.mark.slow
def test_bench_stored_products_compares_the_same_products(tmp_path):
    """The strip-wise stored products and the whole-block GEMMs it is timed against give
    the same partial products (to float32 summation order) in a tiny run."""
    out = tmp_path / "stored.json"
    _run(
        "bench_stored_products.py",
        *("--blocks", "3", "--block-rows", "1200", "--repeat", "1", "--out", str(out)),
    )
    r = json.loads(out.read_text())
    assert r["n"] == 3600 and r["dtype"] == "float32"
    assert r["max_relative_difference"] < 1e-5
    assert all(len(v) == 1 and v[0] > 0 for v in r["pass_seconds"].values())


@pytest.mark.slow  # ~23 s: repeated fits
def test_bench_headline_reports_the_median_of_repeated_fits(tmp_path):
    """--repeat: every fit is kept, the row is the median-time fit, and the ratio is
    between the medians; accuracy is checked for every fit against its round's
    scikit-learn (a tiny clustered run)."""
    out = tmp_path / "headline.json"
    _run(
        "bench_headline.py",
        *("--n", "2500", "--data", "clustered", "--loads", "quiet", "--cache-n"),
        *("--variants", "ours-float64", "sklearn-randomized", "--repeat", "3"),
        *("--out", str(out)),
    )
    r = json.loads(out.read_text())["headline"]["clustered-quiet"]["rows"]
    ours, sk = r["ours-float64"], r["sklearn-randomized"]
    assert len(ours["runs_seconds"]) == len(sk["runs_seconds"]) == 3
    assert ours["seconds"] == sorted(ours["runs_seconds"])[1]
    assert abs(ours["speedup_vs_sklearn"] - sk["seconds"] / ours["seconds"]) < 1e-12
    assert all(p >= 2 for p in ours["runs_passes"]) and ours["every_run_as_accurate"]


def test_result_files_are_never_overwritten(tmp_path):
    """Benchmarks name their default result files by date; a second run the same day
    gets ``-2``, ``-3``, ... instead of replacing a file the README may cite."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _results import fresh
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    first = tmp_path / "results" / "headline-2026-11-24.json"
    assert fresh(first) == first and first.parent.is_dir()
    first.write_text("{}")
    second = fresh(first)
    assert second.name == "headline-2026-11-24-2.json"
    second.write_text("{}")
    assert fresh(first).name == "headline-2026-11-24-3.json"
    assert first.read_text() == "{}"
