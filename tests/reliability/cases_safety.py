"""Catalogue cases of issue 19 (deletion and publishing): outputs kpca must not write to,
replace or delete -- each refused in one line, nothing published, nothing of the user's
touched (the cleanups check the user's files survived byte for byte)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from .catalogue import Case, Ctx
from .helpers import blobs

RUN_D = 5


def _new(c: Ctx) -> Path:
    return c.npy(blobs(10, RUN_D, seed=3), "new.npy")


def _hashes(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            out[p] = (
                ("link:" + os.readlink(p))
                if os.path.islink(p)
                else hashlib.sha256(Path(p).read_bytes()).hexdigest()
            )
    return out


def _guard(c: Ctx, *paths: Path) -> None:
    """After the case: the user's ``paths`` are byte for byte as before."""
    before = {str(p): _hashes(p) if p.is_dir() else Path(p).read_bytes() for p in paths}

    def check():
        for p in paths:
            now = _hashes(p) if p.is_dir() else Path(p).read_bytes()
            assert now == before[str(p)], f"{p} changed"

    c.cleanups.append(check)


def _victim(c: Ctx) -> Path:
    v = c.dir / "victim"
    (v / "deep").mkdir(parents=True, exist_ok=True)
    (v / "precious.txt").write_text("not yours\n")
    (v / "deep" / "data.bin").write_bytes(b"\x00\x01\x02")
    _guard(c, v)
    return v


def _cwd(c: Ctx, name: str):
    """`kpca transform` run from a folder of the user's with output ``name``."""
    work = c.dir / "cwd"
    work.mkdir(exist_ok=True)
    (work / "keep.txt").write_text("the user's file\n")
    _guard(c, work)
    old = os.getcwd()
    os.chdir(work)
    c.cleanups.append(lambda: os.chdir(old))
    return ["transform", c.run, _new(c), name, "--overwrite"]


def _tr_input(c: Ctx):
    new = _new(c)
    _guard(c, new)
    return ["transform", c.run, new, new, "--overwrite"]


def _tr_model_run(c: Ctx):
    return ["transform", c.run, _new(c), c.run, "--overwrite"]


def _tr_other_run(c: Ctx):
    other = c.dir / "other-run"
    shutil.copytree(c.run, other)
    _guard(c, other)
    return ["transform", c.run, _new(c), other, "--overwrite"]


