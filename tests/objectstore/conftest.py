"""Fixtures: real store server processes on 127.0.0.1 (moto's S3 server, gcp-storage-emulator,
azurite), each behind a fault-injecting proxy process; a fresh bucket per test."""

from __future__ import annotations

import uuid

import pytest

from tests.objectstore import emulators
from tests.objectstore.faultproxy import start_proxy, stop_proxy
from tests.objectstore.s3server import CREDENTIAL_ENV, start_s3_server, stop_s3_server
from tests.objectstore.stores import Store


@pytest.fixture(scope="session")
def s3_server():
    server = start_s3_server()
    try:
        yield server
    finally:
        stop_s3_server(server)


@pytest.fixture
def s3_env(monkeypatch):
    """Dummy credentials in the environment (where botocore reads them), nothing else."""
    for key, value in CREDENTIAL_ENV.items():
        monkeypatch.setenv(key, value)
    # the endpoint must come from storage_options, never from the environment
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return dict(CREDENTIAL_ENV)


@pytest.fixture
def s3_bucket(s3_server, s3_env):
    """A new empty bucket on the session's server; its name."""
    name = f"kpca-{uuid.uuid4().hex[:12]}"
    s3_server.make_bucket(name)
    return name


# --------------------------------------------- fault proxies, GCS and Azure emulators
# Reusable by any test under tests/objectstore (and by a conftest that imports them):
#   s3_proxy, gcs_proxy, az_proxy   session: a FaultProxy in front of each server
#   gcs_emulator, azurite           session: the emulator processes
#   s3_store, gcs_store, az_store   per test: a Store (tests/objectstore/stores.py) with a
#                                   new bucket, its proxy's faults cleared, and the
#                                   environment (credentials, trust) set for commands
#   object_store                    per test, parametrized indirectly: "s3", "gs" or "az"


@pytest.fixture(scope="session")
def s3_proxy(s3_server, tmp_path_factory):
    proxy = start_proxy(s3_server.endpoint, tmp_path_factory.mktemp("s3-proxy"))
    try:
        yield proxy
    finally:
        stop_proxy(proxy)


@pytest.fixture(scope="session")
def gcs_emulator():
    emulator = emulators.start_gcs_emulator()
    try:
        yield emulator
    finally:
        emulators.stop(emulator)


@pytest.fixture(scope="session")
def gcs_proxy(gcs_emulator, tmp_path_factory):
    proxy = start_proxy(gcs_emulator.endpoint, tmp_path_factory.mktemp("gcs-proxy"))
    try:
        yield proxy
    finally:
        stop_proxy(proxy)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    emulator = emulators.start_azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield emulator
    finally:
        emulators.stop(emulator)


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (certfile, keyfile)."""
    return emulators.self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def az_proxy(azurite, tls_cert, tmp_path_factory):
    certfile, keyfile = tls_cert
    folder = tmp_path_factory.mktemp("az-proxy")
    proxy = start_proxy(azurite.endpoint, folder, certfile=certfile, keyfile=keyfile)
    try:
        yield proxy
    finally:
        stop_proxy(proxy)


def _bucket_name() -> str:
    return f"kpca-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3_store(s3_server, s3_proxy, s3_env):
    s3_proxy.reset()
    bucket = s3_server.make_bucket(_bucket_name())
    yield Store(
        "s3",
        bucket,
        {"client_kwargs": {"endpoint_url": s3_proxy.endpoint}},
        s3_proxy,
        direct={"client_kwargs": {"endpoint_url": s3_server.endpoint}},
    )
    s3_proxy.clear()


@pytest.fixture
def gcs_store(gcs_emulator, gcs_proxy, monkeypatch):
    # read by gcsfs when imported (here: by every command and worker the test starts)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    gcs_proxy.reset()
    store = Store(
        "gs",
        _bucket_name(),
        {"endpoint_url": gcs_proxy.endpoint, "token": "anon"},
        gcs_proxy,
        direct={"endpoint_url": gcs_emulator.endpoint, "token": "anon", "project": "test"},
    )
    store.filesystem().mkdir(store.bucket)
    yield store
    gcs_proxy.clear()


@pytest.fixture
def az_store(azurite, az_proxy, tls_cert, monkeypatch):
    # the key of azurite's public development account, in the environment (where adlfs
    # reads it); the proxy's certificate trusted by every command and worker started
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", emulators.AZURITE_KEY)
    monkeypatch.setenv("SSL_CERT_FILE", tls_cert[0])
    for var in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    az_proxy.reset()
    host = az_proxy.endpoint.removeprefix("https://")
    account = emulators.AZURITE_ACCOUNT
    direct = (
        f"DefaultEndpointsProtocol=http;AccountName={account};"
        f"AccountKey={emulators.AZURITE_KEY};BlobEndpoint={azurite.endpoint}/{account};"
    )
    store = Store(
        "az",
        _bucket_name(),
        {"account_name": account, "account_host": f"{host}/{account}"},
        az_proxy,
        direct={"connection_string": direct},
    )
    store.filesystem().mkdir(store.bucket)
    yield store
    az_proxy.clear()


@pytest.fixture
def object_store(request):
    """``@pytest.mark.parametrize("object_store", ["s3", "gs", "az"], indirect=True)``."""
    name = {"s3": "s3_store", "gs": "gcs_store", "az": "az_store"}[request.param]
    return request.getfixturevalue(name)
