"""The visibility probe on a local cluster (workers share this machine's disk): it passes,
costs little, leaves nothing behind, and its refusal is one line naming what to fix.
The refusals themselves are shown with workers that cannot see the client's folder in
tests/objectstore/test_isolated_workers.py."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from pipeline.errors import UserError
from pipeline.output.store import Location
from pipeline.runtime.visibility import (
    PROBE_PREFIX,
    ProbeTarget,
    VisibilityError,
    _message,
    check_locations,
    check_visibility,
    signature,
)
from tests.reliability.helpers import small_config

pytestmark = pytest.mark.distributed


def _tree(root) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, dirs, files in os.walk(root)
        for f in dirs + files
    )


def test_probe_passes_on_a_local_cluster_and_leaves_nothing(dask_client, tmp_path):
    """Input read, a new nested output written and read back by both workers; afterwards
    the folder holds exactly what it held (the probe's files and folders are gone)."""
    np.save(tmp_path / "x.npy", np.arange(12.0).reshape(4, 3))
    before = _tree(tmp_path)
    targets = [
        ProbeTarget("input", str(tmp_path / "x.npy"), {}, False),
        ProbeTarget("output", str(tmp_path / "a" / "b" / "out"), {}, True),
        ProbeTarget("work folder", str(tmp_path / "a" / "b" / "out" / "work"), {}, True),
    ]
    for _ in range(3):
        got = check_locations(targets, dask_client)
        assert got["workers"] == 2 and got["targets"] == ["input", "output", "work folder"]
        assert got["ms"] < 10_000  # a bound, not a timing claim: see the log line
    assert _tree(tmp_path) == before


def test_probe_keeps_an_existing_output_as_it_was(dask_client, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    check_locations([ProbeTarget("output", str(out), {}, True)], dask_client)
    assert _tree(tmp_path) == ["out", "out/notes.txt"]
    assert not any(n.startswith(PROBE_PREFIX) for n in os.listdir(out))


def test_run_config_probe_names_input_output_and_work(dask_client, tmp_path, caplog):
    np.save(tmp_path / "x.npy", np.ones((10, 2)))
    cfg = small_config(tmp_path, tmp_path / "out")
    with caplog.at_level(logging.INFO, logger="pipeline"):
        check_visibility(cfg, dask_client)
    assert "visibility probe: input, output, work folder seen by all 2 workers" in caplog.text
    assert not (tmp_path / "out").exists()


def test_without_a_cluster_the_probe_says_there_is_nothing_to_probe(tmp_path, caplog):
    from distributed import default_client

    with pytest.raises(ValueError):
        default_client()  # no distributed client in this test
    with caplog.at_level(logging.INFO, logger="pipeline"):
        assert check_locations([ProbeTarget("output", str(tmp_path), {}, True)]) is None
    assert "no Dask cluster" in caplog.text and os.listdir(tmp_path) == []


def test_signature_tells_missing_files_folders_and_content_apart(tmp_path):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.zeros(4))
    np.save(b, np.ones(4))  # same size, other bytes
    assert signature(Location(str(tmp_path / "nope"))) == "missing"
    assert signature(Location(str(a))) != signature(Location(str(b)))
    assert signature(Location(str(a))) == signature(Location(str(a)))
    folder = signature(Location(str(tmp_path)))
    (tmp_path / "c.txt").write_text("x")
    assert folder.startswith("folder:") and signature(Location(str(tmp_path))) != folder


def test_refusal_is_one_line_naming_location_workers_and_fix():
    targets = [
        ProbeTarget("input", "/data/x.csv", {}, False),
        ProbeTarget("output", "/data/out", {}, True),
        ProbeTarget("work folder", "/data/out/work", {}, True),
    ]
    workers = [f"tcp://10.0.0.{i}:4000" for i in range(6)]
    msg = _message(
        targets,
        {
            "input": {"missing": workers},
            "output": {"missing": workers[:2]},
            "work folder": {"missing": workers[:2]},
        },
        {},
        6,
    )
    assert "\n" not in msg
    assert msg.startswith("the Dask workers cannot see the run's input and output:")
    assert "input /data/x.csv (6 of 6 workers: " in msg and "and 2 more" in msg
    assert "output /data/out (2 of 6 workers: tcp://10.0.0.0:4000, tcp://10.0.0.1:4000:" in msg
    assert "/data/out/work" not in msg  # inside the output: nothing new to say
    assert "shared filesystem" in msg and "object store URL" in msg
    assert issubclass(VisibilityError, UserError)
