"""A real `prefect server start` process on 127.0.0.1, for tests.

It runs in its own session, and the kernel sends it SIGTERM when the process that
started it dies (``PR_SET_PDEATHSIG``), so a killed pytest leaves no server behind; on a
normal exit its whole process group is stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

PREFECT = [sys.executable, "-m", "prefect"]
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path, api: str, **extra: str) -> dict[str, str]:
    """The environment without any PREFECT_ setting of the caller's, plus the server's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_URL=api,
        PREFECT_UI_ENABLED="false",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        **extra,
    )
    return env


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def prefect_server(
    home: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[str, dict[str, str], Path]]:
    """Start a server with its database under ``home``: (API URL, environment, log path).

    ``env`` is the server's whole environment (from :func:`server_env`); it listens on
    the port its PREFECT_API_URL names. By default: a free port.
    """
    if env is None:
        env = server_env(home, f"http://127.0.0.1:{free_port()}/api")
    api = env["PREFECT_API_URL"]
    port = int(api.rsplit(":", 1)[1].split("/", 1)[0])
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            PREFECT + ["server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the Prefect server exited: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect server did not answer on {api} in 180 s")
            time.sleep(0.5)
        yield api, env, log_path
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        with contextlib.suppress(ProcessLookupError):  # anything it left in its group
            os.killpg(server.pid, signal.SIGKILL)