def _tr_foreign(c: Ctx):
    mine = c.dir / "mine.zarr"
    mine.mkdir()
    (mine / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    (mine / "notes.txt").write_text("mine\n")
    _guard(c, mine)
    return ["transform", c.run, _new(c), mine, "--overwrite"]


def _tr_link(c: Ctx):
    link = c.dir / "out.zarr"
    link.symlink_to(_victim(c), target_is_directory=True)
    return ["transform", c.run, _new(c), link, "--overwrite"]


def _tr_locked(c: Ctx):
    from pipeline.output.lock import RunLock
    from pipeline.output.store import Location

    lock = RunLock(Location(str(c.dir / "shared.zarr"))).__enter__()
    c.cleanups.append(lambda: lock.__exit__(None, None, None))
    return ["transform", c.run, _new(c), c.dir / "shared.zarr", "--overwrite"]


def _published_here(c: Ctx) -> None:
    shutil.copytree(c.run, c.out)
    c.existing_manifest = (c.out / "manifest.json").read_text()


def _run_link_inside(c: Ctx):
    from tests.published import version_dir

    _published_here(c)
    inside = version_dir(c.out) / "embedding.parquet"
    shutil.rmtree(inside)
    inside.symlink_to(_victim(c), target_is_directory=True)
    return ["run", c.config(c.npy(blobs(200, RUN_D))), "--overwrite"]


def _run_linked_file(name: str):
    def make(c: Ctx):
        _published_here(c)
        target = _victim(c) / "precious.txt"
        (c.out / name).unlink(missing_ok=True)
        (c.out / name).symlink_to(target)
        if name == "manifest.json":  # what "published" compares with: unchanged is not new
            c.existing_manifest = (c.out / name).read_text()
        return ["run", c.config(c.npy(blobs(200, RUN_D))), "--overwrite"]

    return make


def _run_users_folder(c: Ctx):
    (c.out / "model").mkdir(parents=True)
    (c.out / "model" / "weights.bin").write_bytes(b"\x07" * 32)
    (c.out / "embedding.parquet").mkdir()
    (c.out / "embedding.parquet" / "part.0.parquet").write_bytes(b"PAR1 theirs")
    _guard(c, c.out)
    return ["run", c.config(c.npy(blobs(200, RUN_D))), "--overwrite"]


def _run_over_input(c: Ctx):
    data = c.npy(blobs(200, RUN_D))
    _guard(c, data)
    return ["run", c.config(data, output={"path": str(c.dir)}), "--overwrite"]


def _run_typo(c: Ctx):
    _published_here(c)
    _guard(c, c.out / "manifest.json")
    return ["run", c.config(c.dir / "x-typo.npy"), "--overwrite"]


def _run_dot(c: Ctx):
    work = c.dir / "cwd"
    work.mkdir()
    (work / "keep.txt").write_text("the user's file\n")
    _guard(c, work)
    cfg = c.config(c.npy(blobs(200, RUN_D)), output={"path": "."})
    old = os.getcwd()
    os.chdir(work)
    c.cleanups.append(lambda: os.chdir(old))
    return ["run", cfg, "--overwrite"]


def _run_link_output(c: Ctx):
    link = c.dir / "linked-out"
    link.symlink_to(_victim(c), target_is_directory=True)
    return ["run", c.config(c.npy(blobs(200, RUN_D)), output={"path": str(link)})]


CASES = [
    Case(
        "safe-tr-empty-output",
        "transform",
        'transform output "" (an unset shell variable) with --overwrite',
        lambda c: _cwd(c, ""),
        ("names no new folder", "give the output a name of its own"),
    ),
    Case(
        "safe-tr-dot-output",
        "transform",
        'transform output "." with --overwrite',
        lambda c: _cwd(c, "."),
        ("names no new folder", "give the output a name of its own"),
    ),
    Case(
        "safe-tr-output-is-input",
        "transform",
        "transform output equal to its input, --overwrite",
        _tr_input,
        ("lies inside the input", "write the output somewhere else"),
    ),
    Case(
        "safe-tr-output-is-model-run",
        "transform",
        "transform output equal to the model's run folder",
        _tr_model_run,
        ("lies inside the model's run or folder", "write the output somewhere else"),
    ),
    Case(
        "safe-tr-output-is-a-run",
        "transform",
        "transform output equal to another run folder",
        _tr_other_run,
        ("is a kpca run folder", "write the transform output somewhere else"),
    ),
    Case(
        "safe-tr-output-foreign",
        "transform",
        "transform output is a folder kpca did not write, --overwrite",
        _tr_foreign,
        ("was not written by kpca transform", "choose another output path"),
    ),
    Case(
        "safe-tr-output-link",
        "transform",
        "transform output is a symbolic link to a folder",
        _tr_link,
        ("is a symbolic link", "choose another output path"),
    ),
    Case(
        "safe-tr-concurrent",
        "transform",
        "a second transform to an output another writer is writing",
        _tr_locked,
        ("is locked by a running job", "wait for it to finish"),
    ),
    Case(
        "safe-run-link-inside",
        "output",
        "embedding.parquet inside the published version is a link to another folder, "
        "--overwrite",
        _run_link_inside,
        ("embedding.parquet in the published version is a symbolic link", "remove it"),
    ),
    Case(
        "safe-run-linked-lock",
        "output",
        ".kpca-run.lock is a link to a file of the user's",
        _run_linked_file(".kpca-run.lock"),
        ("holds .kpca-run.lock, a symbolic link", "remove the link"),
    ),
    Case(
        "safe-run-linked-manifest",
        "output",
        "manifest.json is a link to a file of the user's, --overwrite",
        _run_linked_file("manifest.json"),
        ("holds manifest.json, a symbolic link", "remove the link"),
    ),
    Case(
        "safe-run-users-folder",
        "output",
        "output.path is a folder of the user's with their "
        "own model/ and embedding.parquet/, --overwrite",
        _run_users_folder,
        (
            "is not a kpca-dask run folder but holds 'embedding.parquet'",
            "choose an empty or new output.path",
        ),
    ),
    Case(
        "safe-run-output-over-input",
        "output",
        "output.path is the folder holding the input",
        _run_over_input,
        ("lies inside the input", "write the output somewhere else"),
    ),
    Case(
        "safe-run-typo-overwrite",
        "output",
        "--overwrite of a published run with a typo in input.path (the published run stays)",
        _run_typo,
        ("does not exist", "check input.path"),
    ),
    Case(
        "safe-run-dot-output",
        "output",
        'output.path "."',
        _run_dot,
        ("names no folder of its own", "set output.path to a new folder"),
    ),
    Case(
        "safe-run-link-output",
        "output",
        "output.path is a symbolic link to a folder",
        _run_link_output,
        ("is a symbolic link", "set output.path to the real folder"),
    ),
]
