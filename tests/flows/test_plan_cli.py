"""`kpca plan` and `kpca calibrate` through the CLI (in-process main, real files)."""

import json

import numpy as np
import pytest

from flows.cli import main
from kpca_dask.cost import Machine


def _config(tmp_path, data, solver="randomized"):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"input: {{path: {data}}}\noutput: {{path: {tmp_path / 'out'}}}\n"
        f"solver: {{n_components: 16, eigen_solver: {solver}}}\n"
    )
    return str(cfg)


def test_plan_reads_the_input_shape_and_writes_nothing(tmp_path, capsys):
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((3000, 7)))
    cfg = _config(tmp_path, data)
    assert main(["plan", cfg, "--workers", "2", "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["n_rows"], out["n_features"]) == (3000, 7)
    assert out["fit"]["solver"] == "randomized" and out["fit"]["n_blocks"] >= 6
    assert out["seconds"] > 0 and out["fit"]["memory_client"] > 0
    assert not (tmp_path / "out").exists()


def test_plan_at_a_million_rows_keeps_tasks_in_the_low_thousands(tmp_path, capsys):
    cfg = _config(tmp_path, tmp_path / "absent.npy")
    args = ["plan", cfg, "--rows", "1000000", "--features", "64"]
    assert main([*args, "--workers", "128", "--threads", "1", "--network", "25", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]
    assert fit["block_tasks_per_pass"] <= 20_000
    assert fit["bound"] in ("compute", "client", "network", "scheduler", "memory bandwidth")
    assert main([*args, "--workers", "8", "--threads", "16"]) == 0
    text = capsys.readouterr().out
    assert "bound:" in text and "GB on the client" in text


def test_plan_without_a_readable_input_says_so(tmp_path, capsys):
    cfg = _config(tmp_path, tmp_path / "absent.npy")
    assert main(["plan", cfg]) == 2
    assert "--rows and --features" in capsys.readouterr().err


@pytest.mark.slow  # moved out of the default run (its 20-minute budget, 2026-11-28): ~25 s
@pytest.mark.distributed
@pytest.mark.cluster  # a kpca command or a Prefect run
def test_calibrate_writes_what_plan_reads(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--quick", "--output", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["task_seconds"] > 0 and m["gemm_flops"]["float64"] > 0
    assert "wrote" in capsys.readouterr().out
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((3000, 7)))
    assert main(["plan", _config(tmp_path, data), "--calibration", str(out), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fit"]["machine"]["source"].startswith("kpca calibrate")
    assert m["zarr_write"] > 1e6 and m["zarr_read"] > 1e6  # measured, not the defaults'
    assert set(m["block_factors"]) == {"float32", "float64"}
    # measured since issue 38: the disk, Parquet's encoding, and the scheduler's time a
    # task in its own process beside the in-process LocalCluster's (kept as a record)
    defaults = Machine()
    assert m["storage"] != defaults.storage and m["parquet_write"] != defaults.parquet_write
    assert m["scheduler_in_client"]["task_seconds"] > 0
    assert m["task_seconds"] != m["scheduler_in_client"]["task_seconds"]


def _stages(tmp_path, capsys, extra: str, solver: str = "nystroem"):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"input: {{path: {tmp_path / 'absent.npy'}}}\noutput: {{path: {tmp_path / 'out'}}}\n"
        f"solver: {{n_components: 16, eigen_solver: {solver}{extra}}}\n"
    )
    args = ["plan", str(cfg), "--rows", "1000000", "--features", "64", "--json"]
    assert main([*args, "--workers", "2", "--threads", "1", "--memory", "8GiB"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_prices_the_nystroem_method_the_fit_will_use(tmp_path, capsys):
    """The pipeline keeps Nyström's statistics by default (for `kpca update`), which makes
    its solve one covariance pass: the plan prices that, not the randomized method."""
    kept = _stages(tmp_path, capsys, "")
    assert kept["fit"]["passes"] == 1
    assert any("covariance" in a for a in kept["fit"]["assumptions"])
    free = _stages(tmp_path, capsys, ", keep_statistics: auto")
    assert any("randomized" in a for a in free["fit"]["assumptions"])
    assert free["fit"]["passes"] > 1


def test_plan_stages_of_a_run(tmp_path, capsys):
    """The run's fixed start, ingest, the scaler's read (preprocess on), solve, embed;
    an exact model embeds its training rows from its vectors (no kernel evaluations)."""
    ny = _stages(tmp_path, capsys, "")
    assert list(ny["stages"]) == ["start", "ingest", "split", "solve", "embed"]
    assert ny["stages"]["start"] > 0 and ny["stages"]["split"] > 0
    assert ny["seconds"] == pytest.approx(sum(ny["stages"].values()))
    ex = _stages(tmp_path, capsys, "", solver="randomized")
    # a Nyström model evaluates every row against its landmarks; an exact one only
    # reads its rows and writes the embedding
    assert ex["stages"]["embed"] < ny["stages"]["embed"]


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--memory", "1e400GiB"),  # overflows to infinity: was a traceback and exit 70
        ("--memory", "0"),
        ("--memory", "-8GB"),
        ("--workers", "0"),
        ("--threads", "0"),
        ("--network", "-5"),
        ("--network", "inf"),
        ("--passes", "0"),
        ("--rows", "0"),
    ],
)
def test_plan_refuses_a_cluster_that_cannot_exist_in_one_line(tmp_path, capsys, flag, value):
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((300, 3)))
    with pytest.raises(SystemExit) as exit_:
        main(["plan", _config(tmp_path, data), f"{flag}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith(f"kpca plan: error: argument {flag}: '{value}' is not")


def test_plan_refuses_a_calibration_file_it_cannot_read_in_one_line(tmp_path, capsys):
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((300, 3)))
    bad = tmp_path / "cal.json"
    bad.write_text("not json")
    assert main(["plan", _config(tmp_path, data), "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kpca plan: error: --calibration {bad}")
