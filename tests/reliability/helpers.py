"""Real processes for the reliability tests: the pipeline command, `dask scheduler` and
`dask worker` processes on 127.0.0.1, and helpers to compare two runs' artifacts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]

#: BLAS single-threaded in every process we start (the nanny does this for its
#: workers; ``--no-nanny`` workers and the driver get it here), so that results
#: never depend on how BLAS splits a product across threads.
SINGLE_THREADED = {
    v: "1"
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
}


def _dask_cli() -> str:
    """The ``dask`` command of this interpreter's environment (also when it is not on PATH)."""
    import shutil
    import sys
    from pathlib import Path

    here = Path(sys.executable).with_name("dask")
    return str(here) if here.exists() else (shutil.which("dask") or "dask")


def env(**extra: str) -> dict[str, str]:
    e = {**os.environ, **SINGLE_THREADED, "PYTHONPATH": str(ROOT), **extra}
    e.pop("DASK_SCHEDULER_ADDRESS", None)
    return e


# ------------------------------------------------------------------ the command
def start_job(argv: list[str], log: Path) -> subprocess.Popen:
    """A batch job in its own session (so ``os.killpg(job.pid, ...)`` reaches it and its
    local cluster, and nothing else), its output in ``log``."""
    with open(log, "w") as f:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_command(config: Path, *extra: str) -> list[str]:
    """``kpca run CONFIG`` as a batch job runs it, without the Prefect flow (the flows have
    their own tests; here the subject is the pipeline process and its cluster)."""
    return [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        str(config),
        "--no-progress",
        "--no-prefect",
        *extra,
    ]


def kpca(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The ``kpca`` command line in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, args)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------ data and config
def with_stacks(stderr: str) -> str:
    """A failed command's stderr tail, and the stacks of any local worker that it says
    stopped answering (pipeline/runtime/stacks.py): where it hung, in the test's report."""
    import re

    out = stderr[-3000:]
    for path in re.findall(r"its threads' stacks are in (\S+)", stderr):
        with contextlib.suppress(OSError):
            out += f"\n--- {path}:\n" + Path(path).read_text()[-6000:]
    return out


def blobs(n: int = 3000, d: int = 40, seed: int = 0) -> np.ndarray:
    """Well-separated clusters: a clear spectral gap, so the solver converges in few passes."""
    from sklearn.datasets import make_blobs

    return make_blobs(n, n_features=d, centers=5, cluster_std=2.0, random_state=seed)[0]


def write_config(path: Path, data: Path, out: Path, **sections: dict) -> Path:
    cfg = {
        "input": {"path": str(data)},
        "kernel": {"name": "rbf", "gamma": 0.002},
        "solver": {
            "n_components": 4,
            "eigen_solver": "randomized",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.2, "block_rows": 200},
        "kernel_store": {"materialize": "always"},
        "output": {"path": str(out), "parquet": True},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 2, "dashboard_address": None},
    }
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(yaml.safe_dump(cfg))
    return path


