"""Fixtures of the safety tests: a published run to copy, and a world of the user's files
(a canary file, a victim folder outside the output) whose bytes must survive."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.helpers import blobs


def tree_hashes(*roots: Path) -> dict[str, str]:
    """SHA-256 of every file (and the target text of every link) under ``roots``, by path,
    never following links: what must survive byte for byte."""
    out = {}
    for root in roots:
        if not os.path.lexists(root):
            continue
        paths = [root]
        while paths:
            p = paths.pop()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[str(p)] = "link:" + os.readlink(p)
            elif stat.S_ISDIR(st.st_mode):
                out[str(p)] = "dir"
                paths += [Path(e.path) for e in os.scandir(p)]
            else:
                out[str(p)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


# A complete run of 300 x 5 rows (x.npy) with a 20-row batch new.npy beside it, made once
# per module: the same fixture as the publishing tests'.
from tests.reliability.test_atomic_publish import published  # noqa: E402,F401,I001


class World:
    """A copy of the published run in tmp, the user's canary and victim beside it."""

    def __init__(self, tmp: Path, published: Path):
        self.tmp = tmp
        shutil.copytree(published, tmp / "data", symlinks=True)
        self.data = tmp / "data"
        self.run = self.data / "out"
        self.x = self.data / "x.npy"
        self.new = self.data / "new.npy"
        self.canary = tmp / "canary.txt"
        self.canary.write_bytes(b"the user's canary\n")
        self.victim = tmp / "victim"
        (self.victim / "deep").mkdir(parents=True)
        (self.victim / "precious.txt").write_bytes(b"not yours\n")
        (self.victim / "deep" / "data.npy").write_bytes(np.arange(5.0).tobytes())
        self.work = tmp / "cwd"  # the current folder of the commands
        self.work.mkdir()
        (self.work / "keep.txt").write_bytes(b"cwd file\n")

    def user_files(self) -> dict[str, str]:
        return tree_hashes(self.canary, self.victim, self.work, self.x, self.new)

    def run_manifest(self) -> bytes:
        return (self.run / "manifest.json").read_bytes()


@pytest.fixture
def world(tmp_path, published, monkeypatch):
    w = World(tmp_path, published)
    monkeypatch.chdir(w.work)
    return w


def kpca(*args) -> tuple[int, str]:
    """The ``kpca`` command in this process (on the current Dask client): exit code, stderr."""
    from flows.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()


def error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


def new_batch(folder: Path, seed: int = 1, rows: int = 20) -> Path:
    p = folder / f"batch{seed}.npy"
    np.save(p, blobs(rows, 5, seed=seed))
    return p
