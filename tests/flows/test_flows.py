"""The Prefect flows end to end: one test harness per session, a real multi-process Dask
cluster on 127.0.0.1 (tests/conftest.py), real zarr stores in temporary folders.

What is shown here, with evidence rather than assumption:

* the flow publishes a verified run and its artifacts (summary, spectrum table, links,
  evaluation), with the same arrays as the plain ``run_pipeline``;
* an identical second run is entirely cached: one task run per stage, all Cached (read back from
  the Prefect API), no file under the output touched;
* changing gamma re-runs kernel..export but not ingest and split, and switching back
  re-runs the kernel even though its old cache record still exists (the stores on disk
  belong to the other gamma by then: a cache hit never points at foreign artifacts);
* deleted stores are rebuilt instead of trusted;
* transient failures are retried, validation errors are not; invalid parameters fail
  before any task runs; without any Prefect API the CLI says what to do.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from pipeline.output.versions import open_output
from pipeline.stages import REGISTRY
from tests.published import version_dir

pytestmark = [pytest.mark.flows, pytest.mark.cluster]

RNG = np.random.default_rng(11)
N = 600
CENTRES = np.array([[0, 0, 0, 0], [3, 3, 0, 0], [0, 3, 3, 0]], dtype=float)
LABELS = RNG.integers(0, 3, size=N)
X = CENTRES[LABELS] + RNG.normal(scale=0.8, size=(N, 4))
STAGES = REGISTRY.names


# ------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """One Prefect test harness (temporary server + database) for the session."""
    from prefect.settings import PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("PREFECT_HOME", str(home))
    mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        with temporary_settings(updates={PREFECT_HOME: home}):
            with prefect_test_harness(server_startup_timeout=90):
                yield
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flows")
    frame = pd.DataFrame(X, columns=list("abcd"))
    frame["key"] = np.arange(N)
    frame["label"] = np.array(["p", "q", "r"])[LABELS]
    frame.to_csv(tmp / "in.csv", index=False)
    return tmp


def make_config(data_dir: Path, address: str, out: str = "out", **kernel):
    from pipeline.config import load_config

    return load_config(
        {
            "input": {
                "path": str(data_dir / "in.csv"),
                "id_column": "key",
                "label_column": "label",
            },
            "kernel": {"name": "rbf", "gamma": 0.2, **kernel},
            "solver": {"n_components": 3, "eigen_solver": "randomized", "dtype": "float64"},
            "chunks": {"target_chunk_mb": 0.005, "block_rows": 200},
            "kernel_store": {"materialize": "always"},
            "output": {"path": str(data_dir / out), "overwrite": True},
            "cluster": {"address": address},
            "evaluate": {"enabled": True, "sweep_components": [1, 3], "report": False},
        }
    )


def run_flow(cfg, with_id: bool = False):
    """Run ``kpca_pipeline``; return its result and the task states the API recorded."""
    from flows.pipeline_flow import kpca_pipeline

    state = kpca_pipeline(config=cfg, return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    result = state.result()
    out = result, api_task_states(flow_run_id, expect=set(result["states"]))
    return (*out, flow_run_id) if with_id else out


def api_task_states(flow_run_id, expect: set[str] = frozenset()) -> dict[str, str]:
    """Task run states as the API recorded them. Task runs report their states to the
    server in the background: on a loaded machine the last ones arrive after the flow
    returns, so wait (up to a minute) until every ``expect``-ed stage has a final state."""
    import time

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter
    from prefect.client.schemas.sorting import TaskRunSort

    deadline = time.monotonic() + 60
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id={"any_": [flow_run_id]}),
                sort=TaskRunSort.EXPECTED_START_TIME_DESC,
                limit=100,
            )
        states = {tr.name.rsplit("-", 1)[0]: tr.state.name for tr in runs}
        final = all(tr.state.is_final() for tr in runs)
        if (final and expect <= set(states)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(states) == len(runs), [tr.name for tr in runs]  # one task run per stage
    return states


def api_artifacts(flow_run_id) -> dict[str, dict]:
    """The flow run's artifacts by key, as the server stores them.

    Plain HTTP: the 3.8.8 sync client sends nulls for unset filters, which this
    server (fastapi 0.154) refuses, and an empty task-run filter hides flow-level
    artifacts.
    """
    import httpx
    from prefect.settings import PREFECT_API_URL

    body = {"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 100}
    res = httpx.post(f"{PREFECT_API_URL.value()}/artifacts/filter", json=body, timeout=30)
    res.raise_for_status()
    return {a["key"]: a for a in res.json()}


def file_times(root: Path) -> dict[str, int]:
    """Every file under a run folder with its modification time (ns)."""
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".kpca-run.lock"
    }


def cache_records(out: Path, stage: str) -> list[Path]:
    return sorted((out / "work" / "flow-cache").glob(f"kpca-{stage}-*"))


@pytest.fixture(scope="module")
def first_run(prefect_api, dask_cluster, data_dir):
    cfg = make_config(data_dir, dask_cluster.scheduler_address)
    return (cfg, *run_flow(cfg, with_id=True))


# ---------------------------------------------------------------------- tests
# moved out of the default run (its 20-minute budget, 2026-11-28): ~45 s;
# tests/flows/test_cli.py::test_run_publishes_a_verified_run runs the flow from the CLI
@pytest.mark.slow
@pytest.mark.distributed
def test_flow_publishes_a_verified_run_with_artifacts(first_run, dask_cluster):
    """Every stage runs once, the run verifies, and the artifacts describe it."""
    from pipeline.output.export import verify_run

    cfg, result, states, flow_run_id = first_run
    assert result["states"] == {s: "Completed" for s in STAGES}
    assert states == result["states"]
    out = Path(cfg.output.path)
    m = verify_run(out)
    assert m["status"] == "complete" and m["kernel_store"]["materialized"]
    assert m["model"]["kernel"]["gamma"] == 0.2
    assert dask_cluster.scheduler_address in result["cluster"]  # the flow used our cluster
    assert "2 workers" in result["cluster"]

    arts = api_artifacts(flow_run_id)
    assert {
        "kpca-run-summary",
        "kpca-spectrum",
        "kpca-output",
        "kpca-evaluation",
        "kpca-evaluation-table",
    } <= set(arts)
    summary = arts["kpca-run-summary"]["data"]
    for text in (
        f"{N} rows x 4 features",
        "rbf (gamma 0.2",
        "randomized, 3 components",
        "Explained variance",
        "| kernel | Completed |",
        out.as_uri(),
        "manifest.json",
        "held-out accuracy",
    ):
        assert text in summary, text
    g = zarr.open_group(str(version_dir(out)), mode="r")
    table = arts["kpca-spectrum"]["data"]
    table = table if isinstance(table, list) else json.loads(table)
    assert [r["component"] for r in table] == [0, 1, 2]
    np.testing.assert_array_equal(
        [r["eigenvalue"] for r in table], g["spectrum/eigenvalues"][...]
    )
    np.testing.assert_allclose(
        table[-1]["cumulative_explained_variance"],
        g["spectrum/explained_variance_ratio"][...].sum(),
    )
    assert arts["kpca-output"]["data"] == f"[{out}]({out.as_uri()})"  # link text + URL
    assert "kernel PCA" in arts["kpca-evaluation"]["data"]


# moved out of the default run (its 20-minute budget; 2026-11-28, second cut): ~40 s; the flow
# from the CLI is tests/flows/test_cli.py::test_run_publishes_a_verified_run
@pytest.mark.slow
@pytest.mark.distributed
def test_flow_writes_the_same_artifacts_as_run_pipeline(first_run, data_dir, dask_client):
    """The flow and the plain stage sequence publish identical arrays and model."""
    from pipeline.output.export import verify_run
    from pipeline.runner.run import run_pipeline

    cfg = first_run[0]
    plain_cfg = make_config(data_dir, cfg.cluster.address, out="plain")
    run_pipeline(plain_cfg)  # on the default client: the same 2-worker cluster
    flow_out, plain_out = Path(cfg.output.path), Path(plain_cfg.output.path)
    a, b = verify_run(flow_out), verify_run(plain_out)
    assert set(a) == set(b)
    assert a["checksums"] == b["checksums"]  # embedding, spectrum, labels, ids, split
    assert a["model"]["checksums"] == b["model"]["checksums"]
    assert set(a["model"]) == set(b["model"])
    assert a["input"]["fingerprint"] == b["input"]["fingerprint"]
    assert a["evaluation"]["kpca_accuracy"] == b["evaluation"]["kpca_accuracy"]
    a_cfg, b_cfg = dict(a["config"]), dict(b["config"])
    assert a_cfg.pop("output") != b_cfg.pop("output") and a_cfg == b_cfg

    def published(root: Path) -> set[str]:
        """Every file of the output, the version folder's id masked (each run has its own)."""
        vid = json.loads((root / "manifest.json").read_text())["version"]
        return {
            f.replace(vid, "<version>")
            for f in file_times(root)
            if not f.startswith("work/flow-cache/")
        }

    assert published(flow_out) == published(plain_out)


