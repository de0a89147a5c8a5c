"""A real S3-protocol server on 127.0.0.1 for the tests: moto's standalone server.

Started as a separate process (``python -m moto.server``), as s3fs's own tests do; nothing
is mocked in the test process. The endpoint reaches the pipeline only through
``storage_options`` (``{"client_kwargs": {"endpoint_url": ...}}``); the dummy credentials
live in the environment, where botocore reads them, never in a config or an artifact.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

#: Dummy credentials for the local server, exported in the environment only.
CREDENTIAL_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running moto server: its endpoint and a way to make buckets on it."""

    endpoint: str
    process: subprocess.Popen = field(repr=False)

    @property
    def storage_options(self) -> dict:
        """What a config's ``storage_options`` holds to reach this server (no credentials)."""
        return {"client_kwargs": {"endpoint_url": self.endpoint}}

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(
            client_kwargs={"endpoint_url": self.endpoint}, skip_instance_cache=True
        )

    def make_bucket(self, name: str) -> str:
        fs = self.filesystem()
        fs.mkdir(name)
        return name

    def reset(self) -> None:
        """Drop every bucket (moto's reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).read()


def start_s3_server(timeout: float = 30.0) -> S3Server:
    """Start ``python -m moto.server`` on a free port of 127.0.0.1 and wait until it answers."""
    port = _free_port()
    env = {**os.environ, **CREDENTIAL_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with code {proc.returncode} at start")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(
                    f"moto server did not answer on {endpoint} in {timeout} s"
                ) from exc
            time.sleep(0.2)
    return S3Server(endpoint=endpoint, process=proc)


def stop_s3_server(server: S3Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
