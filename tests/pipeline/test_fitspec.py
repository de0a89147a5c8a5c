"""The fit spec (pipeline/model/fitspec.py): one table from config fields to estimator
parameters, the slices derived from it, one validation system, one plan per run."""

from __future__ import annotations

import numpy as np
import pytest

import kpca_dask
from kpca_dask import KernelPCA
from kpca_dask.cost import Cluster, Machine
from kpca_dask.exceptions import InvalidParameterError
from pipeline.config import ConfigError, load_config
from pipeline.model.fitspec import (
    FIT_FIELDS,
    FIXED,
    PARAMS,
    PLAN_FIELDS,
    estimator_params,
    make_estimator,
    plan_fit,
)
from pipeline.runner.run import stage_begin
from pipeline.runtime.sizing import plan_run
from pipeline.stages import REGISTRY, config_slice
from pipeline.update.run import UPDATE_REGISTRY

RNG = np.random.default_rng(0)
N, D = 900, 5
X = RNG.standard_normal((N, D)) + RNG.standard_normal((3, D))[RNG.integers(0, 3, N)] * 3


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    p = tmp_path_factory.mktemp("in") / "x.npy"
    np.save(p, X)
    return p


def _config(path, out, **over):
    cfg = {
        "input": {"path": str(path)},
        "kernel": {"name": "rbf", "gamma": "scale"},
        "solver": {"n_components": 3, "dtype": "float64", "random_state": 0},
        "output": {"path": str(out), "parquet": False},
        "evaluate": {"enabled": False},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    return load_config(cfg)


def _value(cfg, field):
    section, _, name = field.partition(".")
    return getattr(getattr(cfg, section), name)


def _covers(declared, field):
    """Whether a stage's declared slice (sections or dotted fields) includes ``field``."""
    return field in declared or field.partition(".")[0] in declared


def test_every_estimator_parameter_comes_from_the_table(tmp_path):
    """The estimator's parameters are the table's fields' values (and the fixed ones),
    the pre-image map's only when denoising."""
    cfg = _config(tmp_path / "x.npy", tmp_path / "o", denoise={"enabled": True, "alpha": 0.5})
    params = estimator_params(cfg)
    assert set(params) == {p.param for p in PARAMS} | set(FIXED)
    for p in PARAMS:
        assert params[p.param] == _value(cfg, p.field), p.field
    plain = estimator_params(_config(tmp_path / "x.npy", tmp_path / "o"))
    assert "alpha" not in plain and "fit_inverse_transform" not in plain
    est = make_estimator(cfg, 512, overrides={"gamma": 0.25})
    assert est.get_params()["chunk_size"] == 512 and est.get_params()["gamma"] == 0.25


def test_the_stage_slices_derive_from_the_table():
    """The kernel stage declares what plans (and no stopping rule: its key must not
    depend on one); the solve and the update declare the same fit slice."""
    kernel, solve = REGISTRY["kernel"].config, REGISTRY["solve"].config
    update = UPDATE_REGISTRY["update"].config
    for p in PARAMS:
        assert _covers(solve, p.field) and _covers(update, p.field), p.field
        assert _covers(kernel, p.field) == (p.plans or p.field.startswith("kernel.")), p.field
    assert all(_covers(kernel, f) for f in PLAN_FIELDS)
    assert set(update) - set(solve) == {"update.kernel_params"}
    assert config_slice(*FIT_FIELDS) == solve


BAD = [
    ("kernel.gamma", 0),
    ("kernel.degree", 0),
    ("solver.n_components", 0),
    ("solver.n_oversamples", -1),
    ("solver.n_power_iter", -1),
    ("solver.max_iter", 0),
    ("solver.n_landmarks", 0),
    ("chunks.block_rows", 0),
    ("denoise.alpha", -1),
    ("denoise.sample_size", 0),
    ("denoise.tol", 0),
    ("denoise.max_iter", 0),
]


@pytest.mark.parametrize("field,bad", BAD)
def test_a_bad_value_is_refused_by_the_estimators_rule(tmp_path, field, bad):
    """At load, in one line naming the config field, in the words the estimator uses for
    the parameter the field sets."""
    section, _, name = field.partition(".")
    with pytest.raises(ConfigError) as exc:
        _config(tmp_path / "x.npy", tmp_path / "o", **{section: {name: bad}})
    msg = str(exc.value)
    assert "\n" not in msg and f"{field}: must be" in msg, msg
    words = msg.split(f"{field}: ", 1)[1].split(". Got ")[0]  # YAML 0 is the float 0.0
    param = next(p.param for p in PARAMS if p.field == field)
    with pytest.raises(InvalidParameterError) as est_exc:
        KernelPCA(**{param: bad}).plan(X)
    assert words in str(est_exc.value)


def _stages(cfg):
    """ingest -> split -> kernel -> solve through the registry (each stage on its
    declared slice: a field read outside it fails)."""
    stage_begin(cfg)
    ing = REGISTRY["ingest"](cfg)
    split = REGISTRY["split"](cfg, ing=ing)
    kernel = REGISTRY["kernel"](cfg, ing=ing, split=split)
    solved = REGISTRY["solve"](cfg, ing=ing, split=split, kernel=kernel)
    return kernel, solved


@pytest.mark.parametrize(
    "over",
    [
        {"solver": {"eigen_solver": "randomized"}, "kernel_store": {"materialize": "always"}},
        {"solver": {"eigen_solver": "nystroem", "n_landmarks": 60}},
    ],
    ids=["exact-materialised", "nystroem"],
)
def test_the_kernel_stages_plan_is_the_fits(tmp_path, npy, over):
    """Solver, block rows and the resolved gamma are planned once, by the kernel stage,
    and the solve fits with them; the config still says gamma: scale."""
    cfg = _config(npy, tmp_path / "out", **over)
    before = cfg.to_json_dict()
    kernel, solved = _stages(cfg)
    model = kpca_dask.load(solved["path"])
    assert model.eigen_solver_ == kernel["solver"] == solved["solver"]
    assert model.chunk_size_ == kernel["block_rows"]
    assert model.get_params()["chunk_size"] == kernel["block_rows"]
    if kernel["materialized"]:
        assert model.gamma_ == kernel["gamma"]  # the store's gamma, not a second sample
    else:
        assert solved["block_rows"] == kernel["block_rows"]  # one number in the manifest
    assert cfg.to_json_dict() == before and cfg.kernel.gamma == "scale"


def test_kpca_plan_plans_as_the_run(tmp_path, npy):
    """`kpca plan` (pipeline/runtime/sizing.py) gets the solver and block rows the kernel stage
    plans for the same rows, parameters and threads."""
    cfg = _config(npy, tmp_path / "out", solver={"eigen_solver": "randomized"})
    cluster = Cluster(workers=1, threads=2)
    run = plan_run(cfg, cluster, Machine(), rows=N, features=D)
    fit = plan_fit(cfg, N, D, plans_only=True, threads=cluster.cores)
    assert (run.fit.solver, run.fit.block_rows) == (fit.solver, fit.block_rows)