@pytest.mark.distributed
def test_identical_rerun_recomputes_nothing(first_run):
    """A second identical run: every stage Cached, no file touched, the run still verified."""
    from pipeline.output.export import verify_run

    cfg = first_run[0]
    out = Path(cfg.output.path)
    before = file_times(out)
    manifest = verify_run(out)
    result, states = run_flow(cfg)
    assert states == {s: "Cached" for s in STAGES}  # what the Prefect API recorded
    assert result["states"] == states
    assert file_times(out) == before  # nothing rewritten, not even the manifest
    assert verify_run(out) == manifest
    assert result["manifest"] == manifest


@pytest.mark.distributed
def test_changing_gamma_recomputes_only_what_depends_on_it(first_run):
    """gamma 0.2 -> 0.5: kernel..export run again, ingest and split are cache hits; going
    back to 0.2 re-runs the kernel although its 0.2 record exists, since the store on disk
    now holds the 0.5 kernel."""
    from pipeline.output.export import verify_run

    cfg = first_run[0]
    out = Path(cfg.output.path)
    ingest_before = {
        f: t for f, t in file_times(out).items() if f.startswith("work/ingest.zarr/")
    }
    kernel_before = file_times(out / "work" / "kernel.zarr")

    changed = cfg.model_copy(deep=True)
    changed.kernel.gamma = 0.5
    result, states = run_flow(changed)
    assert states == {
        "ingest": "Cached",
        "split": "Cached",
        "kernel": "Completed",
        "solve": "Completed",
        "project": "Completed",
        "denoise": "Completed",
        "evaluate": "Completed",
        "export": "Completed",
    }
    assert {
        f: t for f, t in file_times(out).items() if f.startswith("work/ingest.zarr/")
    } == ingest_before
    assert file_times(out / "work" / "kernel.zarr") != kernel_before
    g = zarr.open_group(str(out / "work" / "kernel.zarr"), mode="r")
    assert g.attrs["kernel"]["gamma"] == 0.5
    assert verify_run(out)["model"]["kernel"]["gamma"] == 0.5
    assert len(cache_records(out, "kernel")) == 2  # one record per gamma

    result, states = run_flow(cfg)  # back to gamma 0.2
    assert states["ingest"] == states["split"] == "Cached"
    assert states["kernel"] == "Completed"  # its record was stale: the store holds gamma 0.5
    assert states["export"] == "Completed"
    assert len(cache_records(out, "kernel")) == 2
    assert verify_run(out)["model"]["kernel"]["gamma"] == 0.2
    assert (
        zarr.open_group(str(out / "work" / "kernel.zarr"), mode="r").attrs["kernel"]["gamma"]
        == 0.2
    )


