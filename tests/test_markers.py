"""The ``cluster`` marker's guard (tests/conftest.py): a test without the marker that
starts a process fails, naming the process; a library's cached system query does not."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

from .conftest import ProcessStarted


def test_an_unmarked_test_that_starts_python_fails():
    with pytest.raises(ProcessStarted, match="mark it `cluster`") as err:
        subprocess.run([sys.executable, "-c", "0"], check=True)
    assert sys.executable in str(err.value)


def test_an_unmarked_test_that_starts_a_multiprocessing_worker_fails():
    with pytest.raises(ProcessStarted, match="multiprocessing"):
        multiprocessing.get_context("spawn").Process(target=print).start()


def test_a_system_query_is_not_a_process_a_test_starts():
    assert subprocess.run(["uname", "-p"], capture_output=True, check=True).returncode == 0


@pytest.mark.cluster
def test_a_marked_test_may_start_processes():
    assert subprocess.run([sys.executable, "-c", "0"], check=True).returncode == 0
