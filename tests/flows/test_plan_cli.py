"""`kpca plan` and `kpca calibrate` through the CLI (in-process main, real files)."""

import json

import numpy as np
import pytest

from flows.cli import main


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


@pytest.mark.distributed
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