@pytest.mark.distributed
@pytest.mark.slow  # ~13 s
def test_turning_denoising_on_refits_and_publishes_denoised_rows(first_run):
    """denoise.enabled: the kernel store is reused, the model is refitted with
    its pre-image, the denoised rows are published (checksummed); off again removes them."""
    from pipeline.output.export import verify_run

    cfg = first_run[0]
    out = Path(cfg.output.path)
    on = cfg.model_copy(deep=True)
    on.denoise.enabled, on.denoise.alpha = True, 0.1
    result, states = run_flow(on)
    assert {s: states[s] for s in ("ingest", "split", "kernel")} == dict.fromkeys(
        ("ingest", "split", "kernel"), "Cached"
    )
    assert states["solve"] == states["denoise"] == states["export"] == "Completed"
    m = verify_run(out)
    assert "denoised" in m["checksums"] and m["denoise"]["rows"] == N
    assert m["denoise"]["method"] == "learned" and m["denoise"]["alpha"] == 0.1
    assert zarr.open_group(str(version_dir(out)), mode="r")["denoised"].shape == (N, 4)
    _, states = run_flow(on)
    assert states == {s: "Cached" for s in STAGES}

    _, states = run_flow(cfg)  # off again
    assert (
        states["solve"] == "Completed"
    )  # its record's model was replaced by the denoising one
    assert "denoised" not in zarr.open_group(str(version_dir(out)), mode="r")
    assert verify_run(out)["denoise"] is None


