"""Credential screening of config values: storage options and URLs that look like they
carry credentials are refused, naming the keys, never echoing the values. Object-store
credentials come from the environment (or a Prefect block in the flows)."""

from __future__ import annotations

import re
from typing import Any

#: storage_options keys that carry credentials: refused in config files.
SECRET_KEYS = {
    "key",
    "secret",
    "token",
    "password",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "client_secret",
    "account_key",
    "sas_token",
    "credentials",
    "session_token",
    # short names compared whole (as parts of other names they mean other things)
    "sig",
    "sas",
    "auth",
    "pwd",
    "pass",
    "passphrase",
    "cookie",
    "apikey",
    "x-api-key",
}
#: ... and words that mark a credential anywhere in a key's name (api_key, connection_string,
#: an Authorization header, X-Amz-Security-Token, refresh_token...), case-insensitive.
SECRET_WORDS = (
    "secret",
    "password",
    "passwd",
    "token",
    "signature",
    "credential",
    "private_key",
    "privatekey",
    "api_key",
    "api-key",
    "apikey",
    "access_key",
    "accesskey",
    "account_key",
    "accountkey",
    "connection_string",
    "connectionstring",
    "authorization",
    "sas_",
    "_sas",
    "bearer",
    "cookie",
)
#: values that are credentials whatever their key is called (never echoed in messages)
_SECRET_VALUES = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("an HTTP authorization value", re.compile(r"^\s*(Bearer|Basic|Token)\s+\S{8,}", re.I)),
    (
        "an Azure connection string or SAS",
        re.compile(r"(AccountKey|SharedAccessSignature|SharedAccessKey)=|[?&]sig=", re.I),
    ),
    ("a JSON web token", re.compile(r"\beyJ[\w-]{8,}\.[\w-]{8,}\.")),
    (
        "an API token",
        re.compile(
            r"\b(gh[pousr]_[A-Za-z0-9]{20,}|xox[abp]-[\w-]{10,}|"
            r"sk-[A-Za-z0-9]{20,}|AIza[\w-]{30,})"
        ),
    ),
    ("a long hex string", re.compile(r"^[0-9a-fA-F]{32,}$")),
    (
        "a long base64 string",
        re.compile(
            r"^(?=[^0-9]*[0-9])(?=[^a-z]*[a-z])(?=[^A-Z]*[A-Z])[A-Za-z0-9+/]{32,}={0,2}$"
        ),
    ),
)


def _secret_value(v: Any, key: Any = None) -> str | None:
    """What kind of credential a string value looks like (None: it does not); ``key``,
    the option's name, marks a host-valued option (``account_host``) as a URL."""
    if not isinstance(v, str):
        return None
    for what, pattern in _SECRET_VALUES:
        if pattern.search(v):
            return what
    return _url_credentials(v, key)


#: option names whose values are URLs or hosts even without a scheme (adlfs's
#: ``account_host``, a proxy's address)
_URL_WORDS = ("url", "uri", "endpoint", "host", "proxy", "proxies", "address")


def _url_credentials(v: str, key: Any = None) -> str | None:
    """Whether a URL-valued option carries credentials: a user name or password before
    its host (``http://user:password@host``), or a credential in its query string. Any
    value with ``://`` is a URL; so is the value of an option named like one (``*url``,
    ``*host``, ``endpoint*``...), scheme or not."""
    named = key is not None and any(w in str(key).lower() for w in _URL_WORDS)
    if "://" not in v and not named:
        return None
    rest = v.split("://", 1)[1] if "://" in v else v
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in authority:
        return "a URL with a user name or password (user:password@host)"
    if "?" in rest:
        from urllib.parse import unquote

        query = rest.split("?", 1)[1].split("#", 1)[0]
        pairs = [q.split("=", 1) for q in query.replace(";", "&").split("&") if q]
        params = {unquote(p[0]): unquote(p[1]) if len(p) > 1 else "" for p in pairs}
        if any(_is_secret_key(k, val) or _secret_value(val) for k, val in params.items()):
            return "a URL with a credential in its query string"
    return None


#: values of a credential-named key that name a way to authenticate, not a secret: gcsfs's
#: ``token`` methods ("anon" is how public GCS buckets are read)
NON_SECRET_VALUES = {"anon", "google_default", "cache", "cloud", "browser"}


def _is_secret_key(k: Any, v: Any = "?") -> bool:
    """Whether option ``k`` (with value ``v``) carries a credential. No value (None, a
    bool: ``anon: true``) and a named authentication method (``token: anon``) do not."""
    if v is None or isinstance(v, bool):
        return False
    if isinstance(v, str) and v.strip().lower() in NON_SECRET_VALUES:
        return False
    name = str(k).lower()
    return name in SECRET_KEYS or any(w in name for w in SECRET_WORDS)


def _secret_keys(options: Any, prefix: str = "") -> list[str]:
    """Keys (dotted, at any depth: client_kwargs, headers, config_kwargs...) that carry
    credentials, by their name or by the shape of their value (a value is never returned,
    only where it is)."""
    found = []
    if isinstance(options, dict):
        for k, v in options.items():
            name = f"{prefix}{k}"
            what = _secret_value(v, k)
            if _is_secret_key(k, v):
                found.append(name)
            elif what:
                found.append(f"{name} (its value looks like {what})")
            found += _secret_keys(v, name + ".")
    elif isinstance(options, (list, tuple)):
        for i, v in enumerate(options):
            what = _secret_value(v)
            if what:
                found.append(f"{prefix}{i} (its value looks like {what})")
            found += _secret_keys(v, f"{prefix}{i}.")
    return found


def _check_url(v: str, what: str) -> str:
    if not v.strip():
        raise ValueError(f"{what} path is empty")
    if "://" in v:
        netloc = v.split("://", 1)[1].split("/", 1)[0]
        if "@" in netloc:
            raise ValueError(
                "URLs with embedded credentials (user:password@host) are refused; "
                "use the environment for credentials."
            )
        query = v.split("?", 1)[1] if "?" in v else ""
        from urllib.parse import unquote

        pairs = [q.split("=", 1) for q in query.replace(";", "&").split("&") if q]
        params = {unquote(p[0]): unquote(p[1]) if len(p) > 1 else "" for p in pairs}
        bad = _secret_keys(params)
        if bad:
            names = [b.split(" ", 1)[0] for b in bad]
            raise ValueError(
                f"URLs with credentials in the query string ({names}) are "
                "refused; use the environment for credentials."
            )
    return v


def check_storage_options(v: Any, what: str = "storage_options") -> dict[str, Any]:
    """``v`` if it is a mapping of fsspec options without credentials; else ValueError
    naming the keys (never their values) and where credentials belong."""
    if not isinstance(v, dict):
        raise ValueError(f"{what} must be a mapping of fsspec options, not {type(v).__name__}")
    bad = sorted(_secret_keys(v))
    if bad:
        raise ValueError(
            f"{what} must not hold credentials ({bad}); set them in the "
            "environment (e.g. AWS_ACCESS_KEY_ID) or a Prefect block instead."
        )
    return v
