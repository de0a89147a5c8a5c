"""The embedding's Parquet part: the project stage's writer against pyarrow's defaults.

    python benchmarks/bench_parquet_write.py [--rows 65536 262144 500000 1048576] [--out F]

One row chunk of an embedding as ``pipeline.embed.parquet`` writes it (an int64 ``id``,
16 float32 components, a ``train``/``test`` text ``split``), built into a pandas frame and
written to memory, twice for each row count and side by side in one process:

- ``default``: ``to_parquet`` with pyarrow's defaults (dictionary pages tried on every
  column: what the stage wrote before 2026-11-28);
- ``pipeline``: the stage's writer options (dictionary pages for the text columns only,
  ``pipeline.embed.parquet.DICTIONARY_COLUMNS``).

Reported per row count: the best of 3 seconds of each, the ratio, the file sizes, and the
rate ``kpca calibrate`` now times for the plan (``parquet_write``) at that size. The bytes of
a rate are the plan's (8 + 4 x 16 a row).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _results import fresh  # noqa: E402 - benchmarks/ is on sys.path: the script's folder

from kpca_dask.cost.calibration import _cpu_model  # noqa: E402
from kpca_dask.cost.calibration_io import _parquet_rate  # noqa: E402
from pipeline.embed.parquet import DICTIONARY_COLUMNS, _frame, component_names  # noqa: E402

COMPONENTS = 16


def _write(df: pd.DataFrame, options: dict) -> tuple[float, int]:
    buf = io.BytesIO()
    t0 = time.perf_counter()
    df.to_parquet(buf, index=False, **options)
    return time.perf_counter() - t0, len(buf.getvalue())


def measure(rows: int, reps: int = 3) -> dict:
    rng = np.random.default_rng(rows)
    emb = rng.standard_normal((rows, COMPONENTS)).astype("float32")
    split = (rng.random(rows) < 0.8).astype(np.uint8)
    cols = component_names(COMPONENTS)
    ways = {"default": {}, "pipeline": {"use_dictionary": list(DICTIONARY_COLUMNS)}}
    best = {k: float("inf") for k in ways}
    size = {}
    for _ in range(reps):
        for name, options in ways.items():  # interleaved: the same machine state for both
            t0 = time.perf_counter()
            df = _frame(emb, None, None, split, None, 0, cols)
            build = time.perf_counter() - t0
            secs, size[name] = _write(df, options)
            best[name] = min(best[name], build + secs)
    nbytes = rows * (8 + 4 * COMPONENTS)
    return {
        "rows": rows,
        "seconds": best,
        "default_over_pipeline": best["default"] / best["pipeline"],
        "file_bytes": size,
        "rate_pipeline": nbytes / best["pipeline"],
        "rate_calibrated": _parquet_rate(rows, COMPONENTS),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[65536, 262144, 500000, 1048576])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    cpu, simd = _cpu_model()
    results = [measure(r) for r in args.rows]
    print(f"{cpu}, {simd}")
    print("| rows | pyarrow defaults | the stage's writer | ratio | MB (defaults / stage) |")
    print("|---|---|---|---|---|")
    for r in results:
        s, f = r["seconds"], r["file_bytes"]
        print(
            f"| {r['rows']} | {s['default']:.3f} s | {s['pipeline']:.3f} s | "
            f"{r['default_over_pipeline']:.2f}x | {f['default'] / 1e6:.1f} / "
            f"{f['pipeline'] / 1e6:.1f} |"
        )
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    out = args.out or fresh(ROOT / "benchmarks" / "results" / f"parquet-write-{date}.json")
    out.write_text(
        json.dumps(
            {
                "command": "python benchmarks/bench_parquet_write.py " + " ".join(sys.argv[1:]),
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "cpu": cpu,
                "simd": simd,
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
