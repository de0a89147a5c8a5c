"""The deployment's entry point ``kpca_update_from`` on a series (issue 37): the nights of a
date template through real Prefect flow runs, each batch a new version of the one output.

Real components: a Prefect test server, the session's Dask cluster, files in tmp folders.
"""

from __future__ import annotations

import json

import pytest

from pipeline.config import load_config
from pipeline.output.export import open_run
from pipeline.runner.run import run_pipeline

from ..pipeline.test_series_output import _config, _table, plain_read
from .test_flows import prefect_api  # noqa: F401 - the session's Prefect server

pytestmark = [pytest.mark.flows, pytest.mark.cluster, pytest.mark.slow]


def test_nights_through_the_flow(prefect_api, tmp_path, dask_cluster):  # noqa: F811
    from flows.update_flow import kpca_update_from

    cfg = _config(tmp_path, tmp_path / "features")
    cfg["cluster"] = {"address": dask_cluster.scheduler_address}
    _table(tmp_path / "x.parquet", 600, 0, 0)
    run_pipeline(load_config(cfg))
    out = tmp_path / "features"
    tpl = str(tmp_path / "in" / "{date:%Y-%m-%d}" / "*.parquet")
    _table(tmp_path / "in" / "2026-11-25" / "a.parquet", 100, 1, 1000)
    _table(tmp_path / "in" / "2026-11-25" / "b.parquet", 100, 2, 2000)

    res = kpca_update_from(run=str(out), new_data=tpl, logical_date="2026-11-25")
    assert [p.rsplit("/", 1)[1] for p, _ in res["merged"]] == ["a.parquet", "b.parquet"]
    pointer = json.loads((out / "manifest.json").read_text())
    assert pointer["version"] == res["merged"][-1][1] == res["version"]
    # the same night again (a retry, a late run): nothing new, nothing published
    again = kpca_update_from(run=str(out), new_data=tpl, logical_date="2026-11-25")
    assert not again["merged"] and len(again["skipped"]) == 2
    assert json.loads((out / "manifest.json").read_text()) == pointer
    # a night with no batch
    none = kpca_update_from(run=str(out), new_data=tpl, logical_date="2026-11-26")
    assert not none["merged"] and not none["skipped"]
    # a bad batch (ids the series has): the flow run fails naming it, nothing published
    _table(tmp_path / "in" / "2026-11-27" / "a.parquet", 50, 3, 1000)
    state = kpca_update_from(
        run=str(out), new_data=tpl, logical_date="2026-11-27", return_state=True
    )
    assert state.is_failed()
    assert "already in the series" in str(state.message) or state.is_failed()
    assert json.loads((out / "manifest.json").read_text()) == pointer
    assert open_run(out).manifest["update"]["n_rows"] == 800
    assert plain_read(out)["id"].is_unique
