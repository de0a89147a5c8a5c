"""The stage registry: stages see only their declared config slice, and a stage added to
(or removed from) the registry is the only edit the plain run needs (the Prefect flow's
side of this is in tests/flows/test_flows.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline import stages
from pipeline.config import load_config
from pipeline.output.export import verify_run
from pipeline.output.layout import LOCK, MANIFEST, VERSIONS, RunLayout, run_layout
from pipeline.runner.run import run_pipeline
from pipeline.stages import REGISTRY, ConfigSliceError, ConfigView, Registry, Stage

N, D = 200, 3
X = np.random.default_rng(5).standard_normal((N, D))


def config(tmp_path: Path, **over):
    npy = tmp_path / "x.npy"
    if not npy.exists():
        np.save(npy, X)
    cfg = {
        "input": {"path": str(npy)},
        "kernel": {"gamma": 0.3},
        "solver": {"n_components": 2, "eigen_solver": "dense", "dtype": "float64"},
        "chunks": {"target_chunk_mb": 0.002, "block_rows": 64},
        "output": {"path": str(tmp_path / "out"), "parquet": False},
        "evaluate": {"enabled": False},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    return load_config(cfg)


# ------------------------------------------------------------------- config slices
def test_a_stage_reading_outside_its_slice_fails_loudly(tmp_path):
    """The view names the stage, the field and where to declare it; declared fields read
    through, whole sections are the real (validated) section."""
    cfg = config(tmp_path)
    view = REGISTRY["kernel"].view(cfg)
    assert view.solver.n_components == 2 and view.kernel is cfg.kernel
    assert view.chunks.block_rows == 64
    with pytest.raises(ConfigSliceError) as err:
        _ = view.solver.max_iter  # the fit's stopping rule: not the kernel stage's business
    msg = str(err.value)
    assert (
        "stage 'kernel'" in msg
        and "'solver.max_iter'" in msg
        and "pipeline/stages/kernel_stage.py" in msg
    )
    assert "\n" not in msg
    with pytest.raises(ConfigSliceError, match="stage 'kernel' read config field 'evaluate'"):
        _ = view.evaluate
    with pytest.raises(ConfigSliceError, match="'chunks.target_chunk_mb'"):
        _ = view.chunks.target_chunk_mb
    with pytest.raises(AttributeError):  # the slice is read-only
        view.kernel = cfg.kernel
    # private and dunder lookups (copy, pickle protocols) are plain AttributeErrors
    assert getattr(view, "__deepcopy__", None) is None


def test_a_stage_that_reads_an_undeclared_field_fails_the_run(tmp_path):
    """In a real run: the stage that strays fails with the slice error, nothing is
    published, and the previous state of the output is kept."""

    def stage_sloppy(cfg, ing):
        return {"gamma": cfg.kernel.gamma}  # declared only solver.dtype

    sloppy = Stage(
        "sloppy", stage_sloppy, config=("solver.dtype",), inputs=("ing",), result="sloppy"
    )
    cfg = config(tmp_path)
    with pytest.raises(ConfigSliceError, match="stage 'sloppy' read config field 'kernel'"):
        run_pipeline(cfg, registry=REGISTRY.with_stage(sloppy, before="split"))
    assert not (tmp_path / "out" / MANIFEST).exists()
    assert not (tmp_path / "out" / LOCK).exists()


def test_every_stage_slice_is_the_config_it_reads(tmp_path):
    """The real registry runs end to end under its views (a hidden read would raise), and
    the view hashes exactly the declared fields."""
    cfg = config(tmp_path)
    summary = run_pipeline(cfg)
    assert verify_run(tmp_path / "out")["status"] == "complete"
    assert set(REGISTRY.names) <= set(summary.timings)
    data = REGISTRY["split"].view(cfg).to_json_dict()
    assert data == {
        "evaluate": {
            "enabled": False,
            "random_state": 0,
            "stratify": True,
            "test_fraction": 0.2,
        },
        "preprocess": {"scale": "standard"},
        "output": {"path": cfg.output.path, "storage_options": {}},
    }


def test_the_registry_refuses_inputs_no_earlier_stage_returns():
    toy = Stage("toy", lambda cfg, later: None, config=(), inputs=("later",), result="toy")
    with pytest.raises(ValueError, match="no earlier stage returns"):
        Registry([toy])
    with pytest.raises(ValueError, match="taken"):
        REGISTRY.with_stage(Stage("ingest", lambda cfg: None, config=(), result="x"))


# ----------------------------------------------------------------- a toy stage
def test_a_toy_stage_is_one_registry_edit_for_the_plain_run(tmp_path, monkeypatch):
    """Registered (here: the module's registry replaced by one with the toy added), the
    plain run calls it with its declared input and slice; removed, the run is as before."""
    calls: list[tuple[int, int]] = []

    def stage_count(cfg, ing):
        calls.append((ing.n_rows, cfg.chunks.block_rows))
        return {"rows": ing.n_rows}

    toy = Stage(
        "count", stage_count, config=("chunks.block_rows",), inputs=("ing",), result="count"
    )
    monkeypatch.setattr(stages, "REGISTRY", REGISTRY.with_stage(toy, before="export"))
    summary = run_pipeline(config(tmp_path))
    assert calls == [(N, 64)] and "count" in summary.timings
    assert summary.manifest["status"] == "complete"

    monkeypatch.setattr(stages, "REGISTRY", stages.REGISTRY.without("count"))
    summary = run_pipeline(config(tmp_path, output={"overwrite": True}))
    assert calls == [(N, 64)] and "count" not in summary.timings
    assert verify_run(tmp_path / "out")["status"] == "complete"


# ---------------------------------------------------------------------- layout
def test_the_layout_names_every_store_under_the_output(tmp_path):
    cfg = config(tmp_path)
    lay = run_layout(cfg)
    assert isinstance(lay, RunLayout)
    root = Path(cfg.output.path)
    assert lay.ingest.local_path == root / "work" / "ingest.zarr"
    assert lay.kernel.local_path == root / "work" / "kernel.zarr"
    assert lay.flow_cache.local_path == root / "work" / "flow-cache"
    assert lay.manifest.local_path == root / MANIFEST and lay.lock.local_path == root / LOCK
    # nothing published yet: the arrays' folder is the root; a version being written: its own
    assert lay.out.local_path == root
    assert RunLayout(lay.root, version="v1").out.local_path == root / VERSIONS / "v1"
    assert all(loc.local_path.is_relative_to(root) for loc in lay.stores().values())
    remote = config(
        tmp_path,
        input={"storage_options": {"anon": True}},
        output={"path": "s3://bucket/run", "storage_options": {"use_ssl": False}},
    )
    # every store of the run carries the output's own options, never the input's
    stores = run_layout(remote).stores().values()
    assert all(loc.storage_options == {"use_ssl": False} for loc in stores)
    assert run_layout(remote).model.url == "s3://bucket/run/model"
    borrowed = config(
        tmp_path, input={"storage_options": {"anon": True}}, output={"path": "s3://bucket/run"}
    )
    assert run_layout(borrowed).model.storage_options == {}


def test_the_store_module_knows_the_layout_names():
    """pipeline/output/store.py sits below the layout (it defines Location), so it keeps its own
    lists of a run's names for ownership checks: they must be the layout's."""
    from kpca_dask.removal import MARKER_FILE
    from pipeline.output import layout, store

    assert set(store.RUN_FOLDERS) <= layout.RUN_NAMES
    assert set(store.OUR_FILES) <= layout.RUN_NAMES | {MARKER_FILE}
    assert layout.VERSIONS in layout.RUN_NAMES


def test_an_old_run_folder_with_a_centre_store_still_runs(tmp_path):
    """Earlier versions wrote work/centre.zarr; nothing reads it and a re-run works."""
    cfg = config(tmp_path)
    run_pipeline(cfg)
    import zarr

    g = zarr.open_group(str(tmp_path / "out" / "work" / "centre.zarr"), mode="w")
    g.attrs["status"] = "complete"
    run_pipeline(config(tmp_path, output={"overwrite": True}))
    assert verify_run(tmp_path / "out")["status"] == "complete"


def test_config_view_copies_keep_the_slice(tmp_path):
    cfg = config(tmp_path)
    view = ConfigView(cfg, "solve", REGISTRY["solve"].fields)
    copy = view.model_copy(deep=True)
    copy.kernel.gamma = 0.9
    assert cfg.kernel.gamma == 0.3 and copy.kernel.gamma == 0.9
    with pytest.raises(ConfigSliceError):
        _ = copy.evaluate