# moved out of the default run (its 20-minute budget; 2026-11-28, second cut): ~19 s
@pytest.mark.slow
@pytest.mark.distributed
def test_deleted_stores_are_rebuilt_not_trusted(first_run):
    """A cache hit must never point at missing artifacts: deleted stores are recomputed."""
    from pipeline.output.export import verify_run

    cfg = first_run[0]
    out = Path(cfg.output.path)
    run_flow(cfg)  # whatever ran before, start from a complete, cached state
    shutil.rmtree(version_dir(out) / "model")  # deleted from the published version
    _, states = run_flow(cfg)
    assert states["solve"] == "Completed" and states["export"] == "Completed"
    assert {s: states[s] for s in ("ingest", "split", "kernel")} == dict.fromkeys(
        ("ingest", "split", "kernel"), "Cached"
    )
    verify_run(out)

    published = verify_run(out)
    shutil.rmtree(out / "work" / "kernel.zarr")  # an intermediate store: rebuilt, same content
    _, states = run_flow(cfg)
    assert states["kernel"] == "Completed"
    assert {s for s, st in states.items() if st != "Cached"} == {"kernel"}
    assert (out / "work" / "kernel.zarr").is_dir()
    assert verify_run(out) == published  # the published run was never withdrawn


@pytest.mark.slow  # moved out of the default run (its 20-minute budget, 2026-11-28): ~15 s
@pytest.mark.distributed
def test_a_stage_added_to_the_registry_runs_in_the_flow_and_is_cached(first_run, monkeypatch):
    """Registering a toy stage is the only edit: the flow runs it as a task (the other
    stages stay cached), an identical re-run serves it from its cache record, and with the
    stage removed again the flow is back to the registered stages, all cached."""
    from pipeline import stages

    cfg = first_run[0]
    out = Path(cfg.output.path)
    run_flow(cfg)  # whatever ran before, start from a complete, cached state
    calls: list[int] = []

    def stage_count(cfg, ing):
        calls.append(ing.n_rows)
        return {"rows": ing.n_rows, "block_rows": cfg.chunks.block_rows}

    toy = stages.Stage(
        "count", stage_count, config=("chunks.block_rows",), inputs=("ing",), result="count"
    )
    monkeypatch.setattr(stages, "REGISTRY", stages.REGISTRY.with_stage(toy, before="export"))
    result, states = run_flow(cfg)
    assert states == {**dict.fromkeys(STAGES, "Cached"), "count": "Completed"}
    assert calls == [N] and "count" in result["timings"]
    assert len(cache_records(out, "count")) == 1
    _, states = run_flow(cfg)
    assert states["count"] == "Cached" and calls == [N]  # served from its record

    monkeypatch.setattr(stages, "REGISTRY", stages.REGISTRY.without("count"))
    _, states = run_flow(cfg)
    assert states == dict.fromkeys(STAGES, "Cached") and calls == [N]


@pytest.mark.distributed
def test_transform_flow_embeds_a_new_batch(first_run, data_dir, dask_cluster):
    """kpca_transform on the cluster equals the saved model's transform; artifacts recorded."""
    import kpca_dask
    from flows.transform_flow import kpca_transform

    cfg = first_run[0]
    new = np.random.default_rng(3).normal(size=(40, 4)) + 1.0
    pd.DataFrame(new, columns=list("abcd")).assign(key=np.arange(40)).to_csv(
        data_dir / "new.csv", index=False
    )
    out = data_dir / "new.zarr"
    state = kpca_transform(
        model=cfg.output.path,
        input={"path": str(data_dir / "new.csv"), "id_column": "key"},
        output=str(out),
        cluster={"address": dask_cluster.scheduler_address},
        return_state=True,
    )
    assert state.is_completed(), state
    res = state.result()
    assert res["rows"] == 40 and res["components"] == 3
    expected = kpca_dask.load(version_dir(cfg.output.path) / "model").transform(new)
    g = open_output(str(out)).data.open_group("r")
    np.testing.assert_allclose(g["embedding"][...], expected, atol=1e-10)
    np.testing.assert_array_equal(g["ids"][...], np.arange(40))
    arts = api_artifacts(state.state_details.flow_run_id)
    assert {"kpca-transform-summary", "kpca-transform-output"} <= set(arts)
    assert "| Rows | 40 |" in arts["kpca-transform-summary"]["data"]

    with pytest.raises(FileExistsError, match="overwrite"):  # refused before any task runs
        kpca_transform(
            model=cfg.output.path,
            input={"path": str(data_dir / "new.csv")},
            output=str(out),
            cluster={"address": dask_cluster.scheduler_address},
        )


