"""One handle per object store under test (s3, gs, az), each behind its own fault proxy.

A :class:`Store` is what a test needs to point a ``kpca`` command at a fresh bucket: URLs
(:meth:`Store.url`), the ``storage_options`` that reach the server through the proxy (the
endpoint only there, no credential: those are in the environment the fixture set), the
proxy to switch faults with (:attr:`Store.proxy`), and a filesystem in the test process
that talks to the server directly (:meth:`Store.filesystem`), unaffected by faults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.objectstore.faultproxy import FaultProxy


@dataclass
class Store:
    scheme: str  # "s3", "gs", "az"
    bucket: str
    storage_options: dict[str, Any]
    proxy: FaultProxy
    direct: dict[str, Any] = field(repr=False)  # fsspec kwargs that bypass the proxy

    def url(self, *parts: str) -> str:
        return "/".join([f"{self.scheme}://{self.bucket}", *parts])

    @property
    def options_json(self) -> str:
        """The ``--storage-options`` argument of a command."""
        return json.dumps(self.storage_options)

    def filesystem(self):
        """The store's filesystem in the test process, straight to the server."""
        if self.scheme == "gs":
            # the core class: the experimental one asks Google what kind each bucket is
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem(skip_instance_cache=True, **self.direct)
        import fsspec

        return fsspec.filesystem(self.scheme, skip_instance_cache=True, **self.direct)

    def path(self, *parts: str) -> str:
        """A path for :meth:`filesystem` (no scheme)."""
        return "/".join([self.bucket, *parts])
