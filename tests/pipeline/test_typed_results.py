"""Typed stage results (pipeline/stages.py): descriptors carry locations with their storage
options, round-trip exactly through JSON, and stores are reopened with those options."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.config import ChunkConfig, InputConfig
from pipeline.ingest import IngestResult, ingest, load_ingested
from pipeline.store import Location

#: a harmless fsspec option (never credentials: the config refuses those)
OPTS = {"skip_instance_cache": True}


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
        {"path": "p", "n_rows": 1, "n_features": 1, "columns": ["a"], "rows_per_chunk": 1,
         "fingerprint": "f"}
    )
    with pytest.raises(AttributeError):
        res.n_rows = 2  # type: ignore[misc]
