"""pipeline.runtime.liveness.activity from several threads: each leaves only its own label, in
any order (two transforms at once used to leave a finished label behind)."""

from __future__ import annotations

import threading

from pipeline.runtime.liveness import activity, current_activity


def test_overlapping_activities_leave_nothing_behind():
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with activity("transform a"):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with activity("transform b"):
            b_in.set()
            a_out.wait(10)  # a leaves first, while b is still inside
            seen["inside b after a left"] = current_activity()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"inside b after a left": "transform b"}
    assert current_activity() is None


def test_nested_activities_name_the_innermost_then_the_outer():
    with activity("stage 'solve'"):
        with activity("visibility probe"):
            assert current_activity() == "visibility probe"
        assert current_activity() == "stage 'solve'"
    assert current_activity() is None
