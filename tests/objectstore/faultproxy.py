"""A fault-injecting HTTP reverse proxy for the object-store tests (our own, no mocks).

Started as a separate process on 127.0.0.1 in front of a real store server (moto's S3
server, gcp-storage-emulator, azurite): clients are pointed at the proxy through their
``storage_options`` and every request is forwarded to the server as it came (method, path,
headers including ``Host``, body). A small control endpoint (plain HTTP, its own port)
switches faults on and off while a client, e.g. a ``kpca`` subprocess, keeps running:

- ``drop``: close the client's connection without an answer, mid-request: part of the body
  is read, nothing is forwarded (``where="request"``, the default); or after forwarding,
  mid-response: the server did the work, the client sees half an answer, or none when the
  answer has no body (``where="response"``);
- ``error``: answer ``HTTP 500`` (an S3/GCS/Azure-style error body) without forwarding;
  ``status`` picks another code (503: unavailable, 507: insufficient storage...);
- ``delay``: wait ``seconds`` and then forward.

A fault applies to the requests that match it (``methods``, default the writes PUT, POST,
DELETE and PATCH; ``path_contains``, a substring of the path and query, or of the object
name a GCS multipart upload carries in its body, as gcsfs writes every small object),
after ``after`` matching requests have passed, for ``times`` requests (``None``: until
cleared). The proxy counts every request and every fault it injected (``stats``), so a
test can also wait until a client is under way before switching a fault on. It also keeps
the first ``LOGGED`` requests it injected a fault into (method, path, the object name of
a multipart upload, and whether it was a server-side copy), so a test can show which
writes failed.

Optionally it terminates TLS (``certfile``/``keyfile``) and forwards plain HTTP: adlfs
always speaks https to an ``account_host``, so the az:// tests reach azurite this way.

Run: ``python -m tests.objectstore.faultproxy --upstream http://127.0.0.1:PORT
--ready-file F`` (writes ``{"port": ..., "control_port": ...}`` to F once listening).
The test-side handle is :class:`FaultProxy` (``start_proxy``/``stop_proxy``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

WRITE_METHODS = ("PUT", "POST", "DELETE", "PATCH")
MODES = ("drop", "error", "delay")
#: how many injected requests the proxy describes in its state
LOGGED = 200
#: request headers that make a write a server-side copy (S3/GCS-XML, Azure)
COPY_HEADERS = ("x-amz-copy-source", "x-goog-copy-source", "x-ms-copy-source")
#: headers that belong to one hop, never forwarded as they are
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
}
#: the error code an injected status's body names (S3/Azure-style XML)
ERROR_CODES = {500: "InternalError", 503: "ServiceUnavailable", 507: "InsufficientStorage"}


def error_body(status: int = 500) -> bytes:
    code = ERROR_CODES.get(status, "InternalError")
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        "<Message>fault injected by the test proxy</Message></Error>"
    ).encode()


ERROR_BODY = error_body(500)


class Faults:
    """The current fault rule and the counters (shared by the handler threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rule: dict | None = None
        self.matched = 0  # requests that matched the current rule
        self.requests: dict[str, int] = {}
        self.injected: dict[str, int] = {}
        self.log: list[dict] = []  # the first LOGGED requests a fault was injected into

    def set(self, rule: dict | None) -> None:
        if rule is not None:
            mode = rule.get("mode")
            if mode not in MODES:
                raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
            rule = {
                "mode": mode,
                "methods": [m.upper() for m in rule.get("methods") or WRITE_METHODS],
                "path_contains": rule.get("path_contains") or "",
                "after": int(rule.get("after") or 0),
                "times": None if rule.get("times") is None else int(rule["times"]),
                "where": rule.get("where") or "request",
                "seconds": float(rule.get("seconds") or 0.0),
                "status": int(rule.get("status") or 500),
            }
            if rule["where"] not in ("request", "response"):
                raise ValueError("where must be 'request' or 'response'")
        with self.lock:
            self.rule = rule
            self.matched = 0

    def decide(self, method: str, path: str, headers=None, name: str | None = None):
        """Count the request; the rule to apply to it (a dict), if any. ``name``: the
        object's name when the request carries it in its body (a GCS multipart upload),
        matched by ``path_contains`` as the path is."""
        with self.lock:
            self.requests[method] = self.requests.get(method, 0) + 1
            rule = self.rule
            if rule is None or method not in rule["methods"]:
                return None
            if rule["path_contains"] not in path and rule["path_contains"] not in (name or ""):
                return None
            self.matched += 1
            k = self.matched - rule["after"]
            if k <= 0 or (rule["times"] is not None and k > rule["times"]):
                return None
            self.injected[rule["mode"]] = self.injected.get(rule["mode"], 0) + 1
            if len(self.log) < LOGGED:
                copy = any(h in (headers or {}) for h in COPY_HEADERS) or "rewriteTo" in path
                entry = {"mode": rule["mode"], "method": method, "path": path, "copy": copy}
                if name is not None:
                    entry["object"] = name
                self.log.append(entry)
            return rule

    def state(self) -> dict:
        with self.lock:
            return {
                "rule": self.rule,
                "matched": self.matched,
                "requests": dict(self.requests),
                "injected": dict(self.injected),
                "injected_requests": list(self.log),
            }


_MULTIPART_NAME = re.compile(rb'"name"\s*:\s*("(?:[^"\\]|\\.)*")')


def multipart_object_name(body: bytes) -> str | None:
    """The object name a GCS JSON-API multipart upload carries in its metadata part (the
    first part of the body: ``{"name": "<object>", ...}``); None when there is none."""
    m = _MULTIPART_NAME.search(body[:65536])
    if m is None:
        return None
    try:
        return json.loads(m.group(1))
    except ValueError:
        return None


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kpca-faultproxy"
    upstream: tuple[str, int] = ("127.0.0.1", 0)
    faults: Faults
    tls: ssl.SSLContext | None = None

    def setup(self) -> None:
        if self.tls is not None:
            self.request = self.tls.wrap_socket(self.request, server_side=True)
        super().setup()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base's name
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (OSError, ssl.SSLError):
            pass  # a client that went away, or refused our certificate: its problem

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _drop(self) -> None:
        """Close the connection at once, with no answer (an RST, as a dying peer sends)."""
        self.close_connection = True
        try:
            self.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _proxy(self) -> None:
        method = self.command
        body = name = None
        if method == "POST" and "uploadType=multipart" in self.path:
            # gcsfs writes an object (every zarr chunk) as one multipart upload whose path
            # names only the bucket: the object's name is in the body's metadata part, so
            # the body is read before deciding (a drop then comes after the body, before
            # any answer: to the client, as much a dropped connection as one mid-body)
            body = self._read_body()
            name = multipart_object_name(body)
        rule = self.faults.decide(method, self.path, self.headers, name)
        if rule is not None and rule["mode"] == "drop" and rule["where"] == "request":
            n = int(self.headers.get("Content-Length") or 0)
            if body is None and n > 1:
                self.rfile.read(n // 2)  # mid-body: half of it arrived, then the line died
            self._drop()
            return
        if body is None:
            body = self._read_body()
        if rule is not None and rule["mode"] == "error":
            body = error_body(rule.get("status", 500))
            self.send_response(rule.get("status", 500))
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)
            return
        if rule is not None and rule["mode"] == "delay":
            time.sleep(rule["seconds"])
        conn = http.client.HTTPConnection(*self.upstream, timeout=300)
        try:
            conn.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                    conn.putheader(k, v)
            if body or method in WRITE_METHODS:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
        except OSError:
            self._drop()  # the server went away: so does the client's connection
            return
        finally:
            conn.close()
        if rule is not None and rule["mode"] == "drop" and len(data) < 2:
            self._drop()  # where == "response", nothing to cut in half: no answer at all
            return
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                self.send_header(k, v)
        if method == "HEAD" or resp.status in (204, 304):
            length = resp.getheader("Content-Length")
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            return
        if rule is not None and rule["mode"] == "drop":  # where == "response"
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self._drop()
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _proxy


class ControlHandler(BaseHTTPRequestHandler):
    """``GET /state``; ``POST /fault`` with a JSON rule (or ``null`` to clear)."""

    protocol_version = "HTTP/1.1"
    faults: Faults

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass

    def _answer(self, status: int, payload) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/state":
            return self._answer(404, {"error": f"no such control path {self.path}"})
        self._answer(200, self.faults.state())

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        try:
            rule = json.loads(self.rfile.read(n) or b"null")
            if self.path == "/fault":
                self.faults.set(rule)
            elif self.path == "/reset":
                self.faults.set(None)
                with self.faults.lock:
                    self.faults.requests.clear()
                    self.faults.injected.clear()
                    self.faults.log.clear()
            else:
                return self._answer(404, {"error": f"no such control path {self.path}"})
        except (ValueError, TypeError) as exc:
            return self._answer(400, {"error": str(exc)})
        self._answer(200, self.faults.state())


def serve(
    upstream: str,
    ready_file: str,
    port: int = 0,
    certfile: str | None = None,
    keyfile: str | None = None,
) -> None:
    u = urlsplit(upstream)
    faults = Faults()
    tls = None
    if certfile:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(certfile, keyfile)
    handler = type(
        "Handler",
        (ProxyHandler,),
        {"upstream": (u.hostname, u.port or 80), "faults": faults, "tls": tls},
    )
    control = type("Control", (ControlHandler,), {"faults": faults})
    proxy = ThreadingHTTPServer(("127.0.0.1", port), handler)
    proxy.daemon_threads = True
    ctl = ThreadingHTTPServer(("127.0.0.1", 0), control)
    ctl.daemon_threads = True
    threading.Thread(target=ctl.serve_forever, daemon=True).start()
    tmp = ready_file + ".tmp"
    Path(tmp).write_text(
        json.dumps({"port": proxy.server_address[1], "control_port": ctl.server_address[1]})
    )
    os.replace(tmp, ready_file)
    parent = os.getppid()

    def orphaned() -> None:  # never outlive the test session that started us
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    proxy.serve_forever()


# --------------------------------------------------------------------------- test side


@dataclass
class FaultProxy:
    """A running proxy process: where clients connect and how to switch faults."""

    endpoint: str  # what a client's storage_options point at
    control: str  # the control endpoint's base URL
    upstream: str
    process: subprocess.Popen = field(repr=False)

    def _call(self, path: str, payload=None) -> dict:
        data = None if payload is None and path == "/state" else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.control + path, data=data, method="GET" if data is None else "POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise ValueError(json.loads(exc.read())["error"]) from None

    def fault(
        self,
        mode: str,
        *,
        methods: tuple[str, ...] | None = None,
        path_contains: str = "",
        after: int = 0,
        times: int | None = None,
        where: str = "request",
        seconds: float = 0.0,
        status: int = 500,
    ) -> dict:
        """Switch a fault on (replacing any other); see the module's docstring."""
        return self._call(
            "/fault",
            {
                "mode": mode,
                "methods": list(methods) if methods else None,
                "path_contains": path_contains,
                "after": after,
                "times": times,
                "where": where,
                "seconds": seconds,
                "status": status,
            },
        )

    def clear(self) -> dict:
        """No fault from now on (the counters stay)."""
        return self._call("/fault", None)

    def reset(self) -> dict:
        """No fault, counters back to zero."""
        return self._call("/reset", None)

    def state(self) -> dict:
        return self._call("/state")

    def writes(self) -> int:
        """Write requests seen so far."""
        return sum(self.state()["requests"].get(m, 0) for m in WRITE_METHODS)


def start_proxy(
    upstream: str,
    folder: Path,
    *,
    certfile: str | None = None,
    keyfile: str | None = None,
    timeout: float = 30.0,
) -> FaultProxy:
    """Start the proxy process in front of ``upstream`` and wait until it listens."""
    folder.mkdir(parents=True, exist_ok=True)
    ready = folder / f"faultproxy-{os.getpid()}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "tests.objectstore.faultproxy", "--upstream", upstream]
    cmd += ["--ready-file", str(ready)]
    if certfile:
        cmd += ["--certfile", certfile, "--keyfile", keyfile]
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"fault proxy exited with code {proc.returncode} at start")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"fault proxy did not start in {timeout} s")
        time.sleep(0.05)
    ports = json.loads(ready.read_text())
    scheme = "https" if certfile else "http"
    return FaultProxy(
        endpoint=f"{scheme}://127.0.0.1:{ports['port']}",
        control=f"http://127.0.0.1:{ports['control_port']}",
        upstream=upstream,
        process=proc,
    )


def stop_proxy(proxy: FaultProxy) -> None:
    proxy.process.terminate()
    try:
        proxy.process.wait(10)
    except subprocess.TimeoutExpired:
        proxy.process.kill()
        proxy.process.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="the server, e.g. http://127.0.0.1:9000")
    p.add_argument("--ready-file", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--certfile")
    p.add_argument("--keyfile")
    a = p.parse_args(argv)
    serve(a.upstream, a.ready_file, a.port, a.certfile, a.keyfile)


if __name__ == "__main__":
    main()
