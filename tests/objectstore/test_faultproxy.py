"""The fault proxy itself (tests/objectstore/faultproxy.py), in front of the real S3 server:
it forwards faithfully when told nothing, and each fault does what it says and no more."""

from __future__ import annotations

import http.client
import time
import uuid

import aiohttp
import pytest

from tests.objectstore.faultproxy import start_proxy, stop_proxy


def _request(endpoint: str, method: str, path: str, body: bytes | None = None):
    """(status, body) of one request on a new connection."""
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _proxied_fs(proxy):
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": proxy.endpoint},
        skip_instance_cache=True,
        config_kwargs={"retries": {"max_attempts": 1}},
    )


@pytest.fixture
def bucket(s3_server, s3_proxy, s3_env):
    s3_proxy.reset()
    name = f"proxy-{uuid.uuid4().hex[:10]}"
    s3_server.make_bucket(name)
    yield name
    s3_proxy.clear()


def test_forwards_requests_and_answers_unchanged(s3_server, s3_proxy, bucket):
    import s3fs

    fs = s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": s3_proxy.endpoint}, skip_instance_cache=True
    )
    payload = bytes(range(256)) * 4099  # > 1 MiB, not a multiple of anything round
    fs.pipe(f"{bucket}/a/b.bin", payload)
    assert fs.cat(f"{bucket}/a/b.bin") == payload
    assert fs.ls(f"{bucket}/a") == [f"{bucket}/a/b.bin"]
    # the server has it (read without the proxy), and the proxy saw the traffic
    assert s3_server.filesystem().cat(f"{bucket}/a/b.bin") == payload
    state = s3_proxy.state()
    assert state["requests"].get("PUT", 0) >= 1 and state["requests"].get("GET", 0) >= 1
    assert state["injected"] == {}
    # HEAD (s3fs's info) keeps the object's length without a body
    assert fs.info(f"{bucket}/a/b.bin")["size"] == len(payload)
    assert s3_proxy.state()["requests"].get("HEAD", 0) >= 1


def test_http_500_on_writes_after_n_successful_ones(s3_server, s3_proxy, bucket):
    s3_proxy.fault("error", after=2)
    codes = [
        _request(s3_proxy.endpoint, "PUT", f"/{bucket}/k{i}", b"v%d" % i)[0] for i in range(4)
    ]
    assert codes == [200, 200, 500, 500]
    direct = s3_server.filesystem()
    assert sorted(direct.ls(bucket)) == [f"{bucket}/k0", f"{bucket}/k1"]
    # reads are not writes: they pass
    assert _proxied_fs(s3_proxy).cat(f"{bucket}/k1") == b"v1"
    assert s3_proxy.state()["injected"] == {"error": 2}
    s3_proxy.clear()
    assert _request(s3_proxy.endpoint, "PUT", f"/{bucket}/k9", b"x")[0] == 200


def test_times_limits_a_fault_and_path_contains_selects_requests(s3_server, s3_proxy, bucket):
    s3_proxy.fault("error", times=1, path_contains="/only/")
    assert _request(s3_proxy.endpoint, "PUT", f"/{bucket}/other/x", b"1")[0] == 200
    assert _request(s3_proxy.endpoint, "PUT", f"/{bucket}/only/x", b"2")[0] == 500
    assert _request(s3_proxy.endpoint, "PUT", f"/{bucket}/only/x", b"3")[0] == 200
    assert s3_server.filesystem().cat(f"{bucket}/only/x") == b"3"


def test_drop_mid_request_body_writes_nothing(s3_server, s3_proxy, bucket):
    s3_proxy.fault("drop")
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        _request(s3_proxy.endpoint, "PUT", f"/{bucket}/dropped", b"x" * 100_000)
    assert not s3_server.filesystem().exists(f"{bucket}/dropped")
    assert s3_proxy.state()["injected"] == {"drop": 1}


def test_drop_mid_response_after_the_server_acted(s3_server, s3_proxy, bucket):
    payload = b"y" * 50_000
    s3_server.filesystem().pipe(f"{bucket}/obj", payload)
    s3_proxy.fault("drop", where="response", methods=("GET",))
    with pytest.raises(aiohttp.ClientPayloadError, match="received 25000 of 50000 bytes"):
        _proxied_fs(s3_proxy).cat(f"{bucket}/obj")
    # a write dropped after forwarding: the server has it, the client never heard
    s3_proxy.fault("drop", where="response")
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        _request(s3_proxy.endpoint, "PUT", f"/{bucket}/written", b"z" * 1000)
    assert s3_server.filesystem().cat(f"{bucket}/written") == b"z" * 1000


def test_delay_holds_a_request_back(s3_proxy, bucket):
    s3_proxy.fault("delay", seconds=1.5, methods=("GET",))
    t0 = time.monotonic()
    status, _ = _request(s3_proxy.endpoint, "GET", f"/{bucket}?list-type=2")
    assert status == 200
    assert time.monotonic() - t0 >= 1.5
    assert s3_proxy.state()["injected"] == {"delay": 1}


def test_control_refuses_an_unknown_fault(s3_proxy):
    with pytest.raises(ValueError, match="mode must be one of"):
        s3_proxy.fault("explode")
    with pytest.raises(ValueError, match="where must be"):
        s3_proxy.fault("drop", where="sideways")


def test_proxy_exits_when_stopped_and_a_dead_upstream_drops_the_client(tmp_path):
    proxy = start_proxy("http://127.0.0.1:9", tmp_path)  # nothing listens on port 9
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            _request(proxy.endpoint, "GET", "/anything")
    finally:
        stop_proxy(proxy)
    assert proxy.process.poll() is not None


def test_a_gcs_upload_is_matched_by_the_object_name_in_its_body(gcs_store):
    """gcsfs writes a small object as one multipart POST whose path names only the bucket
    (the name is in the body's metadata part): ``path_contains`` matches that name."""
    from gcsfs.core import GCSFileSystem

    proxy = gcs_store.proxy
    fs = GCSFileSystem(
        skip_instance_cache=True, endpoint_url=proxy.endpoint, token="anon", project="test"
    )
    proxy.fault("drop", path_contains="/embedding/", times=1)
    fs.pipe(gcs_store.path("run/other/x"), b"1")  # another name: passes
    assert proxy.state()["injected"] == {}
    fs.pipe(gcs_store.path("run/embedding/c/0"), b"2" * 1000)  # dropped once, retried
    state = proxy.state()
    assert state["injected"] == {"drop": 1}
    [req] = state["injected_requests"]
    assert req["method"] == "POST" and "uploadType=multipart" in req["path"], req
    assert "embedding" not in req["path"] and req["object"] == "run/embedding/c/0", req
    direct = gcs_store.filesystem()
    assert direct.cat(gcs_store.path("run/embedding/c/0")) == b"2" * 1000
    assert direct.cat(gcs_store.path("run/other/x")) == b"1"
