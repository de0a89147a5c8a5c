"""The ``kpca`` command's exit status and message follow the error taxonomy
(pipeline/errors.py): a user error is one line and status 2, a transient failure one line
and status 1, and an unexpected exception -- a bug -- keeps its traceback, status 70."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flows.cli import EXIT_BUG, EXIT_FAILED, EXIT_USAGE
from flows.cli import report_error as _report_error
from pipeline.config import ConfigError
from pipeline.errors import TransientError

ROOT = Path(__file__).resolve().parents[2]


def _raised(exc: Exception) -> Exception:
    """``exc`` with the traceback of a real raise, as the CLI receives it."""
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - that is the point
        return caught


def test_a_bug_keeps_its_traceback_and_its_own_status(capsys):
    def buggy():
        return {"a": 1}["b"]  # a KeyError: nothing the user did

    with pytest.raises(KeyError) as info:
        buggy()
    assert _report_error("run", info.value) == EXIT_BUG == 70
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "in buggy" in err and "KeyError: 'b'" in err
    assert (
        err.rstrip().splitlines()[-1].startswith("kpca run: internal error (KeyError): a bug")
    )


def test_a_bare_value_error_is_a_bug_not_a_user_error(capsys):
    """Before the taxonomy every ValueError became a one-line exit 2, bugs included."""
    assert _report_error("transform", _raised(ValueError("cannot convert NaN"))) == EXIT_BUG
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: cannot convert NaN" in err


def test_a_user_error_is_one_line_and_status_2(capsys):
    exc = _raised(ConfigError("invalid configuration in run.yaml: kernel.gamma: must be > 0"))
    assert _report_error("run", exc) == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert (
        err == "kpca run: error: invalid configuration in run.yaml: kernel.gamma: must be > 0\n"
    )


def test_a_missing_file_is_a_user_error(capsys):
    exc = _raised(FileNotFoundError(errno.ENOENT, "No such file or directory", "in.csv"))
    assert _report_error("run", exc) == EXIT_USAGE
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError("Connection reset by peer"),
        TransientError("object store answered 503"),
    ],
)
def test_a_transient_failure_is_one_line_and_status_1(capsys, exc):
    assert _report_error("run", _raised(exc)) == EXIT_FAILED == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "re-run the same command to resume" in err


def test_a_full_disk_names_the_fix(capsys):
    exc = _raised(OSError(errno.ENOSPC, "No space left on device", "/out/embedding/c/0"))
    assert _report_error("run", exc) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "out of disk space writing /out/embedding/c/0" in err and "Traceback" not in err


@pytest.mark.cluster  # a kpca command or a Prefect run
def test_the_command_line_refuses_bad_arguments_in_one_line(tmp_path):
    """A real process: ``--chunk-mb inf`` reached the reader and failed there with a bare
    ValueError (it now fails validation: a user error, status 2, no traceback)."""
    import kpca_dask

    X = np.random.default_rng(0).standard_normal((40, 3))
    np.save(tmp_path / "in.npy", X)
    kpca_dask.KernelPCA(n_components=2).fit(X).save(tmp_path / "model")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "transform",
            tmp_path / "model",
            tmp_path / "in.npy",
            tmp_path / "out.zarr",
            "--chunk-mb",
            "inf",
            "--no-progress",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[-1] == (
        "kpca transform: error: invalid configuration in the command-line arguments: "
        "target_chunk_mb: Input should be a finite number"
    )
    assert not (tmp_path / "out.zarr").exists()
