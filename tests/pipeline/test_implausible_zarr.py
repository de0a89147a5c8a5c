"""A zarr input whose ``zarr.json`` claims far more rows than its store holds (issue 36: a
shape edited to 1e12 rows grew the client to 22.6 GB and was OOM-killed with no line) is
refused in one line, in bounded memory and time, by ``kpca validate`` (before anything
starts) and by the reader itself (``kpca run``'s ingest, ``kpca transform``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

ROOT = Path(__file__).resolve().parents[2]
BIG = 10**12


def _claims_1e12_rows(path: Path) -> Path:
    z = zarr.create_array(str(path), shape=(200, 4), chunks=(50, 4), dtype="f8")
    z[...] = np.random.default_rng(0).standard_normal((200, 4))
    meta = json.loads((path / "zarr.json").read_text())
    meta["shape"][0] = BIG
    (path / "zarr.json").write_text(json.dumps(meta))
    return path


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # the address space is capped too, so that a regression fails fast with a
    # MemoryError instead of swapping the machine
    prog = (
        textwrap.dedent(
            """
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        """
        )
        + textwrap.dedent(code)
        + textwrap.dedent(
            """
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child of a
        # large pytest process would report the parent's peak (1.2 GB in a full run)
        hwm = next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
        print("PEAK_MB", int(hwm.split()[1]) / 1024)
        """
        )
    )
    return subprocess.run(
        [sys.executable, "-c", prog],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _peak(out: str) -> float:
    return float(out.split("PEAK_MB")[-1].split()[0])


@pytest.mark.cluster
@pytest.mark.parametrize("missing_chunks", ["error", "fill"])
def test_reader_refuses_a_shape_its_store_cannot_hold(tmp_path, missing_chunks):
    store = _claims_1e12_rows(tmp_path / "big.zarr")
    r = _run(
        f"""
        from pipeline.config import InputConfig
        from pipeline.data.readers import InputError, read_input
        try:
            read_input(InputConfig(path={str(store)!r}, missing_chunks={missing_chunks!r}))
        except InputError as exc:
            print("REFUSED", exc)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.split("REFUSED", 1)[1].split("PEAK_MB")[0].strip()
    assert "\n" not in line
    assert f"claims shape ({BIG}, 4)" in line
    assert "holds 4 chunk objects" in line and "'c/4/0', rows 200-249" in line
    assert "Restore the store" in line
    assert _peak(r.stdout) < 600  # MB: the interpreter with zarr and dask, nothing more


@pytest.mark.cluster
def test_the_estimator_refuses_a_zarr_array_its_store_cannot_hold(tmp_path):
    """``KernelPCA.fit(zarr_array)`` (no pipeline) on the same store: one
    InvalidInputError naming the claimed shape and the objects held, in bounded memory;
    the missing-chunk check enumerated the whole 2e10-chunk grid (a MemoryError under the
    address-space cap here, an endless loop without it)."""
    store = _claims_1e12_rows(tmp_path / "big.zarr")
    r = _run(
        f"""
        import zarr
        from kpca_dask import KernelPCA
        from kpca_dask.exceptions import InvalidInputError
        try:
            KernelPCA(2).fit(zarr.open_array({str(store)!r}, mode="r"))
        except InvalidInputError as exc:
            print("REFUSED", exc)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.split("REFUSED", 1)[1].split("PEAK_MB")[0].strip()
    assert "\n" not in line
    assert f"claims shape ({BIG}, 4)" in line and "big.zarr" in line
    assert "Restore the store" in line
    assert _peak(r.stdout) < 600  # MB


@pytest.mark.cluster
def test_validate_refuses_it_before_anything_starts(tmp_path):
    store = _claims_1e12_rows(tmp_path / "big.zarr")
    cfg = {
        "input": {"path": str(store)},
        "kernel": {"name": "rbf", "gamma": 0.1},
        "solver": {"n_components": 2},
        "output": {"path": str(tmp_path / "out")},
        "evaluate": {"enabled": False},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = _run(
        f"""
        from flows.cli import main
        try:
            print("EXIT", main(["validate", {str(tmp_path / "c.yaml")!r}]))
        except SystemExit as exc:
            print("EXIT", exc.code)
        """
    )
    assert "EXIT 2" in r.stdout, (r.stdout, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and f"claims shape ({BIG}, 4)" in lines[0], r.stderr
    assert "holds 4 chunk objects" in lines[0]
    assert _peak(r.stdout) < 600
    assert not (tmp_path / "out").exists()


def test_a_plausible_store_with_a_missing_chunk_keeps_its_exact_message(tmp_path):
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=(200, 4), chunks=(50, 4), dtype="f8")
    z[...] = 1.0
    (tmp_path / "x.zarr" / "c" / "3" / "0").unlink()
    from pipeline.config import InputConfig
    from pipeline.data.readers import InputError, read_input

    with pytest.raises(InputError, match=r"1 of 4 chunks is missing .*'c/3/0', rows 150-199"):
        read_input(InputConfig(path=str(tmp_path / "x.zarr")))
    src = read_input(InputConfig(path=str(tmp_path / "x.zarr"), missing_chunks="fill"))
    assert src.X.shape == (200, 4)
