"""Upgrades: an output written by the previous release (before ``versions/``: its
manifest, ``model/``, ``embedding``, ``embedding.parquet`` and arrays at the top level)
is migrated, never left serving its old paths (pipeline/output/migrate.py, issue 36).

The old output is built here with the previous release's own code: the commit before
the versions module was added (as ``pipeline/versions.py``), taken from git history
(``git archive``) and run as
``python -m flows.cli run`` with that tree first on the path (same venv). The current
code then re-runs it, migrates it by hand, or reads it. Git history is required: in a
shallow clone (or without git) the tests fail and say so, they do not skip.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.published import tree_bytes
from tests.reliability.helpers import ROOT, blobs, env, kpca

# slow: the previous release is unpacked from git and runs `kpca run` once (about a minute)
pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # its `kpca run`, `kpca` commands

N, D = 600, 6
#: the top-level paths the previous release documented for a run without labels
OLD_PATHS = ("model", "embedding", "embedding.parquet", "spectrum", "zarr.json")
#: where the versions module has lived: added at the first, moved to the second
VERSIONS_MODULE = ("pipeline/versions.py", "pipeline/output/versions.py")


def previous_release() -> str:
    """The commit of the previous release: the parent of the commit that added the
    versions module (the layout with versions): pipeline/versions.py, since moved to
    pipeline/output/versions.py (both paths given, so git pairs the move as a rename and
    the oldest addition is the first one)."""

    def git(*args: str) -> str:
        try:
            res = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
            )
        except FileNotFoundError:
            pytest.fail(
                "git is not installed: the upgrade tests build the previous release "
                "from git history; install git and run them in a full clone"
            )
        if res.returncode != 0:
            pytest.fail(
                f"git {' '.join(args)} failed ({res.stderr.strip()}): the upgrade "
                "tests need the repository's history (a full clone, not --depth 1)"
            )
        return res.stdout.strip()

    added = git("log", "--diff-filter=A", "--format=%H", "--", *VERSIONS_MODULE)
    if not added:
        pytest.fail(
            "git history has no commit adding the versions module: the upgrade "
            "tests need the repository's full history (git clone, not --depth 1; "
            "git fetch --unshallow)"
        )
    first = added.splitlines()[-1]
    return git("rev-parse", f"{first}~1")


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory) -> Path:
    """The previous release's source tree (git archive of its commit)."""
    commit = previous_release()
    tar = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, timeout=120
    )
    assert tar.returncode == 0, tar.stderr.decode()[-2000:]
    tree = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(tree, filter="data")
    assert (tree / "pipeline").is_dir()
    assert not any((tree / p).exists() for p in VERSIONS_MODULE), commit
    return tree


def write_config(path: Path, inp: Path | str, out: Path | str, **over) -> Path:
    cfg = {
        "input": {"path": str(inp)},
        "kernel": {"name": "rbf", "gamma": 0.02},
        "solver": {
            "n_components": 3,
            "eigen_solver": "randomized",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01, "block_rows": 100},
        "kernel_store": {"materialize": "never"},
        "output": {"path": str(out), "parquet": True},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "dashboard_address": None},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(yaml.safe_dump(cfg))
    return path


def previous_kpca(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """The previous release's ``kpca`` (its tree first on the path, this venv)."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, args)],
        cwd=tree,
        env=env(PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def legacy_output(previous_tree, tmp_path_factory) -> Path:
    """A run of night 1 written by the previous release's ``kpca run`` (local disk)."""
    base = tmp_path_factory.mktemp("legacy")
    np.save(base / "night1.npy", blobs(N, D, seed=0))
    cfg = write_config(base / "night1.yaml", base / "night1.npy", base / "out")
    res = previous_kpca(previous_tree, "run", cfg, "--no-prefect", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    out = base / "out"
    # the previous release's layout: its result at the top level, no versions
    assert not (out / "versions").exists()
    assert all((out / n).exists() for n in OLD_PATHS), sorted(os.listdir(out))
    return out


def copy_of(legacy: Path, dst: Path) -> Path:
    shutil.copytree(legacy, dst, symlinks=True)
    return dst


def old_embedding(out: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(out / "embedding"), mode="r")[:])


def migrate_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "migrate:" in ln]


