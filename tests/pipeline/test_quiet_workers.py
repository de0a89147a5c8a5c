"""What a local cluster's workers may print on the user's terminal: the records the
pipeline's worker plugin drops (pipeline.runtime.cluster.QuietTaskErrors), checked on the
records
distributed itself emits, in real worker processes."""

from __future__ import annotations

import logging

import pytest

from pipeline.runtime.cluster import QuietTaskErrors

pytestmark = pytest.mark.distributed


def _emit_in_worker():
    """Log, in a worker process, what distributed logs when a task is cancelled while the
    cluster closes (the text of distributed.worker_state_machine), another warning of the
    same logger, and a task's failure dump; the records that pass the filters."""
    passed: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            passed.append(record.getMessage())

    h = Keep()  # where distributed's own terminal handler is: the "distributed" logger
    logging.getLogger("distributed").addHandler(h)
    try:
        sm = logging.getLogger("distributed.worker.state_machine")
        sm.warning(
            "Async instruction for <Task cancelled name='execute(x)'> ended with CancelledError"
        )
        sm.warning("Async instruction for <Task finished name='gather_dep'> ended with OSError")
        logging.getLogger("distributed.worker").warning("Compute Failed\nKey: x")
    finally:
        logging.getLogger("distributed").removeHandler(h)
    return passed


def test_cancelled_tasks_at_shutdown_and_task_dumps_stay_off_the_terminal(dask_client):
    before = dask_client.run(_emit_in_worker)
    assert all(len(v) == 3 for v in before.values()), before  # the control: all pass
    dask_client.register_plugin(QuietTaskErrors())
    try:
        after = dask_client.run(_emit_in_worker)
    finally:
        dask_client.unregister_worker_plugin(QuietTaskErrors.name)
    for passed in after.values():
        assert passed == [
            "Async instruction for <Task finished name='gather_dep'> ended with OSError"
        ]