def small_config(folder: Path, out: Path, **over: dict):
    """A validated config for 300 x 5 rows at ``folder/x.npy`` (recomputed kernel, Parquet)."""
    from pipeline.config import load_config

    cfg: dict = {
        "input": {"path": str(folder / "x.npy")},
        "kernel": {"name": "rbf", "gamma": 0.05},
        "solver": {"n_components": 3, "eigen_solver": "randomized", "dtype": "float64"},
        "chunks": {"target_chunk_mb": 0.01, "block_rows": 100},
        "kernel_store": {"materialize": "never"},
        "output": {"path": str(out), "parquet": True},
        "evaluate": {"enabled": False},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    return load_config(cfg)


def make_published_run(folder: Path) -> Path:
    """A complete, verified run of 300 x 5 rows (on the current Dask client) at folder/out."""
    from pipeline.output.export import verify_run
    from pipeline.runner.run import run_pipeline

    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", blobs(300, 5))
    np.save(folder / "new.npy", blobs(20, 5, seed=1))
    run_pipeline(small_config(folder, folder / "out"))
    verify_run(folder / "out")
    return folder / "out"


# ------------------------------------------------------------------ observing a run
def done_blocks(out: Path) -> int:
    """Kernel blocks whose done marker is written (one chunk file each)."""
    return len(list((out / "work" / "kernel.zarr" / "done" / "c").glob("*/*")))


def wait_until(pred, timeout: float, interval: float = 0.005, proc=None) -> bool:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if pred():
            return True
        if proc is not None and proc.poll() is not None:
            return bool(pred())
        time.sleep(interval)
    return False


def artifacts(out: Path) -> dict:
    """What must be identical between two runs of the same config: every published
    array's checksum, the model's, the stored kernel matrix's bytes, the Parquet rows."""
    import pandas as pd
    import zarr

    from pipeline.output.export import verify_run

    m = verify_run(out)
    res = {
        "arrays": m["checksums"],
        "model": m["model"]["checksums"],
        "input": m["input"]["fingerprint"],
        "n_components": m["model"]["n_components"],
    }
    k = out / "work" / "kernel.zarr"
    if k.exists():
        K = zarr.open_group(str(k), mode="r")["K"][...]
        res["kernel"] = hashlib.sha256(np.ascontiguousarray(K).tobytes()).hexdigest()
    from pipeline.output.export import open_run

    pq = open_run(out, check_arrays=False).location.local_path / "embedding.parquet"
    if pq.exists():
        df = pd.read_parquet(pq).sort_values("id").reset_index(drop=True)
        res["parquet"] = hashlib.sha256(
            pd.util.hash_pandas_object(df).values.tobytes()
        ).hexdigest()
    return res


# ------------------------------------------------------------------ a real cluster
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ExternalCluster:
    """``dask scheduler`` + ``dask worker`` processes, each its own OS process."""

    address: str
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)
    security: object = None

    def client(self, **kw):
        from distributed import Client

        return Client(self.address, security=self.security, timeout=30, **kw)

    def n_workers(self) -> int:
        with self.client() as c:
            return len(c.scheduler_info()["workers"])


@contextlib.contextmanager
def external_cluster(
    tmp: Path,
    n_workers: int = 3,
    *,
    nanny: bool = False,
    tls: dict[str, Path] | None = None,
    memory_limit: str = "2GiB",
    wait: bool = True,
) -> Iterator[ExternalCluster]:
    """Start a scheduler and ``n_workers`` single-threaded workers on 127.0.0.1.

    ``tls``: {"ca", "cert", "key"} PEM files; the scheduler then listens on
    tls:// only and every process presents a certificate signed by the CA.
    Every process is ended by its own pid on exit.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proto = "tls" if tls else "tcp"
    address = f"{proto}://127.0.0.1:{port}"
    tls_args: list[str] = []
    security = None
    if tls:
        from distributed import Security

        tls_args = [
            "--tls-ca-file",
            str(tls["ca"]),
            "--tls-cert",
            str(tls["cert"]),
            "--tls-key",
            str(tls["key"]),
        ]
        security = Security(
            tls_ca_file=str(tls["ca"]),
            tls_client_cert=str(tls["cert"]),
            tls_client_key=str(tls["key"]),
            require_encryption=True,
        )
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen] = []

    def start(args, name):
        f = open(logs / f"{name}.log", "w")
        p = subprocess.Popen(args, env=env(), stdout=f, stderr=subprocess.STDOUT, cwd=tmp)
        procs.append(p)
        return p

    try:
        sched = start(
            [
                _dask_cli(),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--protocol",
                proto,
                "--no-dashboard",
                *tls_args,
            ],
            "scheduler",
        )
        workers = [
            start(
                [
                    _dask_cli(),
                    "worker",
                    address,
                    "--host",
                    "127.0.0.1",
                    "--nthreads",
                    "1",
                    "--memory-limit",
                    memory_limit,
                    "--no-dashboard",
                    "--local-directory",
                    str(tmp / f"w{i}"),
                    "--nanny" if nanny else "--no-nanny",
                    *tls_args,
                ],
                f"worker{i}",
            )
            for i in range(n_workers)
        ]
        cluster = ExternalCluster(address, sched, workers, security)
        if wait:
            t_end = time.monotonic() + 60
            while True:
                try:
                    with cluster.client() as c:
                        c.wait_for_workers(n_workers, timeout=max(1, t_end - time.monotonic()))
                    break
                except OSError as err:
                    if time.monotonic() > t_end or sched.poll() is not None:
                        raise RuntimeError(
                            "scheduler did not start: "
                            + (logs / "scheduler.log").read_text()[-2000:]
                        ) from err
                    time.sleep(0.3)
        yield cluster
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=20)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL one process we started, by its pid."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=20)


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