# ------------------------------------------------------------ a run of today re-runs it
def test_rerun_migrates_the_previous_release_output(
    legacy_output, tmp_path, dask_client, caplog
):
    """The next night's run over an output of the previous release: the old result becomes
    the first published version (in the history, readable and verified, byte for byte
    the old night's), the old top-level paths are gone, the published version is the new
    night, and ``kpca transform <out>/model`` is refused in one line naming the output."""
    from pipeline import open_run
    from pipeline.output.store import Location
    from pipeline.runner.run import run_pipeline

    out = copy_of(legacy_output, tmp_path / "out")
    old_manifest = json.loads((out / "manifest.json").read_text())
    old_emb = old_embedding(out)
    old_files = {k: v for k, v in tree_bytes(out).items() if not k.startswith("work/")}

    np.save(tmp_path / "night2.npy", blobs(N, D, seed=1))
    cfg = write_config(
        tmp_path / "night2.yaml", tmp_path / "night2.npy", out, output={"overwrite": True}
    )
    from pipeline.config import load_config

    with caplog.at_level(logging.WARNING, logger="pipeline"):
        summary = run_pipeline(load_config(cfg))
    lines = migrate_lines(caplog.text)
    assert len(lines) == 1 and "kpca migrate" not in lines[0], caplog.text[-3000:]

    # no path the previous release documented is left serving the old night
    left = sorted(os.listdir(out))
    assert left == ["_kpca-dask.json", "manifest.json", "versions", "work"], left
    # the published version is the new night, the old one is in the history
    run = open_run(str(out))
    assert run.version == summary.version
    assert run.manifest["config"]["input"]["path"] == str(tmp_path / "night2.npy")
    (old_id,) = [h["version"] for h in run.history[1:]]
    assert old_id < run.version
    old = open_run(str(out), version=old_id)
    assert old.manifest == old_manifest
    assert np.array_equal(np.asarray(old.location.open_group("r")["embedding"][:]), old_emb)
    moved = tree_bytes(out / "versions" / old_id)
    assert all(moved[k] == v for k, v in old_files.items() if k != "manifest.json")
    assert not np.array_equal(np.asarray(run.location.open_group("r")["embedding"][:]), old_emb)
    # `kpca info` verifies both; the old model path is refused, naming the output
    res = kpca("info", out)
    assert res.returncode == 0 and "migrate" not in res.stderr, res.stderr[-2000:]
    res = kpca("transform", out / "model", tmp_path / "night2.npy", tmp_path / "t.zarr")
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert res.returncode == 2 and len(errors) == 1, res.stderr[-2000:]
    assert f"pass the output {out} itself" in errors[0]
    assert not (tmp_path / "t.zarr").exists()
    import kpca_dask

    with pytest.raises(Exception):  # noqa: B017, PT011 - no stale model at the old path
        kpca_dask.load(str(out / "model"))
    assert Location(str(out)).child("model").exists() is False


# -------------------------------------------------------------- by hand: kpca migrate
def test_kpca_migrate_dry_run_then_migrate(legacy_output, tmp_path):
    """``kpca migrate --dry-run`` says what it would do and changes nothing;
    ``kpca migrate`` publishes the old night as the output's version (verified) and
    removes the old paths; a second ``kpca migrate`` has nothing to do."""
    from pipeline import open_run

    out = copy_of(legacy_output, tmp_path / "out")
    before = tree_bytes(out)
    old_manifest = json.loads((out / "manifest.json").read_text())

    res = kpca("migrate", out, "--dry-run")
    assert res.returncode == 0 and "dry run, nothing changed" in res.stdout, res.stderr
    assert "model" in res.stdout and "versions/" in res.stdout
    assert tree_bytes(out) == before

    res = kpca("migrate", out)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(migrate_lines(res.stderr)) == 1, res.stderr
    assert sorted(os.listdir(out)) == ["_kpca-dask.json", "manifest.json", "versions", "work"]
    pointer = json.loads((out / "manifest.json").read_text())
    assert open_run(str(out)).version == pointer["version"] and pointer["history"] == []
    assert {
        k: v for k, v in pointer.items() if k not in ("version", "version_path", "history")
    } == old_manifest
    # the arrays moved unchanged (the old manifest's checksums verify them: open_run)
    moved = tree_bytes(out / "versions" / pointer["version"])
    assert all(
        moved[k] == v
        for k, v in before.items()
        if not k.startswith("work/") and k != "manifest.json"
    )

    res = kpca("migrate", out)
    assert res.returncode == 0 and "nothing to migrate" in res.stdout, res.stderr


