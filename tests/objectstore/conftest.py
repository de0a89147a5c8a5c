"""Fixtures: a real S3-protocol server process (moto) on 127.0.0.1; a fresh bucket per test."""

from __future__ import annotations

import uuid

import pytest

from tests.objectstore.s3server import CREDENTIAL_ENV, start_s3_server, stop_s3_server


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
