"""Workers that share nothing with the client: a test harness (issue 14).

On a real cluster the client, the scheduler and the workers run on different machines and
share only what is mounted on every node, or an object store. Here each ``dask scheduler``
and ``dask worker`` process is started under ``unshare --mount --propagation private``
with a private, empty tmpfs mounted over the folders the client uses (the test's tmp
folder): the process sees an empty folder where the client has its data, and what it
writes there stays in its own namespace and is gone when it exits. Nothing else of the
machine is hidden (the interpreter, the code and 127.0.0.1 stay reachable), as on cluster
nodes that run the same image.

Mount namespaces need root (CAP_SYS_ADMIN): :func:`isolation_unavailable` gives the reason
to skip with where the tests do not run as root. Every process is ended by its own pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.reliability.helpers import _dask_cli, env, free_port

__all__ = [
    "IsolatedCluster",
    "isolated_cluster",
    "isolated_command",
    "isolation_unavailable",
]

#: exit status of the wrapper when the private mount cannot be made
MOUNT_FAILED = 97

#: the wrapper run by ``unshare``: mount a private tmpfs over each folder given before
#: ``--``, then become the command after it (same pid: a signal reaches the command)
_WRAPPER = (
    'while [ "$1" != "--" ]; do '
    f'mount -t tmpfs -o size=512m,mode=1777 kpca-private "$1" || exit {MOUNT_FAILED}; '
    'shift; done; shift; exec "$@"'
)


def isolation_unavailable() -> str | None:
    """Why isolated workers cannot be started here (None: they can)."""
    if os.geteuid() != 0:
        return (
            "isolated workers need root: each worker runs in its own mount namespace "
            "(unshare -m) with a private tmpfs over the client's folder"
        )
    if shutil.which("unshare") is None:
        return "isolated workers need util-linux's unshare, which is not installed"
    return None


def isolated_command(args: list[str], hidden: list[Path]) -> list[str]:
    """``args`` run in a new mount namespace where every folder of ``hidden`` is an empty
    private tmpfs (the folders must exist)."""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _WRAPPER,
        "kpca-isolated",
        *map(str, hidden),
        "--",
        *map(str, args),
    ]


@dataclass
class IsolatedCluster:
    """A scheduler and workers, each in its own mount namespace (see the module doc)."""

    address: str
    hidden: list[Path]
    logs: Path
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "w") as f:
            p = subprocess.Popen(
                isolated_command(args, self.hidden),
                env=env(**self.extra_env),
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd="/",
            )
        self._procs.append(p)
        return p

    def add_worker(self, wait: bool = True) -> subprocess.Popen:
        """Start one more isolated single-threaded worker (no nanny: its pid is the
        worker's); returns its process (``wait``: once the scheduler counts it)."""
        before = self.n_workers() if wait else 0
        i = len(self.workers)
        p = self._start(
            [
                _dask_cli(),
                "worker",
                self.address,
                "--host",
                "127.0.0.1",
                "--nthreads",
                "1",
                "--memory-limit",
                "1GiB",
                "--no-dashboard",
                "--no-nanny",
                # inside the private tmpfs: the worker's own disk, as on another node
                "--local-directory",
                str(self.hidden[0] / f".worker-{i}"),
            ],
            f"worker{i}",
        )
        self.workers.append(p)
        if wait:
            self.wait_for_workers(before + 1, proc=p, name=f"worker{i}")
        return p

    def client(self, **kw):
        from distributed import Client

        return Client(self.address, timeout=30, **kw)

    def n_workers(self) -> int:
        with self.client() as c:
            return len(c.scheduler_info()["workers"])

    def wait_for_workers(self, n: int, *, proc=None, name: str = "", timeout=60) -> None:
        t_end = time.monotonic() + timeout
        while self.n_workers() < n:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}: "
                    + (self.logs / f"{name}.log").read_text()[-2000:]
                )
            if time.monotonic() > t_end:
                raise RuntimeError(f"{n} workers did not connect in {timeout} s")
            time.sleep(0.2)

    def sees(self, path: Path) -> dict[str, bool]:
        """Whether each worker sees ``path`` (by worker address): the isolation, checked."""
        with self.client() as c:
            return c.run(os.path.exists, str(path))


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL one process we started, by its pid."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=20)


@contextlib.contextmanager
def isolated_cluster(
    hidden: list[Path], logs: Path, n_workers: int = 2, extra_env: dict | None = None
) -> Iterator[IsolatedCluster]:
    """A scheduler and ``n_workers`` workers on 127.0.0.1 that cannot see ``hidden``
    (folders of the client's: each process has an empty private tmpfs there);
    ``extra_env``: added to the processes' environment (e.g. object-store credentials)."""
    reason = isolation_unavailable()
    if reason:
        raise RuntimeError(reason)
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    cluster = IsolatedCluster(
        address, [Path(h) for h in hidden], logs, None, extra_env=dict(extra_env or {})
    )  # type: ignore[arg-type]
    try:
        cluster.scheduler = cluster._start(
            [
                _dask_cli(),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-dashboard",
            ],
            "scheduler",
        )
        t_end = time.monotonic() + 60
        while True:
            try:
                cluster.n_workers()
                break
            except OSError as err:
                if time.monotonic() > t_end or cluster.scheduler.poll() is not None:
                    raise RuntimeError(
                        "scheduler did not start: "
                        + (logs / "scheduler.log").read_text()[-2000:]
                    ) from err
                time.sleep(0.3)
        started = [cluster.add_worker(wait=False) for _ in range(n_workers)]
        for i, p in enumerate(started):
            cluster.wait_for_workers(i + 1, proc=p, name=f"worker{i}")
        yield cluster
    finally:
        for p in reversed(cluster._procs):
            if p.poll() is None:
                p.kill()
        for p in cluster._procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=20)