def test_transient_errors_are_retried_and_validation_errors_are_not(prefect_api):
    """OSError twice then success: 3 attempts, flow completes. ValueError: 1 attempt."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    from flows.tasks import RETRY_OPTIONS

    calls: list[str] = []
    options = {**RETRY_OPTIONS, "retry_delay_seconds": 0, "retry_jitter_factor": None}

    @task(cache_policy=NO_CACHE, **options)
    def stage(kind: str) -> str:
        calls.append(kind)
        if kind == "io" and len(calls) < 3:
            raise OSError("connection reset by peer")
        if kind == "invalid":
            raise ValueError("n_components must be >= 1")
        return "done"

    @flow
    def one_stage(kind: str) -> str:
        return stage(kind)

    assert one_stage("io") == "done" and calls == ["io"] * 3
    calls.clear()
    state = one_stage("invalid", return_state=True)
    assert state.is_failed() and calls == ["invalid"]


class _Records(logging.Handler):
    """The records Prefect's run loggers pass on to their handlers (after the loggers'
    own filters), formatted as a worker's console shows them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, self.format(record)))


@pytest.mark.parametrize("where", ["before the stages", "in a stage task"])
def test_a_failed_flow_run_logs_its_error_once_in_one_line(
    prefect_api, data_dir, tmp_path, dask_cluster, where
):
    """A flow run that fails on bad input logs the error once, as one line without a
    traceback, on the run loggers a Prefect worker prints and sends to the server (a
    scheduled night wrote two or three full tracebacks: the task's, the flow's and the
    engine's); the run's state message still names the error."""
    from flows.pipeline_flow import kpca_pipeline
    from flows.runtime import RUN_LOGGERS

    cfg = make_config(data_dir, dask_cluster.scheduler_address, out=f"failed-{len(where)}")
    if where == "before the stages":
        cfg.input.path = str(tmp_path / "missing.csv")
        cause = "does not exist"
    else:
        frame = pd.read_csv(data_dir / "in.csv")
        frame.loc[N // 2, "b"] = np.nan
        frame.to_csv(tmp_path / "nan.csv", index=False)
        cfg.input.path = str(tmp_path / "nan.csv")
        cause = "NaN"
    records = _Records()
    for name in RUN_LOGGERS:
        logging.getLogger(name).addHandler(records)
    try:
        state = kpca_pipeline(config=cfg, return_state=True)
    finally:
        for name in RUN_LOGGERS:
            logging.getLogger(name).removeHandler(records)
    assert state.is_failed(), state
    assert cause in state.message, state.message
    errors = [text for level, text in records.lines if level >= logging.ERROR]
    # Prefect's state message of the failed task ("Finished in state Failed(...)") aside
    ours = [e for e in errors if cause in e and "Finished in state" not in e]
    assert len(ours) == 1, errors
    text = "\n".join(t for _, t in records.lines)
    assert "Traceback" not in text, text


def test_a_bug_keeps_one_traceback_in_the_run_log():
    """The filter behind one line per failure keeps the traceback of an unexpected
    exception (a bug) -- once: the flow's and the engine's copies of it are dropped."""
    from flows.runtime import OneLineRunErrors

    keep = OneLineRunErrors()

    def record(msg: str, exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:
            info = sys.exc_info()
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, msg, (), info)

    bug = KeyError("a bug")
    first = record("Encountered exception during execution", bug)
    assert keep.filter(first) and first.exc_info is not None
    assert not keep.filter(record("Engine execution exited with unexpected exception", bug))
    user = ValueError("n_components must be >= 1")  # a bare ValueError is a bug's, not ours
    from pipeline.errors import RunError

    ours = record("Task run failed with exception", RunError("the run's manifest differs"))
    assert keep.filter(ours) and ours.exc_info is None
    retried = record("Task run failed with exception - Retry 1/3 will start", OSError("reset"))
    again = record("Task run failed with exception - Retry 2/3 will start", OSError("reset"))
    assert keep.filter(retried) and keep.filter(again)  # every retry is shown
    assert keep.filter(record("Encountered exception", user))


def test_invalid_parameters_fail_before_any_task(prefect_api, tmp_path):
    """A config the model refuses never starts a task (and writes nothing)."""
    from prefect.exceptions import ParameterTypeError

    from flows.pipeline_flow import kpca_pipeline

    bad = {
        "input": {"path": str(tmp_path / "in.csv")},
        "solver": {"n_components": 0},
        "output": {"path": str(tmp_path / "out")},
    }
    with pytest.raises(ParameterTypeError, match="n_components"):
        kpca_pipeline(config=bad)
    assert not (tmp_path / "out").exists()


# moved out of the default run (its 20-minute budget, 2026-11-28): ~18 s; test_cli_prefect.py's
# unreachable API test stays
@pytest.mark.slow
@pytest.mark.distributed
def test_cli_without_any_prefect_api_says_what_to_do(data_dir, tmp_path, dask_cluster):
    """Ephemeral mode off and no PREFECT_API_URL: one clear line, exit 2, nothing written;
    --no-prefect still runs the job."""
    import yaml

    cfg = make_config(
        data_dir, dask_cluster.scheduler_address, out=str(tmp_path / "cli-out")
    ).to_json_dict()
    cfg["evaluate"] = {"enabled": False}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="false"
    )

    def kpca(*args):
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    res = kpca("run", str(tmp_path / "run.yaml"), "--no-progress")
    assert res.returncode == 2, res.stderr
    assert "PREFECT_API_URL" in res.stderr and "--no-prefect" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "cli-out").exists()
    res = kpca("run", str(tmp_path / "run.yaml"), "--no-prefect", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "run complete" in res.stdout and "prefect " not in res.stdout


@pytest.mark.distributed
def test_update_flow_publishes_the_next_version(first_run, data_dir, dask_cluster):
    """kpca_update (flows/update_flow.py) on the first run and a labelled batch: a verified
    v2 whose manifest links the first run, with the drift report and a markdown artifact
    naming the action. The first run's model is exact, so the action is a refit."""
    from flows.update_flow import kpca_update
    from pipeline.output.export import verify_run
    from pipeline.update.run import update_config

    cfg = first_run[0]
    rng = np.random.default_rng(11)
    lab = rng.integers(0, 3, 60)
    batch = pd.DataFrame(
        CENTRES[lab] + rng.normal(scale=0.8, size=(60, 4)), columns=list("abcd")
    )
    batch["key"] = np.arange(N, N + 60)
    batch["label"] = np.array(["p", "q", "r"])[lab]
    batch.to_csv(data_dir / "batch.csv", index=False)
    ucfg = update_config(cfg.output.path, str(data_dir / "batch.csv"), str(data_dir / "v2"))
    state = kpca_update(config=ucfg, return_state=True)
    assert state.is_completed(), state
    m = verify_run(data_dir / "v2")
    upd = m["update"]
    # the base named by its published version folder (docs/update.md)
    assert upd["version"] == 2 and "/out/versions/" in upd["base"] and upd["n_rows"] == N + 60
    # the base run is exact: refitted on every row (warm-started), and the reason says so
    assert upd["action"] == "refit" and "exact (" in upd["reason"], upd["reason"]
    assert "does not merge rows" in upd["reason"]
    v2 = json.loads((data_dir / "v2" / "manifest.json").read_text())["version_path"]
    g = zarr.open_group(str(data_dir / "v2" / v2), mode="r")
    assert g["embedding"].shape == (N + 60, 3)
    np.testing.assert_array_equal(g["ids"][...][-60:], batch["key"].to_numpy())
    arts = api_artifacts(state.state_details.flow_run_id)
    assert "**refit**" in arts["kpca-update"]["data"]
    verify_run(cfg.output.path)  # the first run is untouched
