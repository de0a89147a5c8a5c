"""The GCS and Azure Blob emulators as processes on 127.0.0.1, like the S3 server.

- ``gcp-storage-emulator`` (PyPI, the ``test`` extra): started in memory through
  ``python -m tests.objectstore.gcs_emulator start``, which mends its multipart-upload
  parser (it dropped an object's last byte when that was ``\r``). gcsfs reaches it
  through ``storage_options`` ``{"endpoint_url": ..., "token": "anon"}``;
  ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` in the environment (read by gcsfs when it
  is imported) keeps gcsfs from asking Google's storage-control API what
  kind each bucket is, which an emulator cannot answer (a minute per bucket).
- ``azurite`` (npm): installed once with ``npm install --prefix <cache> azurite@3`` into
  ``$KPCA_TEST_CACHE`` (default ``~/.cache/kpca-dask-tests``), then started from there, in
  memory. adlfs only ever speaks https to an ``account_host``, so the az:// tests reach
  azurite through the fault proxy terminating TLS with a self-signed certificate made here
  (trusted through ``SSL_CERT_FILE``); the endpoint is in ``storage_options``
  (``account_name``, ``account_host``) and the account key (azurite's public, documented
  development key) in the environment, where adlfs reads it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

#: azurite's documented development account (public: the same in every azurite)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_PACKAGE = "azurite@3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_dir() -> Path:
    return Path(os.environ.get("KPCA_TEST_CACHE") or Path.home() / ".cache" / "kpca-dask-tests")


@dataclass
class Emulator:
    endpoint: str
    process: subprocess.Popen = field(repr=False)
    log: Path | None = None


def _wait(proc: subprocess.Popen, url: str, timeout: float, what: str, ok=(200,)) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} at start")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return
            # an answer: it is up (azurite answers 400 to a bare GET)
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{what} did not answer on {url} in {timeout} s") from exc
            time.sleep(0.2)


def stop(emulator: Emulator) -> None:
    emulator.process.terminate()
    try:
        emulator.process.wait(10)
    except subprocess.TimeoutExpired:
        emulator.process.kill()
        emulator.process.wait()


# ------------------------------------------------------------------------------- GCS
def start_gcs_emulator(timeout: float = 60.0) -> Emulator:
    port = free_port()
    # our launcher: the emulator with a multipart parser that keeps an object's last
    # byte when it is "\r" (tests/objectstore/gcs_emulator.py)
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.objectstore.gcs_emulator", "start", "--host"]
        + ["127.0.0.1", "--port", str(port), "--in-memory", "--quiet"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    _wait(proc, f"{endpoint}/storage/v1/b?project=test", timeout, "gcp-storage-emulator")
    return Emulator(endpoint, proc)


# ----------------------------------------------------------------------------- Azure
def azurite_command(timeout: float = 600.0) -> list[str]:
    """The azurite-blob command: on PATH, else installed once into the cache folder."""
    found = shutil.which("azurite-blob")
    if found:
        return [found]
    prefix = cache_dir() / "azurite"
    main = prefix / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    if not main.exists():
        npm = shutil.which("npm")
        node = shutil.which("node")
        if not (npm and node):
            raise RuntimeError("azurite needs node and npm on PATH (apt-get install npm)")
        prefix.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund"]
            + ["--loglevel=error", AZURITE_PACKAGE],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if res.returncode != 0 or not main.exists():
            raise RuntimeError(f"npm install {AZURITE_PACKAGE} failed: {res.stderr[-2000:]}")
    return [shutil.which("node") or "node", str(main)]


def start_azurite(folder: Path, timeout: float = 60.0) -> Emulator:
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "azurite.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            azurite_command()
            + ["--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
            + ["--skipApiVersionCheck", "--disableTelemetry", "--silent"],
            cwd=folder,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    _wait(proc, f"{endpoint}/{AZURITE_ACCOUNT}?comp=list", timeout, "azurite")
    return Emulator(endpoint, proc, log)


def self_signed_cert(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (and localhost) and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(certfile), str(keyfile)
