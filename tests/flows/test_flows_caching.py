"""Cache keys and retry policy of the flow tasks, as plain functions (no server, no cluster)."""

from __future__ import annotations

import json

import pytest

from flows.caching import (
    RUN_CONTROL,
    encode_result_object,
    identity,
    jsonable,
    result_serializer,
    stage_key,
)
from flows.tasks import is_transient
from pipeline.config import PipelineConfig, load_config
from pipeline.stages import REGISTRY

UPSTREAM = {
    "ing": {
        "path": "/o/work/ingest.zarr",
        "n_rows": 600,
        "n_features": 4,
        "fingerprint": "blake2b:aa",
        "seconds": 1.5,
        "reused": False,
    },
    "split": {
        "held_out": False,
        "n_train": 600,
        "n_test": 0,
        "split_id": "all",
        "checksums": {"ids": "sha256:ii"},
    },
    "kernel": {
        "materialized": True,
        "path": "/o/work/kernel.zarr",
        "kernel": {"gamma": 0.2},
        "computed": 6,
        "skipped": 0,
        "seconds": 0.3,
    },
    "solved": {
        "solver": "randomized",
        "model_checksums": {"V": "sha256:vv"},
        "fit_seconds": 1.0,
        "seconds": 1.1,
    },
    "projected": {"rows": 600, "components": 3, "checksums": {"embedding": "sha256:ee"}},
    "denoised": {"enabled": False},
    "evaluation": None,
}
#: the parameters of each stage task besides ``cfg``
PARAMS = {s.name: s.inputs for s in REGISTRY}


