"""How `kpca calibrate --store` combines its tiny runs into each stage's fixed part (the
runs themselves, on the S3 server: tests/objectstore/test_plan_remote.py)."""

import pytest

from pipeline.runtime.stage_calibration import measure_stage_seconds, median_stages


def test_each_stage_is_the_median_of_the_runs_so_one_slow_run_does_not_set_it():
    runs = [
        {"ingest": 1.57, "split": 0.35, "embed": 2.18},
        {"ingest": 0.83, "split": 0.24, "embed": 1.95},
        {"ingest": 1.11, "split": 0.23, "embed": 9.0},  # one run's embed stalled
    ]
    assert median_stages(runs) == {"ingest": 1.11, "split": 0.24, "embed": 2.18}
    assert median_stages(runs[:2])["ingest"] == pytest.approx((1.57 + 0.83) / 2)


def test_a_stage_one_run_did_not_time_is_left_unpriced():
    assert median_stages([{"ingest": 1.0, "embed": 2.0}, {"ingest": 3.0}]) == {"ingest": 2.0}


@pytest.mark.parametrize("runs", [0, -1])
def test_no_runs_is_refused_before_anything_is_written(tmp_path, runs):
    with pytest.raises(ValueError, match="runs must be at least 1"):
        measure_stage_seconds(str(tmp_path), None, None, runs=runs)
    assert list(tmp_path.iterdir()) == []
