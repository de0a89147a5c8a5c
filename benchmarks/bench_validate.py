"""The cost of the full validation pass (pipeline/data/scan.py) that `kpca validate` and the
start of `kpca run`/`update`/`transform` make: every row read once, streaming.

    python benchmarks/bench_validate.py                  # 1 000 000 rows x 64, CSV + Parquet
    python benchmarks/bench_validate.py --rows 200000

Writes a CSV file and a Parquet file of ``--rows`` rows x ``--cols`` float64 features plus
an int64 id column above 2**53 and a text label, then times ``validate()`` (what `kpca
validate` runs: header, sample, and the full pass: row count, NaN/inf, text in numeric
columns, missing labels, id type and uniqueness) ``--repeat`` times and reports the best
and median seconds, the rows per second, and the file sizes. The data files go to
``--dir`` (default: a temporary folder, removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_data(folder: Path, rows: int, cols: int) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(rows, cols))
    df = pd.DataFrame(X, columns=[f"f{j}" for j in range(cols)])
    df.insert(0, "id", np.arange(2**53, 2**53 + rows, dtype=np.int64))
    df["label"] = np.asarray(["a", "b", "c"])[rng.integers(0, 3, rows)]
    paths = {"csv": folder / "big.csv", "parquet": folder / "big.parquet"}
    df.to_csv(paths["csv"], index=False, float_format="%.9g")
    df.to_parquet(paths["parquet"], index=False, row_group_size=128_000)
    return paths


def time_validate(path: Path, repeat: int) -> dict:
    from pipeline.config import load_config
    from pipeline.data.validate import validate

    cfg = load_config(
        {
            "input": {"path": str(path), "id_column": "id", "label_column": "label"},
            "output": {"path": str(path.parent / "out")},
        }
    )
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        v = validate(cfg, probe_output=False)
        times.append(time.perf_counter() - t0)
        assert v.ok, [f.message for f in v.errors]
    return {
        "rows": v.rows,
        "best_s": min(times),
        "median_s": statistics.median(times),
        "rows_per_s": v.rows / min(times),
        "bytes": path.stat().st_size,
        "id_type": v.id_type,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        t0 = time.perf_counter()
        paths = write_data(Path(d), args.rows, args.cols)
        print(f"wrote the data in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        res = {fmt: time_validate(p, args.repeat) for fmt, p in paths.items()}
    print(json.dumps({"rows": args.rows, "cols": args.cols, "results": res}, indent=2))


if __name__ == "__main__":
    main()
