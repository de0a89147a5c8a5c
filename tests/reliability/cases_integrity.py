"""Integrity cases of the bad-input catalogue (issue 19): missing chunks are errors, edited
models are refused, secrets are refused without being echoed, loading and connecting are
bounded, and the remaining raw exceptions are one line each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from .catalogue import RUN_D, Case, D, N, _new_rows
from .helpers import blobs

AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"  # AWS's documented example id, split for scanners


# ------------------------------------------------------------------ missing data
def _zarr_missing_chunk(ctx, **input_over):
    import zarr

    z = zarr.create_array(str(ctx.dir / "x.zarr"), shape=(N, D), chunks=(50, D), dtype="f8")
    z[...] = blobs(N, D)
    (ctx.dir / "x.zarr" / "c" / "2" / "0").unlink()
    return [
        "run",
        ctx.config(ctx.dir / "x.zarr", **({"input": input_over} if input_over else {})),
    ]


def _estimator_missing_chunk(ctx):
    import zarr

    from kpca_dask import KernelPCA

    z = zarr.create_array(str(ctx.dir / "x.zarr"), shape=(60, 3), chunks=(20, 3), dtype="f8")
    z[...] = blobs(60, 3)
    (ctx.dir / "x.zarr" / "c" / "1" / "0").unlink()
    return lambda: KernelPCA(2, kernel="rbf", gamma=0.5).fit(z)


def _zarr_subgroup(ctx):
    import zarr

    g = zarr.open_group(str(ctx.dir / "x.zarr"), mode="w")
    g.create_group("X")  # a group where the array is expected
    g.create_array("data", shape=(N, D), dtype="f8")[...] = blobs(N, D)
    return ["run", ctx.config(ctx.dir / "x.zarr")]


# ------------------------------------------------------------------ edited models
def _edited_model_run(ctx, reseal):
    from kpca_dask.persistence import attrs_sha256

    run = ctx.dir / "run"
    shutil.copytree(ctx.run, run)
    from tests.published import version_dir

    meta = version_dir(run) / "model" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["kernel"]["gamma"] *= 2
    if reseal:
        doc["attributes"]["attrs_sha256"] = attrs_sha256(doc["attributes"])
    meta.write_text(json.dumps(doc, indent=2))
    return run


# ------------------------------------------------------------------ secrets
def _no_value(secret):
    def check(message):
        assert secret not in message, "the credential was echoed in the message"

    return check


def _secret(ctx, options):
    return ["run", ctx.config("s3://bucket/x.parquet", input={"storage_options": options})]


def _alias_bomb(ctx):
    lines = [
        "input:",
        "  path: x.npy",
        "  storage_options:",
        "    a0: &a0 [x, x, x, x, x, x, x, x]",
    ]
    for i in range(1, 25):
        refs = ", ".join([f"*a{i - 1}"] * 8)
        lines.append(f"    a{i}: &a{i} [{refs}]")
    p = ctx.dir / "run.yaml"
    p.write_text("\n".join(lines) + "\n")
    return ["run", p]


def _huge_config(ctx):
    p = ctx.config(ctx.npy(blobs(N, D)))
    with open(p, "a") as f:
        f.write("# " + "x" * (2 << 20) + "\n")
    return ["run", p]


# ------------------------------------------------------------------ timeouts
class _Quiet(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def _http_scheduler(ctx):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ctx.cleanups.append(server.shutdown)
    ctx.cleanups.append(server.server_close)
    port = server.server_address[1]
    return [
        "run",
        ctx.config(
            ctx.npy(blobs(N, D)),
            cluster={"address": f"tcp://127.0.0.1:{port}", "connect_timeout": 2},
        ),
    ]


def _huge_values(ctx, size=1e300, **extra):
    X = size * (1.0 + np.random.default_rng(0).random((N, D)))
    return [
        "run",
        ctx.config(ctx.npy(X), solver={"eigen_solver": "nystroem", "n_landmarks": 50}, **extra),
    ]


def _overflowing_values(ctx):
    # near 1e300 standard scaling works (the spread is taken on columns divided by their
    # largest value); near the float64 limit even the columns' sum overflows
    return _huge_values(ctx, size=8e307)


def _huge_values_unscaled(ctx):
    return _huge_values(ctx, preprocess={"scale": "none"})


# ------------------------------------------------------------------ raw exceptions
def _read_only_output(ctx):
    ro = ctx.dir / "ro"
    ro.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise PermissionError(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    ctx.cleanups.append(lambda: subprocess.run(["umount", "-l", str(ro)], check=True))
    return ["run", ctx.config(ctx.npy(blobs(N, D)), output={"path": str(ro / "out")})]


def _npz_as_npy(ctx):
    np.savez(ctx.dir / "x.npz", X=blobs(N, D))
    os.replace(ctx.dir / "x.npz", ctx.dir / "x.npy")
    return ["run", ctx.config(ctx.dir / "x.npy")]


# ------------------------------------------------------------------ an output's whole life
def _night(out, n: int, **kw) -> None:
    """Publish night ``n`` of a small transform-like output at ``out`` (no cluster)."""
    from pipeline.output.completeness import DENSE
    from pipeline.output.publish import publish_output

    def write(version):
        g = version.open_group("a")
        z = g.create_array("embedding", shape=(20, 2), chunks=(10, 2), dtype="f8", config=DENSE)
        z[...] = np.full((20, 2), n + 1.0)
        g.attrs["status"] = "complete"

    publish_output(
        str(out),
        write=write,
        verify=lambda v: None,
        recheck=lambda: None,
        record={"kind": "kpca-dask-transform", "format": "zarr", "data": ".", "rows": 20},
        **kw,
    )


def _removed_version_reader(ctx):
    """A reader holding last night's version, deleted by retention (keep 1, no grace)."""
    from pipeline.output.versions import resolve

    out = ctx.dir / "nightly.zarr"
    _night(out, 0, keep=1)
    z = resolve(str(out)).location.open_group("r")["embedding"]
    _night(out, 1, keep=1, grace=0)
    return lambda: z[...]


