"""A nightly series on a real S3-protocol server (moto's standalone server, a process on
127.0.0.1), the endpoint only in ``storage_options``: a base run and FIVE updates, each
from the one before (merge and refit mixed; a refit reads every store of the chain back to
the base's ``work/``). Each night's output verifies with ``kpca info``; after the fifth,
the first nights -- the base run and the first update -- are exactly as they were when
published: every object byte for byte (``work/`` included, only the lock aside), ``kpca
info`` verifies them with the same manifest, and ``kpca transform`` of a fixed batch
against them gives the same embedding as it did then."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from pipeline.output.layout import LOCK
from tests.objectstore.test_gs_az import embed
from tests.objectstore.test_s3_pipeline import CANARY, s3  # noqa: F401
from tests.published import held_by, s3_tree_bytes, without_holds
from tests.reliability.helpers import ROOT, blobs, env, run_command

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

N, D, BATCH = 300, 6, 60
#: the five nights after the base run
POLICIES = ("merge", "refit", "merge", "merge", "refit")


def _kpca(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *map(str, args)],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1500,
    )  # fmt: skip


def test_five_nightly_updates_keep_the_first_nights_as_they_were(s3, tmp_path):
    server, bucket = s3
    opts = server.storage_options
    assert set(opts) == {"client_kwargs"}  # the endpoint, nothing else
    flag = json.dumps(opts)
    fs = server.filesystem()
    prefix = f"{bucket}/nightly"

    def put(name: str, x: np.ndarray) -> str:
        np.save(tmp_path / name, x)
        fs.put(str(tmp_path / name), f"{prefix}/in/{name}")
        return f"s3://{prefix}/in/{name}"

    def info(url: str) -> dict:
        ok = _kpca("info", url, "--storage-options", flag)
        assert ok.returncode == 0, (url, ok.stderr[-3000:])
        assert f"run        {url}  [complete, verified]" in ok.stdout, ok.stdout
        return json.loads(_kpca("info", url, "--json", "--storage-options", flag).stdout)

    def snapshot(url: str) -> dict[str, bytes]:  # every object but the lock
        return s3_tree_bytes(fs, url.removeprefix("s3://"), exclude=(LOCK,))

    fixed = put("fixed.npy", blobs(40, D, seed=99))  # the batch transformed against v1, v2
    names = SimpleNamespace(options_json=flag)  # what test_gs_az.embed needs of a store

    base = f"s3://{prefix}/v1"
    cfg = {
        "input": {"path": put("x.npy", blobs(N, D)), "storage_options": opts},
        "kernel": {"name": "rbf", "gamma": 0.02},
        "solver": {
            "n_components": 3,
            "eigen_solver": "nystroem",
            "n_landmarks": 60,
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01, "block_rows": 100},
        "kernel_store": {"materialize": "never"},
        "output": {"path": base, "parquet": False, "storage_options": opts},
        "evaluate": {"enabled": False},
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "dashboard_address": None},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    res = subprocess.run(
        run_command(tmp_path / "run.yaml"), cwd=ROOT, env=env(), capture_output=True,
        text=True, timeout=1500,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    took = {"v1 run": time.monotonic() - t0}

    first: dict[str, tuple] = {}  # url -> (objects, manifest, embedding of the fixed batch)

    def keep(url: str) -> None:
        dest = tmp_path / f"{url.rpartition('/')[2]}-then.parquet"
        first[url] = (snapshot(url), info(url), embed(names, url, fixed, dest))

    keep(base)
    chain, n, prev = [base], N, first[base][1]
    for step, policy in enumerate(POLICIES, start=2):
        out = f"s3://{prefix}/v{step}"
        batch = put(f"b{step}.npy", blobs(BATCH, D, seed=step))
        t0 = time.monotonic()
        res = _kpca(
            "update", chain[-1], batch, "--output", out, "--storage-options", flag,
            "--policy", policy, "--no-prefect", "--no-progress",
        )  # fmt: skip
        took[f"v{step} {policy}"] = time.monotonic() - t0
        assert res.returncode == 0, f"night {step}: {res.stderr[-3000:]}"
        assert f"{policy} of {BATCH} new rows" in res.stdout, res.stdout
        n += BATCH
        m = info(out)
        assert m["update"]["version"] == step and m["update"]["n_rows"] == n, m["update"]
        # the version it read is pinned: a later night at the base's output changes nothing
        assert m["update"]["base"] == f"{chain[-1]}/{prev['version_path']}", m["update"]
        rows = m["update"]["rows"]
        assert len(rows) == step and sum(r["n_rows"] for r in rows) == n
        for r in rows:  # each store of the chain readable with the options recorded
            assert r["storage_options"] == opts and r["fingerprint"].startswith("blake2b:"), r
        for v in CANARY.values():  # no credential recorded
            assert v not in json.dumps(m)
        chain.append(out)
        prev = m
        if step == 2:
            keep(out)

    # after the fifth night: the first two exactly as they were
    for url, (objects, manifest, emb) in first.items():
        now = snapshot(url)
        # but for the holds every later night keeps on the rows it reads there, by design
        # (docs/update.md, "Holds"); an update's hold on its own rows (`<out>#rows`) is
        # its own, written when it published
        later = chain[chain.index(url) + 1 :]
        for holder in later:
            assert held_by(now, holder)["rows"], (url, holder)
        holders = [*later, f"{url}#rows"]
        now, objects = without_holds(now, holders), without_holds(objects, holders)
        assert set(now) == set(objects), (url, sorted(set(now) ^ set(objects)))
        assert [k for k in objects if now[k] != objects[k]] == [], url
        assert info(url) == manifest, url
        dest = tmp_path / f"{url.rpartition('/')[2]}-now.parquet"
        np.testing.assert_array_equal(embed(names, url, fixed, dest), emb)
    print("; ".join(f"{k} {v:.0f} s" for k, v in took.items()))
