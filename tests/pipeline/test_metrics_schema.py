"""report/metrics.json has one definition: the typed model in pipeline/evaluate/metrics.py.
Its JSON schema is generated from the model, kept in docs/metrics.schema.json, and checked
here against written metrics files (the stage's own output is checked in
test_evaluate_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from pipeline.evaluate import METRICS_SCHEMA
from pipeline.evaluate.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]


def test_the_schema_is_generated_from_the_model():
    assert METRICS_SCHEMA == Metrics.model_json_schema(by_alias=True)
    jsonschema.Draft202012Validator.check_schema(METRICS_SCHEMA)
    assert METRICS_SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert METRICS_SCHEMA["properties"]["schema_version"]["const"] == 1


def test_the_documented_schema_is_the_generated_one():
    on_disk = json.loads((ROOT / "docs" / "metrics.schema.json").read_text())
    assert on_disk == METRICS_SCHEMA, (
        "docs/metrics.schema.json is stale: python -m pipeline.evaluate.metrics > "
        "docs/metrics.schema.json"
    )


def test_the_example_report_is_a_valid_metrics_file():
    """The metrics.json published in docs/report-example validates against the schema and
    round-trips through the model unchanged."""
    written = json.loads((ROOT / "docs" / "report-example" / "metrics.json").read_text())
    jsonschema.validate(written, METRICS_SCHEMA)
    assert Metrics.model_validate(written).to_json_dict() == written


def test_an_unknown_key_is_refused():
    """A number the stage starts writing needs a field in the model (and so the schema)."""
    written = json.loads((ROOT / "docs" / "report-example" / "metrics.json").read_text())
    written["kpca"]["top5_accuracy"] = 0.99
    try:
        jsonschema.validate(written, METRICS_SCHEMA)
    except jsonschema.ValidationError as exc:
        assert "top5_accuracy" in exc.message
    else:  # pragma: no cover
        raise AssertionError("the schema accepted an undeclared key")
