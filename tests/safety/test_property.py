"""Property (issue 19): over output paths and the states of what is there -- nothing, an
empty folder, our run, our transform output, the user's files, links in and out, the
input itself, the current folder -- `kpca transform` and `kpca run` never remove or
change a file outside their output, nor a file of the user's inside it; and when they
fail, an output of ours that was there is still there, byte for byte."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.output.export import verify_run
from pipeline.runner.run import run_pipeline
from tests.published import version_dir
from tests.reliability.helpers import small_config

from .conftest import kpca, tree_hashes

STATES = [
    "missing",
    "empty",
    "foreign",
    "foreign beside",
    "our run",
    "model run",
    "our transform",
    "link out",
    "run with link in",
    "input",
    "input folder",
    "file",
    "empty path",
    "dot",
]
COMMANDS = ["transform", "transform parquet", "run"]


def _make(ex: Path, state: str, command: str, published_transform: Path) -> tuple[str, set]:
    """Build ``state`` under ``ex``; returns the output argument and the paths of the
    user's files inside it (which must survive)."""
    data = ex / "data"
    suffix = ".parquet" if command == "transform parquet" else ".zarr"
    target = ex / f"target{suffix}"
    foreign: set[str] = set()
    if state == "empty":
        target.mkdir()
    elif state in ("foreign", "foreign beside"):
        target.mkdir()
        names = (
            ["notes.txt"]
            if state == "foreign beside"
            else ["model", "embedding.parquet", "notes.txt"]
        )
        for n in names:
            if n.endswith(".txt"):
                (target / n).write_bytes(b"user notes\n")
            else:
                (target / n).mkdir()
                (target / n / "theirs.bin").write_bytes(os.urandom(32))
        foreign = set(tree_hashes(target)) - {str(target)}
    elif state == "our run":
        shutil.copytree(data / "out", target, symlinks=True)
    elif state == "model run":
        target = data / "out"
    elif state == "our transform":
        shutil.copytree(published_transform, target, symlinks=True)
    elif state == "link out":
        target.symlink_to(ex / "victim", target_is_directory=True)
    elif state == "run with link in":
        shutil.copytree(data / "out", target, symlinks=True)
        inside = version_dir(target) / "embedding.parquet"
        shutil.rmtree(inside)
        inside.symlink_to(ex / "victim", target_is_directory=True)
        foreign = {str(inside)}
    elif state == "input":
        target = data / ("x.npy" if command == "run" else "new.npy")
    elif state == "input folder":
        target = data
    elif state == "file":
        target.write_bytes(b"a file of the user's\n")
        foreign = {str(target)}
    elif state == "empty path":
        return "", foreign
    elif state == "dot":
        return ".", foreign
    return str(target), foreign


@pytest.fixture(scope="module")
def published_transform(published, tmp_path_factory, dask_cluster):
    from distributed import Client

    folder = tmp_path_factory.mktemp("transform")
    with Client(dask_cluster):
        rc, err = kpca(
            "transform",
            published / "out",
            published / "new.npy",
            folder / "emb.zarr",
            "--no-progress",
        )
    assert rc == 0, err
    return folder / "emb.zarr"


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    state=st.sampled_from(STATES), command=st.sampled_from(COMMANDS), overwrite=st.booleans()
)
@pytest.mark.slow  # ~17 s of generated cases
def test_no_file_outside_the_output_or_of_the_user_inside_it_changes(
    published,
    published_transform,
    dask_client,
    tmp_path,
    monkeypatch,
    state,
    command,
    overwrite,
):
    ex = Path(tempfile.mkdtemp(dir=tmp_path))
    shutil.copytree(published, ex / "data", symlinks=True)
    (ex / "victim" / "deep").mkdir(parents=True)
    (ex / "victim" / "deep" / "v.bin").write_bytes(os.urandom(64))
    (ex / "canary.txt").write_bytes(b"canary\n")
    (ex / "cwd").mkdir()
    (ex / "cwd" / "keep.txt").write_bytes(b"keep\n")
    monkeypatch.chdir(ex / "cwd")
    output, foreign = _make(ex, state, command, published_transform)

    out_path = Path(os.path.abspath(output)) if output else None
    everything = tree_hashes(ex)

    # outside the output: every path not at or below it (lexically: a link's target is
    # outside, and must not change)
    def outside(h):
        if out_path is None or output in ("", "."):
            return dict(h)
        return {
            k: v
            for k, v in h.items()
            if not (k == str(out_path) or k.startswith(str(out_path) + os.sep))
        }

    mine_before = {k: everything[k] for k in foreign if k in everything}
    ours_before = {
        k: v
        for k, v in everything.items()
        if out_path is not None
        and k.startswith(str(out_path) + os.sep)
        and "/work/" not in k
        and k not in foreign
    }

    if command == "run":
        try:
            run_pipeline(
                small_config(
                    ex / "data", ex / "unused", output={"path": output, "overwrite": overwrite}
                )
            )
            ok = True
        except Exception as exc:  # refused or failed: one line of our own
            ok = False
            assert "\n" not in str(exc).strip(), exc
    else:
        args = [
            "transform",
            ex / "data" / "out",
            ex / "data" / "new.npy",
            output,
            "--no-progress",
        ] + (["--overwrite"] if overwrite else [])
        rc, err = kpca(*args)
        ok = rc == 0
        if not ok:
            assert rc == 2 and "Traceback" not in err, err[-2000:]

    after = tree_hashes(ex)
    assert outside(after) == outside(everything), (state, command, overwrite)
    assert {k: after.get(k) for k in mine_before} == mine_before, (state, command)
    if not ok and state in ("our run", "our transform", "model run"):
        assert {k: after.get(k) for k in ours_before} == ours_before, (state, command)
    if ok and command == "run":
        verify_run(output)
    # unsafe states never succeed
    unsafe = {
        "empty path",
        "dot",
        "input",
        "input folder",
        "link out",
        "run with link in",
        "file",
        "foreign",
    }
    unsafe |= (
        {"our transform"} if command == "run" else {"model run", "our run", "foreign beside"}
    )
    if state in unsafe:
        assert not ok, (state, command, overwrite)