def config(**sections) -> PipelineConfig:
    base = {
        "input": {"path": "/nowhere/in.csv"},
        "kernel": {"gamma": 0.2},
        "output": {"path": "/nowhere/out"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return load_config(base)


def keys(cfg: PipelineConfig, upstream: dict | None = None) -> dict[str, str]:
    up = upstream or UPSTREAM
    return {
        s.name: stage_key(
            s,
            {"cfg": cfg, **{p: up[p] for p in s.inputs}, **{p: {"x": 1.0} for p in s.run_info}},
        )
        for s in REGISTRY
    }


def changed(a: dict[str, str], b: dict[str, str]) -> set[str]:
    return {s for s in a if a[s] != b[s]}


def test_keys_are_deterministic():
    """Same config and inputs, same keys (no run id, no object identity)."""
    assert keys(config()) == keys(config())


def test_gamma_changes_kernel_and_downstream_keys_only():
    """A new kernel.gamma misses from the kernel on; ingest and split still hit."""
    assert changed(keys(config()), keys(config(kernel={"gamma": 0.5}))) == {
        "kernel",
        "solve",
        "export",
    }
    # project and evaluate do not read the kernel config: their keys change through the
    # new model's checksums, which the solve task returns (content, not configuration;
    # here the upstream descriptors are held fixed)


def test_content_not_run_statistics_drive_downstream_keys():
    """Timings, reuse flags and block counters never enter a key; fingerprints do."""
    cfg = config()
    noisy = json.loads(json.dumps(UPSTREAM))
    noisy["ing"].update(seconds=99.0, reused=True)
    noisy["kernel"].update(computed=0, skipped=6, seconds=0.01)
    noisy["solved"].update(fit_seconds=7.0, seconds=7.5)
    assert keys(cfg, noisy) == keys(cfg)
    other = json.loads(json.dumps(UPSTREAM))
    other["ing"]["fingerprint"] = "blake2b:bb"
    assert changed(keys(cfg), keys(cfg, other)) == set(PARAMS) - {"ingest"}
    other = json.loads(json.dumps(UPSTREAM))
    other["solved"]["model_checksums"] = {"V": "sha256:ww"}
    assert changed(keys(cfg), keys(cfg, other)) == {"project", "denoise", "evaluate", "export"}


@pytest.mark.parametrize(
    "section, values, expected",
    [
        ("cluster", {"address": "tcp://10.0.0.1:8786"}, set()),
        ("output", {"overwrite": True}, set()),
        ("evaluate", {"C": 2.0}, {"evaluate", "export"}),
        ("evaluate", {"test_fraction": 0.3}, {"split", "evaluate", "export"}),
        ("solver", {"max_iter": 7}, {"solve", "export"}),
        ("denoise", {"enabled": True}, {"solve", "denoise", "export"}),
        ("denoise", {"alpha": 0.1}, {"solve", "denoise", "export"}),
        ("denoise", {"tol": 1e-3}, {"solve", "denoise", "export"}),  # the pre-image map's fit
        ("denoise", {"rows": "train", "max_rows": 10}, {"denoise", "export"}),
        ("output", {"parquet": False}, {"project", "export"}),
        ("chunks", {"target_chunk_mb": 8}, {"ingest", "export"}),
        ("input", {"nonfinite": "drop"}, {"ingest", "export"}),
    ],
)
def test_each_config_field_invalidates_what_reads_it(section, values, expected):
    """Run control changes no key; every other field changes its readers' keys."""
    assert changed(keys(config()), keys(config(**{section: values}))) == expected


def test_config_slices_name_real_fields_and_cover_the_manifest():
    """Every declared field exists (the registry refuses a misspelt one); export receives
    every field, and only run control stays out of its key."""
    from pipeline.stages import Registry, Stage

    with pytest.raises(ValueError, match="kernel.gama"):
        Registry([Stage("toy", lambda cfg: None, config=("kernel.gama",), result="toy")])
    cfg = config()
    export = REGISTRY["export"]
    assert export.view(cfg).to_json_dict() == cfg.to_json_dict()
    key = export.key_config(cfg)
    assert "cluster" not in key and "overwrite" not in key["output"]
    for section, field in PipelineConfig.model_fields.items():
        for name in field.annotation.model_fields:
            path = f"{section}.{name}"
            assert (
                (section in key and name in key[section])
                or path in RUN_CONTROL
                or section in RUN_CONTROL
            ), path


def test_new_code_means_new_keys(tmp_path):
    """The key holds a hash of every source file of kpca_dask and pipeline: an upgrade that
    changes any of them (not only the stage function) misses the old cache."""
    import kpca_dask
    import pipeline
    from flows.caching import CODE_PACKAGES, code_version, source_hash

    assert set(CODE_PACKAGES) == {kpca_dask, pipeline}
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    before = source_hash({"pkg": pkg})
    assert source_hash({"pkg": pkg}) == before
    (pkg / "sub" / "b.py").write_text("y = 3\n")  # a helper deep in the package
    assert source_hash({"pkg": pkg}) != before
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (pkg / "sub" / "b.py").rename(pkg / "b.py")  # same bytes, moved
    assert source_hash({"pkg": pkg}) != before
    # the running packages' hash is in every stage's code version
    from flows.caching import _package_code

    assert all(_package_code()[:16] in code_version(s) for s in REGISTRY)


def test_results_round_trip_as_plain_json():
    """Task results are stored as JSON: no pickle, no class hooks; errors as descriptions."""
    import numpy as np

    ser = result_serializer()
    assert ser.type == "json" and ser.object_decoder is None
    value = {"a": np.float64(0.5), "b": (1, 2), "c": None}
    assert ser.loads(ser.dumps(value)) == jsonable(value) == {"a": 0.5, "b": [1, 2], "c": None}
    err = ser.loads(ser.dumps(ValueError("bad gamma")))
    assert err == {"error": "builtins.ValueError", "message": "bad gamma"}
    assert encode_result_object(OSError("x"))["error"] == "builtins.OSError"
    assert identity({"seconds": 1, "x": [{"reused": True, "y": 2}]}) == {"x": [{"y": 2}]}


def test_only_transient_failures_are_retried():
    """I/O, network and lost workers: retry. Bad input, config or artifacts: fail at once."""
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    from kpca_dask.exceptions import InvalidParameterError, ModelFormatError
    from pipeline.config import ConfigError
    from pipeline.data.ingest import InputError
    from pipeline.model.kernel_store import KernelStoreError
    from pipeline.output.export import RunExistsError

    for exc in (
        OSError("reset"),
        ConnectionResetError(),
        TimeoutError(),
        CommClosedError(),
        KilledWorker("task", "worker", 3),
    ):
        assert is_transient(exc), exc
    for exc in (
        ValueError(),
        InputError("nan"),
        ConfigError("bad"),
        InvalidParameterError(),
        ModelFormatError(),
        RunExistsError("exists"),
        FileNotFoundError("missing"),
        PermissionError(),
        KernelStoreError("corrupt"),
        TypeError(),
        MemoryError(),
        RuntimeError("bug"),
    ):
        assert not is_transient(exc), exc
