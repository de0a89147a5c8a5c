"""gcp-storage-emulator, started with a multipart-upload parser that keeps every byte.

The emulator parses a JSON-API multipart upload (how gcsfs writes every object smaller
than its block size: each zarr chunk, each ``zarr.json``) with Python's ``email`` parser,
which takes the line break before the closing delimiter to be ``\\r\\n`` when the content
ends in ``\\r``: an object whose last byte is 0x0D is stored one byte short. gcsfs writes
its parts with bare ``\\n`` line breaks (as Google's service accepts), so about one
compressed chunk in 256 was truncated: a Zstd error reading it back (the labelled run of
issue 36 read its ``split`` array that way). Google's service keeps the byte
(``tests/objectstore/test_store_faults_gs.py`` shows the round trip through this
emulator).

Run as ``python -m tests.objectstore.gcs_emulator start --host ... --port ...`` (the
emulator's own arguments): the emulator's ``_read_data`` is replaced, for
``multipart/related`` bodies only, by a split on the boundary that removes exactly the
one line break the delimiter owns (``\\r\\n`` when the body's first delimiter line ends
so, else ``\\n``).
"""

from __future__ import annotations

import json
import re
import sys

from gcp_storage_emulator import server

_original_read_data = server._read_data
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?')


def _headers(block: bytes) -> dict[str, str]:
    out = {}
    for line in block.splitlines():
        if b":" in line:
            k, v = line.split(b":", 1)
            out[k.decode("latin-1").strip().lower()] = v.decode("latin-1").strip()
    return out


def split_related(raw: bytes, content_type: str) -> dict:
    """``{"meta", "content", "content-type"}`` of a ``multipart/related`` upload body,
    the content byte for byte."""
    m = _BOUNDARY.search(content_type)
    if m is None:
        raise ValueError(f"no boundary in {content_type!r}")
    delim = b"--" + m.group(1).encode("latin-1")
    first = raw.index(delim) + len(delim)
    eol = b"\r\n" if raw[first : first + 2] == b"\r\n" else b"\n"
    parts = raw[first:].split(eol + delim)
    # parts: [first part, second part, "--" + epilogue]; each starts with the line break
    # that ends its delimiter line
    found = []
    for part in parts[:2]:
        part = part[len(eol) :] if part.startswith(eol) else part
        head, _, body = part.partition(eol + eol)
        found.append((_headers(head), body))
    (_, meta), (head, content) = found
    return {
        "meta": json.loads(meta),
        "content": content,
        "content-type": head.get("content-type", "application/octet-stream").split(";")[0],
    }


def _read_data(request_handler, query):
    content_type = request_handler.headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/related"):
        return _original_read_data(request_handler, query)
    raw = server._decode_raw_data(server._read_raw_data(request_handler), request_handler)
    if not raw:
        return None
    return split_related(raw, content_type)


server._read_data = _read_data

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main

    main(sys.argv[1:])
