"""One stream's write and read rates on the S3 server, three ways: over the same key
again, to new keys, and from a new client session each time (why ``kpca calibrate
--store`` writes new objects for each of its repeated measurements).

    python benchmarks/bench_store_overwrite.py [--mib 32] [--writes 4]

The server (moto, tests/objectstore/s3server.py) runs on the last core, the measurement on
the first (Linux CPU affinity), as ``bench_io.py --pin`` runs them. Prints MB/s per write
and per read; nothing is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--writes", type=int, default=4)
    args = ap.parse_args()

    import fsspec
    import numpy as np

    from tests.objectstore.s3server import start_s3_server, stop_s3_server

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[-1]})
    server = start_s3_server()
    os.sched_setaffinity(0, set(cores[:-1]) or {cores[0]})
    nbytes = args.mib << 20
    data = np.random.default_rng(2).integers(0, 255, nbytes, dtype=np.uint8).tobytes()

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    try:
        bucket = server.make_bucket(f"overwrite-{uuid.uuid4().hex[:6]}")
        url = f"s3://{bucket}"
        for mode in ("same key", "new keys", "new session", "same key", "new keys"):
            fs, root = fsspec.core.url_to_fs(url, **server.storage_options)
            w, r = [], []
            for _ in range(args.writes):
                if mode == "new session":
                    fs, root = fsspec.core.url_to_fs(
                        url, skip_instance_cache=True, **server.storage_options
                    )
                key = f"{root}/big" if mode == "same key" else f"{root}/{uuid.uuid4().hex}"
                w.append(timed(lambda key=key, fs=fs: fs.pipe_file(key, data)))
                r.append(timed(lambda key=key, fs=fs: fs.cat_file(key)))
            print(
                f"{mode:12s} write MB/s {[round(nbytes / 1e6 / t) for t in w]}  "
                f"read MB/s {[round(nbytes / 1e6 / t) for t in r]}",
                flush=True,
            )
    finally:
        stop_s3_server(server)


if __name__ == "__main__":
    main()
