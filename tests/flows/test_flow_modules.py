"""The Prefect flow modules, in process (the fast loop's share of flows/): every
deployment entrypoint in deploy/prefect.yaml names a flow these modules define, and the
flows publish under the names the deployments and the run records use."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml
from prefect import Flow

ROOT = Path(__file__).resolve().parents[2]


def test_every_deployment_entrypoint_is_a_flow_of_ours():
    deployments = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())["deployments"]
    assert deployments
    for d in deployments:
        module, _, name = d["entrypoint"].rpartition(".")
        obj = getattr(importlib.import_module(module), name)
        assert isinstance(obj, Flow), d["entrypoint"]


def test_the_flows_are_named_as_their_runs_are_recorded():
    from flows.pipeline_flow import kpca_pipeline
    from flows.transform_flow import kpca_transform
    from flows.update_flow import kpca_update, kpca_update_from

    names = {f.name for f in (kpca_pipeline, kpca_transform, kpca_update, kpca_update_from)}
    assert len(names) == 4 and all(n.startswith("kpca") for n in names)


def test_artifact_links_are_file_uris_locally_and_the_url_on_a_store(tmp_path):
    from flows.artifacts import location_link

    assert location_link(str(tmp_path)) == tmp_path.resolve().as_uri()
    assert location_link("s3://bucket/runs/v1") == "s3://bucket/runs/v1"
