"""The Prefect flows keep the same promises as the plain stages: a failed flow run leaves
the previous published run as it was, and the transform flow refuses an unsafe output before
it starts a cluster."""

from __future__ import annotations

import logging

import pytest

from pipeline.output.export import verify_run
from tests.flows.test_flows import prefect_api  # noqa: F401  (the session's Prefect API)
from tests.reliability.helpers import small_config

from .conftest import tree_hashes

pytestmark = pytest.mark.flows


def test_a_failed_flow_run_leaves_the_previous_run_published(world, dask_cluster, prefect_api):  # noqa: F811
    """The flow writes a new version (its first writing task withdraws the manifest of
    that version, claim_output); the solve then fails: nothing was published, the
    previous run is published as it was, byte for byte, and the failed version is gone."""
    from flows.pipeline_flow import kpca_pipeline

    run_before = {k: v for k, v in tree_hashes(world.run).items() if "/work" not in k}
    before = world.user_files()
    cfg = small_config(
        world.data,
        world.run,
        output={"overwrite": True},
        solver={"n_components": 400},
        cluster={"address": dask_cluster.scheduler_address},
    )
    # the run wrote (and then dropped) a version of its own: the record of the
    # "pipeline" logger says so (a handler of our own: other tests and Prefect
    # reconfigure the console and propagation, so neither capfd nor caplog is reliable)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("pipeline")
    log.addHandler(handler)
    try:
        with pytest.raises(ValueError, match="exceeds"):
            kpca_pipeline(cfg)
    finally:
        log.removeHandler(handler)
    assert any("nothing was published" in r.getMessage() for r in records), [
        r.getMessage() for r in records
    ]
    after = {k: v for k, v in tree_hashes(world.run).items() if "/work" not in k}
    assert after == run_before
    verify_run(world.run)
    assert world.user_files() == before


@pytest.mark.parametrize("output", ["", "."])
def test_the_transform_flow_refuses_an_empty_or_dot_output(
    world, dask_cluster, prefect_api, output
):  # noqa: F811
    from flows.transform_flow import kpca_transform

    before = world.user_files()
    with pytest.raises(ValueError, match="names no new folder"):
        kpca_transform(
            model=str(world.run),
            input={"path": str(world.new)},
            output=output,
            cluster={"address": dask_cluster.scheduler_address},
            overwrite=True,
        )
    assert world.user_files() == before