def _damaged_pointer_nothing_to_recover(ctx):
    """A pointer that is not JSON and no version complete to rebuild it from."""
    out = ctx.dir / "damaged.zarr"
    (out / "versions" / "20261126T000000000000Z-abcdef").mkdir(parents=True)
    (out / "manifest.json").write_text('{"status": "compl')
    return ["info", out]


CASES = [
    Case(
        "int-zarr-missing-chunk",
        "input",
        "zarr input with a chunk file missing",
        _zarr_missing_chunk,
        (
            "1 of 4 chunks is missing (the first: 'c/2/0', rows 100-149)",
            "zarr would read them as zeros",
            "set input.missing_chunks: fill",
        ),
    ),
    Case(
        "int-est-missing-chunk",
        "estimator",
        "KernelPCA.fit on a zarr array with a chunk file missing",
        _estimator_missing_chunk,
        ("lacks chunks: 1 of 3 chunks is missing", "rows 20-39", "dask.array.from_zarr(X)"),
    ),
    Case(
        "int-zarr-group",
        "input",
        "zarr group where the array is expected",
        _zarr_subgroup,
        ("'X' is a zarr group, not an array", "set input.zarr_array"),
    ),
    Case(
        "int-model-edited",
        "info",
        "model attribute (gamma) edited in model/zarr.json",
        lambda c: ["info", _edited_model_run(c, reseal=False)],
        ("attribute checksum mismatch", "Re-create it"),
    ),
    Case(
        "int-model-resealed",
        "transform",
        "model attribute edited and its checksum recomputed",
        lambda c: [
            "transform",
            _edited_model_run(c, reseal=True),
            _new_rows(c, RUN_D),
            c.dir / "emb.zarr",
        ],
        ("the model was replaced after the run was published", "re-run the pipeline"),
    ),
    Case(
        "int-secret-api-key",
        "config",
        "api_key in storage_options",
        lambda c: _secret(c, {"api_key": "s3cr3t-value"}),
        ("must not hold credentials", "api_key", "set them in the environment"),
        check=_no_value("s3cr3t-value"),
    ),
    Case(
        "int-secret-header",
        "config",
        "Authorization header in storage_options",
        lambda c: _secret(c, {"client_kwargs": {"headers": {"Authorization": "Bearer abc"}}}),
        ("must not hold credentials", "client_kwargs.headers.Authorization"),
        check=_no_value("Bearer abc"),
    ),
    Case(
        "int-secret-connection-string",
        "config",
        "connection_string in storage_options",
        lambda c: _secret(
            c, {"connection_string": "DefaultEndpointsProtocol=https;AccountKey=abc"}
        ),
        ("must not hold credentials", "connection_string"),
        check=_no_value("AccountKey"),
    ),
    Case(
        "int-secret-value",
        "config",
        "an AWS key id under an innocent name",
        lambda c: _secret(c, {"profile_hint": AWS_KEY_ID}),
        (
            "must not hold credentials",
            "profile_hint (its value looks like an AWS access key id)",
        ),
        check=_no_value(AWS_KEY_ID),
    ),
    Case(
        "int-url-api-key",
        "config",
        "?api_key= in the input URL",
        lambda c: ["run", c.config("https://example.org/x.csv?api_key=s3cr3t-value")],
        ("credentials in the query string (['api_key'])", "use the environment"),
        check=_no_value("s3cr3t-value"),
    ),
    Case(
        "int-yaml-alias-bomb",
        "config",
        "YAML alias bomb under storage_options",
        _alias_bomb,
        ("more than 100 YAML aliases", "an alias bomb?"),
    ),
    Case(
        "int-yaml-too-big",
        "config",
        "config file over 1 MiB",
        _huge_config,
        ("is larger than a config can be (1048576 bytes)",),
    ),
    Case(
        "int-cluster-http",
        "cluster",
        "an HTTP server at cluster.address",
        _http_scheduler,
        (
            "accepts connections but did not complete a Dask handshake within 2 s",
            "check cluster.address",
        ),
    ),
    Case(
        "int-nystroem-huge",
        "fit",
        "values near 1e308, default scaling (their mean overflows float64)",
        _overflowing_values,
        ("standard scaling statistics", "overflow float64", "scale the data down"),
    ),
    Case(
        "int-nystroem-huge-unscaled",
        "fit",
        "values near 1e300, preprocess.scale none (Nyström: the kernel overflows)",
        _huge_values_unscaled,
        ("The kernel returned NaN or infinity on the data", "scale the data"),
    ),
    Case(
        "int-read-only-output",
        "output",
        "output on a read-only filesystem",
        _read_only_output,
        ("read-only", "output.path"),
        needs_root=True,
    ),
    Case(
        "int-memory-limit",
        "config",
        "cluster.memory_limit far too small",
        lambda c: [
            "run",
            c.config(c.npy(blobs(N, D)), cluster={"address": "", "memory_limit": "1MiB"}),
        ],
        ("cluster.memory_limit", "at least 256 MiB"),
    ),
    Case(
        "int-npz-as-npy",
        "input",
        "an NPZ archive renamed .npy",
        lambda c: _npz_as_npy(c),
        ("is an NPZ archive", "input.path"),
    ),
    Case(
        "int-block-rows-0",
        "config",
        "chunks.block_rows: 0",
        lambda c: ["run", c.config(c.npy(blobs(N, D)), chunks={"block_rows": 0})],
        ("chunks.block_rows",),
    ),
    Case(
        "int-version-removed-while-read",
        "estimator",
        "a reader's version deleted by retention (keep 1, grace 0) while it holds it",
        _removed_version_reader,
        ("was removed by retention while it was read", "open the output again"),
    ),
    Case(
        "int-pointer-damaged-unrecoverable",
        "info",
        "pointer not JSON and no complete version to rebuild it from",
        _damaged_pointer_nothing_to_recover,
        ("is damaged (not valid JSON)", "no version", "Re-run the pipeline"),
    ),
]
