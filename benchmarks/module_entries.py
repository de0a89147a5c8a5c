"""How far one small ``kpca update`` reaches into pipeline/ (issue 36): the distinct
pipeline modules whose code runs, and how many calls enter the output's store module.

    python benchmarks/module_entries.py [--keep DIR]

A small series is made in a temporary folder: 600 rows and a batch of 150 (NPY), a
Nyström config on a one-worker local cluster; ``kpca run CONFIG --no-prefect`` in a
subprocess, then ``kpca update RUN BATCH --no-prefect`` in this process under
``sys.setprofile`` (and ``threading.setprofile``): every Python call of this process's
threads is seen (the Dask workers' own processes are not). Printed: the number of
distinct modules of pipeline/ entered (a module's import counts: its body is a call), the
calls of functions defined in the store module (``pipeline/output/store.py``, before
issue 36 ``pipeline/output/store.py``) and how many of those come from another module, and the
modules with their call counts. The numbers are quoted in docs/design.md ("The run and
the update, in order").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = str(ROOT / "pipeline") + os.sep


def _series(folder: Path) -> tuple[Path, Path]:
    import numpy as np
    import yaml

    rng = np.random.default_rng(0)
    np.save(folder / "x.npy", rng.normal(size=(600, 4)))
    np.save(folder / "batch.npy", rng.normal(size=(150, 4)))
    cfg = {
        "input": {"path": str(folder / "x.npy")},
        "kernel": {"name": "rbf", "gamma": 0.2},
        "solver": {
            "n_components": 3,
            "eigen_solver": "nystroem",
            "n_landmarks": 40,
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01},
        "output": {"path": str(folder / "run")},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1},
    }
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config, folder / "batch.npy"


def _module(filename: str) -> str | None:
    if not filename.startswith(PIPELINE):
        return None
    rel = Path(filename).relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def measure(folder: Path) -> dict:
    config, batch = _series(folder)
    single = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env = {**os.environ, **single, "PYTHONPATH": str(ROOT)}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    cmd = [sys.executable, "-m", "flows.cli", "run", str(config), "--no-progress"]
    subprocess.run([*cmd, "--no-prefect"], cwd=ROOT, env=env, check=True, capture_output=True)

    calls: collections.Counter[str] = collections.Counter()
    entries: collections.Counter[str] = collections.Counter()  # calls from another module
    lock = threading.Lock()

    def profile(frame, event, arg):  # noqa: ARG001 (the profiler's signature)
        if event == "call" and (m := _module(frame.f_code.co_filename)):
            caller = frame.f_back
            outside = caller is None or caller.f_code.co_filename != frame.f_code.co_filename
            with lock:
                calls[m] += 1
                entries[m] += outside

    from flows.cli import main

    os.environ.update(single)
    argv = ["update", str(folder / "run"), str(batch), "--no-progress", "--no-prefect"]
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    store = next((m for m in calls if m.split(".")[-1] == "store" and "output" in m), None)
    store = store or "pipeline.output.store"
    return {
        "exit": code,
        "modules_entered": len(calls),
        "store_calls": calls.get(store, 0),
        "store_entries": entries.get(store, 0),
        "store_module": store,
        "calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", help="make the series in this folder (kept)")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    args = p.parse_args()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        result = measure(Path(args.keep))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = measure(Path(tmp))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"kpca update exit {result['exit']}")
        print(f"pipeline modules entered: {result['modules_entered']}")
        print(f"calls of {result['store_module']}'s functions: {result['store_calls']}")
        print(f"  of which from another module: {result['store_entries']}")
        for m, n in result["calls"].items():
            print(f"  {n:6d}  {m}")
    return 0 if result["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
