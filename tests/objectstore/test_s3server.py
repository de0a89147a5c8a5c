"""The S3 test server is real: a separate process speaking the S3 protocol over HTTP."""

from __future__ import annotations

import numpy as np
import zarr


def test_s3_server_round_trips_a_zarr_array(s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/probe.zarr"
    a = np.arange(12.0).reshape(3, 4)
    z = zarr.create_array(
        store=url,
        shape=a.shape,
        chunks=(2, 4),
        dtype=a.dtype,
        storage_options=s3_server.storage_options,
    )
    z[:] = a
    back = zarr.open_array(url, mode="r", storage_options=s3_server.storage_options)
    np.testing.assert_array_equal(back[:], a)
    # the server is another process: the object is visible through a fresh client
    assert s3_server.filesystem().exists(f"{s3_bucket}/probe.zarr/zarr.json")
    assert s3_server.process.poll() is None


def test_without_the_endpoint_nothing_reaches_the_local_server(s3_server, s3_bucket):
    fs = s3_server.filesystem()
    fs.pipe(f"{s3_bucket}/x.txt", b"hello")
    assert fs.cat(f"{s3_bucket}/x.txt") == b"hello"
