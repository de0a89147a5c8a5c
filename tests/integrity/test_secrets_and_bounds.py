"""Credentials are refused by name and by value shape, wherever they sit, and never echoed;
config loading is bounded (size, YAML aliases, nodes)."""

from __future__ import annotations

import time

import pytest
import yaml

from pipeline.config import ConfigError, InputConfig, load_config

AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"  # AWS's documented example, split for scanners
SECRET = "Zq9" + "x" * 10  # a value that must never appear in a message

REFUSED_BY_NAME = [
    {"api_key": SECRET},
    {"apiKey": SECRET},
    {"x-api-key": SECRET},
    {"connection_string": SECRET},
    {"sas_token": SECRET},
    {"sas": SECRET},
    {"auth": SECRET},
    {"password": SECRET},
    {"client_kwargs": {"headers": {"Authorization": SECRET}}},
    {"client_kwargs": {"headers": {"Cookie": SECRET}}},
    {"config_kwargs": {"refresh_token": SECRET}},
    {"account_key": SECRET},
    {"nested": [{"client_secret": SECRET}]},
]
REFUSED_BY_VALUE = [
    ("an AWS access key id", AWS_KEY_ID),
    ("an HTTP authorization value", "Bearer " + SECRET),
    ("a private key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE" + SECRET),
    (
        "an Azure connection string or SAS",
        "DefaultEndpointsProtocol=https;AccountKey=" + SECRET,
    ),
    ("a JSON web token", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0." + SECRET),
    ("a long hex string", "4f9c2a7b1e8d3f6a9c0b2e5d8f1a4c7b"),
    ("a long base64 string", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
]
ACCEPTED = {
    "anon": True,
    "endpoint_url": "https://minio.example.org:9000/bucket-2024",
    "requester_pays": False,
    "client_kwargs": {"region_name": "eu-west-1"},
    "config_kwargs": {"s3": {"addressing_style": "path"}},
    "use_ssl": True,
    "default_block_size": 5242880,
    "profile": "data-team",
    "cache_type": "readahead",
    "version_aware": True,
    "prefix_note": "data_2024_01_01_processed_version_2_final",
}


def _refusal(options) -> str:
    with pytest.raises(ValueError) as err:
        InputConfig(path="s3://bucket/x.parquet", storage_options=options)
    return str(err.value)


@pytest.mark.parametrize("options", REFUSED_BY_NAME, ids=lambda o: str(o)[:40])
def test_credentials_by_name_are_refused_and_not_echoed(options):
    msg = _refusal(options)
    assert "must not hold credentials" in msg and SECRET not in msg


@pytest.mark.parametrize("what, value", REFUSED_BY_VALUE, ids=[w for w, _ in REFUSED_BY_VALUE])
def test_credentials_by_value_shape_are_refused_and_not_echoed(what, value):
    msg = _refusal({"client_kwargs": {"innocent_name": value}})
    assert f"client_kwargs.innocent_name (its value looks like {what})" in msg
    assert value not in msg and SECRET not in msg


def test_ordinary_storage_options_are_accepted():
    assert InputConfig(path="s3://bucket/x.parquet", storage_options=ACCEPTED)


@pytest.mark.parametrize(
    "options",
    [
        {"token": "anon"},  # how gcsfs reads a public bucket
        {"token": "google_default", "project": "p"},
        {"token": "cloud"},
        {"token": None},
        {"anon": True, "account_name": "devstoreaccount1"},  # adlfs, public container
        {"account_name": "acct", "account_host": "acct.blob.core.windows.net"},
        {"endpoint_url": "http://127.0.0.1:4443", "token": "anon"},
    ],
    ids=lambda o: str(o)[:40],
)
def test_authentication_methods_and_non_secret_options_are_accepted(options):
    cfg = InputConfig(path="gs://bucket/x.parquet", storage_options=options)
    assert cfg.storage_options == options


@pytest.mark.parametrize(
    "options",
    [{"token": SECRET}, {"token": {"client_email": "a@b", "private_key": SECRET}}],
    ids=["a token string", "a service-account mapping"],
)
def test_a_token_that_is_not_a_method_name_is_still_refused(options):
    msg = _refusal(options)
    assert "must not hold credentials" in msg and "token" in msg and SECRET not in msg


@pytest.mark.parametrize(
    "url",
    [
        f"https://example.org/x.csv?api_key={SECRET}",
        f"s3://b/x.parquet?token={SECRET}",
        f"https://example.org/x.csv?X-Amz-Security-Token={SECRET}",
        f"https://example.org/x.csv?sig={SECRET}&se=2030",
        f"https://example.org/x?k={AWS_KEY_ID}",
        f"https://example.org/x.csv?Api%5FKey={SECRET}",
    ],
)
def test_credentials_in_url_queries_are_refused(url):
    with pytest.raises(ValueError) as err:
        InputConfig(path=url)
    assert "credentials in the query string" in str(err.value)
    assert SECRET not in str(err.value) and AWS_KEY_ID not in str(err.value)


def test_innocent_url_queries_are_accepted():
    assert InputConfig(path="s3://bucket/x.parquet?versionId=3&region=eu")


def _write(tmp_path, text):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = [
        "input:",
        "  path: x.npy",
        "  storage_options:",
        "    a0: &a0 [x, x, x, x, x, x, x]",
    ]
    lines += [f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 7)}]" for i in range(1, 30)]
    p = _write(tmp_path, "\n".join(lines) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="more than 100 YAML aliases"):
        load_config(p)
    assert time.perf_counter() - t0 < 5


def test_node_and_size_bounds(tmp_path):
    many = (
        "input:\n  path: x.npy\n  storage_options:\n    l: ["
        + ", ".join(["1"] * 120_000)
        + "]\n"
    )
    with pytest.raises(ConfigError, match="more than 100000 YAML nodes"):
        load_config(_write(tmp_path, many))
    big = "input:\n  path: x.npy\n# " + "x" * (1 << 20) + "\n"
    with pytest.raises(ConfigError, match="larger than a config can be"):
        load_config(_write(tmp_path, big))
    with pytest.raises(ConfigError, match="not UTF-8"):
        (tmp_path / "run.yaml").write_bytes(b"input:\n  path: \xff\xfe.npy\n")
        load_config(tmp_path / "run.yaml")


def test_a_few_aliases_still_load(tmp_path):
    """Anchors are legitimate YAML: a config that uses a handful still loads."""
    text = yaml.safe_dump({"input": {"path": "x.npy"}}) + (
        "kernel: &k {name: rbf, gamma: 0.5}\n"
    )
    assert load_config(_write(tmp_path, text)).kernel.gamma == 0.5
