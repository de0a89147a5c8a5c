"""Typed stage results (pipeline/stages/): descriptors carry locations with their storage
options, round-trip exactly through JSON, and stores are reopened with those options."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.config import ChunkConfig, InputConfig
from pipeline.data.ingest import IngestResult, ingest, load_ingested
from pipeline.output.store import Location

#: a harmless fsspec option (never credentials: the config refuses those)
OPTS = {"use_listings_cache": False}


def _via_json(d: dict) -> dict:
    return json.loads(json.dumps(d, sort_keys=True))


def test_location_round_trips_with_its_storage_options():
    loc = Location("memory://bucket/run", dict(OPTS))
    back = Location.from_dict(_via_json(loc.to_dict()))
    assert back.url == loc.url and back.storage_options == OPTS
    assert Location.from_dict({"url": "x"}).storage_options == {}


def test_ingest_descriptor_reopens_the_store_with_its_options(tmp_path):
    X = np.arange(40.0).reshape(20, 2)
    np.save(tmp_path / "x.npy", X)
    store = Location(f"memory://typed-{tmp_path.name}/work/ingest.zarr", dict(OPTS))
    res = ingest(InputConfig(path=str(tmp_path / "x.npy")), ChunkConfig(), store)
    d = res.to_dict()
    assert d["path"] == store.url and d["storage_options"] == OPTS
    back = IngestResult.from_dict(_via_json(d))
    assert back == res and back.to_dict() == d  # exact round trip
    assert back.store.storage_options == OPTS
    np.testing.assert_array_equal(load_ingested(back).X.compute(), X)
    # a re-ingest reuses the store and keeps its options; the store's own record has none
    again = ingest(InputConfig(path=str(tmp_path / "x.npy")), ChunkConfig(), store)
    assert again.reused and again.store.storage_options == OPTS
    stored = dict(store.open_group("r").attrs)["result"]
    assert stored["storage_options"] == {} and stored["path"] == ""


def test_ingest_result_is_frozen():
    res = IngestResult.from_dict(
        {
            "path": "p",
            "n_rows": 1,
            "n_features": 1,
            "columns": ["a"],
            "rows_per_chunk": 1,
            "fingerprint": "f",
        }
    )
    with pytest.raises(AttributeError):
        res.n_rows = 2  # type: ignore[misc]


# ------------------------------------------------------------- the registry's types
def test_the_registry_declares_result_types_and_resolves_input_types():
    from pipeline.runner.results import KernelResult, SolveResult, SplitResult
    from pipeline.stages import REGISTRY

    assert REGISTRY["ingest"].result_type is IngestResult
    assert dict(REGISTRY["solve"].input_types) == {
        "ing": IngestResult,
        "split": SplitResult,
        "kernel": KernelResult,
    }
    assert REGISTRY["kernel"].result_type is KernelResult
    assert REGISTRY["solve"].result_type is SolveResult


def test_a_real_run_passes_json_that_round_trips_to_the_typed_results(tmp_path):
    """The plain run over the registry: every typed stage's JSON result (with the flow's
    fingerprint keys added, too) converts to its type and back exactly; the kernel store
    and the model are the layout's locations."""
    import time

    from pipeline.output.layout import run_layout
    from pipeline.runner.run import run_lock, run_stages, stage_begin
    from pipeline.stages import REGISTRY

    from .test_stages import config

    cfg = config(tmp_path, kernel_store={"materialize": "always"})
    seen: dict[str, dict] = {}

    def call(stage, args):
        out = stage(cfg, **args)
        if stage.result_type is not None:
            for d in (out, stage.with_fingerprint(cfg, out)):
                as_json = _via_json(d)
                assert as_json == d  # plain JSON data already
                typed = stage.result_type.from_dict(as_json)
                assert typed.to_dict() == d
            seen[stage.result] = out
        return out

    with run_lock(cfg):
        stage_begin(cfg)
        results = run_stages(REGISTRY, call, timings={}, t_run=time.perf_counter())
    assert results["manifest"]["status"] == "complete"
    assert set(seen) == {"ing", "split", "kernel", "solved", "projected"}
    layout = run_layout(cfg)
    assert seen["kernel"]["materialized"] and seen["kernel"]["path"] == str(layout.kernel)
    assert seen["solved"]["path"] == str(layout.model)
    # the manifest records where the stores are, not how they were opened
    assert "storage_options" not in results["manifest"]["input"]
    assert "storage_options" not in results["manifest"]["model"]


def test_the_kernel_and_model_descriptors_reopen_with_their_options():
    from pipeline.runner.results import KernelResult, SolveResult

    k = KernelResult(
        materialized=True,
        reason="r",
        solver="dense",
        block_rows=8,
        store=Location("memory://bucket/run/work/kernel.zarr", dict(OPTS)),
        n=16,
        gamma=0.5,
    )
    back = KernelResult.from_dict(_via_json(k.to_dict()))
    assert back == k and back.store.storage_options == OPTS
    assert KernelResult.from_dict(
        {"materialized": False, "reason": "r", "solver": "dense", "block_rows": 8}
    ).to_dict() == {"materialized": False, "reason": "r", "solver": "dense", "block_rows": 8}

    s = SolveResult(Location("memory://bucket/run/model", dict(OPTS)), {"solver": "dense"})
    d = s.to_dict()
    assert d == {
        "solver": "dense",
        "path": "memory://bucket/run/model",
        "storage_options": OPTS,
    }
    back = SolveResult.from_dict(_via_json(d))
    assert back == s and back.to_dict() == d
    # what kpca_dask.load is given: a store opened with the descriptor's options
    src = back.model.zarr_source()
    fs = getattr(src.fs, "sync_fs", src.fs)  # zarr wraps a synchronous filesystem
    assert fs.storage_options.get("use_listings_cache") is False
    assert Location("memory://bucket/run/model").zarr_source() == "memory://bucket/run/model"