# ------------------------------------------------------------------- readers of it
def test_open_run_reads_the_previous_layout_in_place_and_says_how_to_migrate(
    legacy_output, caplog
):
    """A reader of an output still in the previous layout reads it as it is (verified),
    and is told in one line that it is the earlier layout and the command that migrates
    it; nothing is changed by reading."""
    from pipeline import open_run

    before = tree_bytes(legacy_output)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        run = open_run(str(legacy_output))
    assert run.version is None and run.manifest["status"] == "complete"
    hints = [r.getMessage() for r in caplog.records if "earlier kpca-dask" in r.getMessage()]
    assert len(hints) == 1, caplog.text
    assert f"kpca migrate {legacy_output}" in hints[0]
    assert tree_bytes(legacy_output) == before


# -------------------------------------------------- what the release before left behind
def test_leftover_top_level_paths_beside_a_published_version_are_removed(
    legacy_output, tmp_path, caplog
):
    """The release before this one re-ran such an output by publishing under versions/
    and leaving the old top-level result in place (its manifest replaced by the pointer):
    the next writer (here ``kpca migrate``'s migration, the call every writer makes)
    removes those paths and keeps the published version as it is."""
    from pipeline import open_run
    from pipeline.output.lock import RunLock
    from pipeline.output.migrate import inspect, migrate
    from pipeline.output.store import Location

    out = copy_of(legacy_output, tmp_path / "out")
    root = Location(str(out))
    with RunLock(root) as lock:
        plan = migrate(root, lock=lock)  # publish the old night as a version ...
    vid = plan.version
    # ... and put the old top-level paths back, as the release before this one left them
    shutil.copytree(legacy_output, tmp_path / "again", symlinks=True)
    for n in OLD_PATHS:
        os.rename(tmp_path / "again" / n, out / n)
    published = tree_bytes(out / "versions" / vid)
    pointer = (out / "manifest.json").read_bytes()
    assert inspect(root).state == "leftover"

    with caplog.at_level(logging.WARNING, logger="pipeline"):
        assert open_run(str(out)).version == vid
    assert any("do not read them" in r.getMessage() for r in caplog.records), caplog.text

    with RunLock(root) as lock:
        assert migrate(root, lock=lock).state == "leftover"
    assert sorted(os.listdir(out)) == ["_kpca-dask.json", "manifest.json", "versions", "work"]
    assert tree_bytes(out / "versions" / vid) == published
    assert (out / "manifest.json").read_bytes() == pointer
    assert inspect(root).state == "current"


def test_an_unfinished_previous_release_run_is_not_published_and_user_files_stay(
    legacy_output, tmp_path, caplog
):
    """Top-level paths of the previous release without a manifest (its run did not finish)
    are not a result: the migration publishes nothing, removes them (ours by their
    group's kind) with one line saying why, and keeps ``work/`` and a file of the user's
    beside them."""
    from pipeline.output.lock import RunLock
    from pipeline.output.migrate import migrate
    from pipeline.output.store import Location

    out = copy_of(legacy_output, tmp_path / "out")
    os.remove(out / "manifest.json")  # the state a killed run of that release left
    (out / "notes.txt").write_text("mine")
    work = tree_bytes(out / "work", exclude=())
    root = Location(str(out))
    with caplog.at_level(logging.WARNING, logger="pipeline"), RunLock(root) as lock:
        plan = migrate(root, lock=lock)
    assert plan.state == "unfinished"
    lines = migrate_lines(caplog.text)
    assert len(lines) == 1 and "not a result" in lines[0], caplog.text
    assert sorted(os.listdir(out)) == ["_kpca-dask.json", "notes.txt", "work"]
    assert (out / "notes.txt").read_text() == "mine"
    assert tree_bytes(out / "work", exclude=()) == work
