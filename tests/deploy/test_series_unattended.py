"""A series left to run itself: thirteen "nights" of deploy/prefect.yaml's
kpca-update-nightly on a real Prefect server, deployed with `prefect deploy`, its cron
schedule firing every minute (each minute a night), taken by a real process worker, on
local disk, on an S3-protocol server (moto's standalone server: the endpoint only in
the deployment's parameters, the credentials only in the worker's environment) and on a
GCS emulator (gcp-storage-emulator: the endpoint and ``token: anon`` in the parameters,
no credential at all).

The nights (one slot each, the batches landed in the slot's folder
``<root>/in/<%Y-%m-%dT%H%M>/`` ahead of time):

====  ============================================================================
 s0   nothing landed: a no-op night
 s1   one batch (a)
 s2   a's bytes again under another name: "already merged", no new version
 s3   two batches in one night, merged in name order
 s4   nothing (the two-batch night may overrun its minute: this one catches up)
 s5   nothing; then the worker is killed (an outage) before it takes s6
 s6   one batch, missed: the worker is down
 s7   one batch, missed; the worker restarts after it: s6 and s7 run late, in order
 s8   one batch; the flow-run process is SIGKILLed mid-merge (a half-written version
      on the store): the run CRASHED, the series still serves the version before it
 s9   one batch: the next night works, and catches up: it merges s8's batch first (a
      template's earlier dates not merged yet, oldest first), then its own; an operator
      re-running s8's slot (``prefect deployment run ... --param logical_date=<s8's
      time>``) then finds it "already merged"
 s10  a bad batch (ids the series has) beside a good one: FAILED naming the bad one,
      the good one published
 s11  nothing landed; s10's refused batch stays pending: tried again, FAILED naming it
 s12  one batch: merged, the last good night; FAILED again naming s10's batch
====  ============================================================================

At the end every good batch is merged exactly once, in the order the runs ran (the
scheduled ones in slot order, late ones included),
ids unique, the series' address names the last merge, the versions kept are within
output.keep_versions, and ``kpca info``, ``open_run`` and a plain pyarrow reader that
cannot import kpca_dask or pipeline read it. No credential reaches the Prefect server.

Slow: 16 to 22 minutes per store here (2 cores; measured times in the test's docstring).
The deadlines are generous: on a loaded host the nights fall behind their minutes (one
S3 night took up to 100 s) and catch up in the empty slots and after the last one.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import signal
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from pipeline.output import Location
from pipeline.output.export import open_run
from pipeline.output.versions import (
    history_ids,
    named_ids,
    read_pointer,
    version_ids,
    version_manifest,
)
from tests.deploy.test_drain import worker
from tests.deploy.test_schedules import DEPLOY, _deployment, _prefect, _runs, prefect_server
from tests.objectstore import emulators
from tests.objectstore.s3server import CREDENTIAL_ENV, start_s3_server, stop_s3_server
from tests.objectstore.test_s3_lineage import _kpca, _run
from tests.objectstore.test_series_nights import _plain_ids
from tests.pipeline.test_series_output import _config, _table

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

DEPLOYMENT = "kpca-update-from/kpca-update-nightly"
TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

#: the nights: per slot, the batches landed in its folder (name, rows, seed, first id),
#: or ("copy", slot, name) for another slot's batch's very bytes; "bad" marks a batch
#: whose ids the series has
PLAN: list[list[tuple]] = [
    [],  # s0
    [("a.parquet", 60, 1, 1000)],  # s1
    [("copy", 1, "a.parquet")],  # s2: landed again as s2/b.parquet
    [("a.parquet", 60, 2, 2000), ("b.parquet", 60, 3, 3000)],  # s3
    [],  # s4
    [],  # s5
    [("a.parquet", 60, 4, 4000)],  # s6 (missed)
    [("a.parquet", 60, 5, 5000)],  # s7 (missed)
    [("a.parquet", 60, 6, 6000)],  # s8 (killed)
    [("a.parquet", 60, 7, 7000)],  # s9
    [("a.parquet", 30, 8, 1000, "bad"), ("b.parquet", 60, 9, 8000)],  # s10
    [],  # s11
    [("a.parquet", 60, 10, 9000)],  # s12
]
OUTAGE = (6, 7)  # the slots that fire while the worker is down
KILLED = 8
BAD = 10


@pytest.fixture(scope="module")
def moto():
    server = start_s3_server()
    try:
        yield server
    finally:
        stop_s3_server(server)


@pytest.fixture(scope="module")
def gcs():
    emulator = emulators.start_gcs_emulator()
    try:
        yield emulator
    finally:
        emulators.stop(emulator)


def _utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(datetime.UTC)


def _logs(api: str, run_id: str) -> str:
    body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200, "sort": "TIMESTAMP_ASC"}
    got = httpx.post(f"{api}/logs/filter", json=body, timeout=30).json()
    return "\n".join(entry["message"] for entry in got)


def _flow_process(worker_pid: int, run_id: str) -> psutil.Process | None:
    """The worker's child running flow run ``run_id`` (its cluster's processes inherit
    the same PREFECT__FLOW_RUN_ID: the topmost one)."""
    try:
        kids = psutil.Process(worker_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    mine = []
    for p in kids:
        try:
            if p.environ().get("PREFECT__FLOW_RUN_ID") == run_id:
                mine.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    pids = {p.pid for p in mine}
    top = [p for p in mine if p.ppid() not in pids]
    return top[0] if top else None


def _sleep_until(t: datetime.datetime) -> None:
    while (left := (t - datetime.datetime.now(datetime.UTC)).total_seconds()) > 0:
        time.sleep(min(left, 1.0))


@pytest.mark.parametrize("where", ["local", "s3", "gs"])
def test_a_series_runs_itself_for_thirteen_nights(where, request, tmp_path, monkeypatch):
    """(slow: measured on 2026-11-28 here, 2 cores, with the catch-up (94eeac9): local
    899 s, gs 1105 s and s3 1047 s (those two at once), s3 948 s alone; before it, two
    params at once beside other work, load 5-11: local 976-1198 s, s3 1226-1319 s.)"""
    t_test = time.monotonic()
    secret = "kpca-canary-secret-" + uuid.uuid4().hex
    creds = {**CREDENTIAL_ENV, "AWS_SECRET_ACCESS_KEY": secret}
    # gs: read by gcsfs when imported (this process, its commands, the worker): no
    # question to Google's storage-control API about the bucket, which the emulator
    # cannot answer; the endpoint from storage_options only, never the environment
    gs_env = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"} if where == "gs" else {}
    bucket = f"kpca-{uuid.uuid4().hex[:12]}"
    if where == "s3":
        server = request.getfixturevalue("moto")
        opts = server.storage_options  # the endpoint only
        root = f"s3://{bucket}/{tmp_path.name}"
    elif where == "gs":
        server = request.getfixturevalue("gcs")
        opts = {"endpoint_url": server.endpoint, "token": "anon"}  # no credential exists
        root = f"gs://{bucket}/{tmp_path.name}"
    else:
        server, opts, root = None, {}, str(tmp_path / "remote")
    series = f"{root}/series"
    land_dir = tmp_path / "land"
    home = tmp_path / "home"
    wlog = tmp_path / "worker.log"

    def tail() -> str:
        return wlog.read_text()[-6000:] if wlog.exists() else "(no worker log)"

    # the Prefect server first: started before the credentials enter this process's
    # environment, so the server never has them (it copies the environment)
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", *CREDENTIAL_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    for k, v in gs_env.items():
        monkeypatch.setenv(k, v)
    with prefect_server(home) as (api, env, server_log):
        # credentials: this process (landing batches, reading the series), the commands it
        # starts (kpca run/info, the plain reader) and the worker; never a config
        for k, v in creds.items():
            monkeypatch.setenv(k, v)
        if where == "gs":
            from gcsfs.core import GCSFileSystem  # the core class, as tests/objectstore

            fs = GCSFileSystem(skip_instance_cache=True, project="test", **opts)
            fs.mkdir(bucket)
        elif where == "s3":
            fs = server.filesystem()
            server.make_bucket(bucket)
        else:
            fs = None

        def put(local: Path, rel: str) -> None:
            if fs is not None:  # a path without the scheme
                fs.put(str(local), f"{root}/{rel}".split("://", 1)[1])
            else:
                (Path(root) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local, Path(root) / rel)

        # 1. the base run, as test_series_nights publishes it
        _table(land_dir / "x.parquet", 400, 0, 0)
        put(land_dir / "x.parquet", "in/x.parquet")
        cfg = _config(tmp_path, tmp_path / "unused")
        cfg["input"].update(path=f"{root}/in/x.parquet", storage_options=opts)
        cfg["output"].update(path=series, storage_options=opts)
        cfg["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "dashboard_address": None}
        keep = cfg["output"]["keep_versions"]
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
        res = _run(tmp_path / "run.yaml")
        assert res.returncode == 0, res.stderr[-3000:]

        # 2. the pool and the deployment, as deploy/prefect.yaml's header says; the
        # pool takes one run at a time: a worker coming back after an outage then starts
        # the late runs one by one in their scheduled order (it asks for runs oldest
        # first), instead of all at once with the deployment's concurrency limit
        # (ENQUEUE) deciding which of the waiting ones goes next; and two nights' local
        # Dask clusters at once would not fit on a small host anyway
        _prefect(env, "work-pool", "create", "kpca-process", "--type", "process")
        _prefect(env, "work-pool", "set-concurrency-limit", "kpca-process", "1")
        doc = yaml.safe_load((DEPLOY / "prefect.yaml").read_text())
        dep = next(d for d in doc["deployments"] if d["name"] == "kpca-update-nightly")
        dep["schedules"] = [{"cron": "* * * * *", "timezone": "UTC", "active": True}]
        dep["parameters"] = {
            "run": series,
            "new_data": f"{root}/in/{{date:%Y-%m-%dT%H%M}}/*.parquet",
        }
        if opts:
            dep["parameters"].update(storage_options=opts, input_storage_options=opts)
        doc["deployments"] = [dep]
        (tmp_path / "prefect.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        _prefect(
            env, "--no-prompt", "deploy", "--prefect-file", str(tmp_path / "prefect.yaml"),
            "--name", "kpca-update-nightly",
        )  # fmt: skip
        deployment = _deployment(api, "kpca-update-nightly")
        assert secret not in json.dumps(deployment)

        # 3. the slots: the scheduler's runs, from the first one far enough ahead to land
        # every batch before it fires
        deadline = time.monotonic() + 120
        while True:
            ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=45)
            upcoming = sorted(
                (r for r in _runs(api, deployment["id"], "SCHEDULED") if r["auto_scheduled"]),
                key=lambda r: r["expected_start_time"],
            )
            slots = [r for r in upcoming if _utc(r["expected_start_time"]) >= ahead]
            if len(slots) >= len(PLAN):
                break
            assert time.monotonic() < deadline, f"{len(slots)} runs scheduled ahead"
            time.sleep(2)
        slots = slots[: len(PLAN)]
        times = [_utc(r["expected_start_time"]) for r in slots]
        assert all((b - a).total_seconds() == 60 for a, b in zip(times, times[1:])), times
        ids = [r["id"] for r in slots]
        folder = [f"in/{t:%Y-%m-%dT%H%M}" for t in times]

        expected: dict[str, list[str]] = {}  # run id -> the batches it merges, in order
        for i, batches in enumerate(PLAN):
            expected[ids[i]] = []
            for b in batches:
                if b[0] == "copy":
                    put(land_dir / folder[b[1]] / b[2], f"{folder[i]}/b.parquet")
                    continue
                name, n, seed, first = b[:4]
                _table(land_dir / folder[i] / name, n, seed, first)
                put(land_dir / folder[i] / name, f"{folder[i]}/{name}")
                if b[4:] != ("bad",):
                    expected[ids[i]].append(f"{folder[i]}/{name}")
        killed_batch = expected[ids[KILLED]]
        expected[ids[KILLED]] = []  # the killed run publishes nothing
        all_ids = sorted(
            i
            for batches in [[("x", 400, 0, 0)], *PLAN]
            for b in batches
            if b[0] != "copy" and b[4:] != ("bad",)
            for i in range(b[3], b[3] + b[1])
        )

        def state(i: int | str) -> dict:
            rid = ids[i] if isinstance(i, int) else i
            return httpx.get(f"{api}/flow_runs/{rid}", timeout=30).json()

        def wait_for(pred, until: float, what: str):
            while time.monotonic() < until:
                got = pred()
                if got:
                    return got
                time.sleep(1)
            raise AssertionError(f"{what}; worker log:\n{tail()}")

        def done(i) -> dict | None:
            r = state(i)
            return r if r["state_type"] in TERMINAL else None

        def mono(t: datetime.datetime) -> float:  # a slot's time on the monotonic clock
            return time.monotonic() + (t - datetime.datetime.now(datetime.UTC)).total_seconds()

        # the worker's environment: the only one with credentials (on gs: none is used)
        wenv = {**env, **creds, **gs_env}

        # 4a. the worker runs s0..s5; then an outage: the worker is killed while idle,
        # with s6 not taken. On a loaded host the nights fall behind their minutes, so the
        # test gets its idle moment from the pool: paused once s5 runs (the pool's limit
        # of 1 keeps s6 out meanwhile), the worker killed when s5 is done, the pool
        # resumed: from then on only the missing worker keeps the due nights waiting
        def pool_paused(paused: bool) -> None:
            # the test's own control call, retried on the server's 5xx: Prefect's server
            # answered 503 to it once here (2026-11-29) while the nights ran
            for _ in range(5):
                r = httpx.patch(
                    f"{api}/work_pools/kpca-process", json={"is_paused": paused}, timeout=30
                )
                if r.status_code < 500:
                    break
                time.sleep(2)
            assert r.status_code == 204, r.text

        with worker(wenv, wlog):
            taken = ("PENDING", "RUNNING", *TERMINAL)
            wait_for(lambda: state(5)["state_type"] in taken, mono(times[5]) + 600, "s5 taken")
            pool_paused(True)
            wait_for(lambda: done(5), mono(times[5]) + 900, "s5 finished")
            assert state(6)["state_type"] == "SCHEDULED", state(6)  # not taken
        pool_paused(False)
        outage = datetime.datetime.now(datetime.UTC)
        _sleep_until(max(times[7], outage) + datetime.timedelta(seconds=20))
        restart = datetime.datetime.now(datetime.UTC)
        for i in OUTAGE:
            assert state(i)["state_type"] == "SCHEDULED", state(i)  # late, waiting

        with worker(wenv, wlog) as w:
            # 4b. back: s6 and s7 run late; s8 is killed mid-merge: once its version
            # folder exists (named by no pointer), the flow-run process is SIGKILLed
            # and then its local Dask cluster (the pod died with it)
            def half_written() -> str | None:
                if state(KILLED)["state_type"] != "RUNNING":
                    assert state(KILLED)["state_type"] not in TERMINAL, state(KILLED)
                    return None
                loc = Location.at(series, opts)
                unnamed = set(version_ids(loc)) - named_ids(read_pointer(loc))
                return next(iter(unnamed), None)

            half = wait_for(half_written, mono(times[KILLED]) + 600, "s8 mid-merge")
            before = read_pointer(Location.at(series, opts))["version"]
            proc = _flow_process(w.pid, ids[KILLED])
            assert proc is not None, "the flow-run process of s8 was not found"
            cluster = proc.children(recursive=True)
            proc.send_signal(signal.SIGKILL)
            for p in cluster:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGKILL)
            killed = wait_for(lambda: done(KILLED), time.monotonic() + 120, "s8 ended")
            assert killed["state_type"] == "CRASHED", killed["state"]
            # never a half-written version: the address serves the version before s8's
            open_run(series, storage_options=opts)  # verified
            assert read_pointer(Location.at(series, opts))["version"] == before != half
            assert half in version_ids(Location.at(series, opts))  # left, named by nothing

            # 4c. the next night works, and catches up: s8's batch first, then its own
            nxt = wait_for(lambda: done(KILLED + 1), mono(times[KILLED + 1]) + 600, "s9")
            assert nxt["state_type"] == "COMPLETED", (nxt["state"], tail())
            m = open_run(series, storage_options=opts).manifest
            got = [e["source"]["path"] for e in m["update"]["rows"][1:]]
            assert got[-2].endswith(killed_batch[0]), got
            assert got[-1].endswith(expected[ids[KILLED + 1]][0]), got
            expected[ids[KILLED + 1]] = killed_batch + expected[ids[KILLED + 1]]
            # an operator re-runs the killed night's slot: already merged, a no-op
            out = _prefect(
                env, "deployment", "run", DEPLOYMENT,
                "--param", f'logical_date="{times[KILLED].isoformat()}"',
            )  # fmt: skip
            rerun = next(r for r in _runs(api, deployment["id"]) if not r["auto_scheduled"])
            assert rerun["id"] in out or rerun["name"] in out, out
            expected[rerun["id"]] = []

            # 4d. the rest of the nights; then the schedule is paused (its future runs
            # deleted by the server) and every run waits to finish
            _sleep_until(times[-1] + datetime.timedelta(seconds=5))
            sched = deployment["schedules"][0]["id"]
            _prefect(env, "--no-prompt", "deployment", "schedule", "pause", DEPLOYMENT, sched)
            final = mono(times[-1]) + 900
            for rid in [*ids, rerun["id"]]:
                wait_for(lambda rid=rid: done(rid), final, f"run {rid} finished")
            wait_for(
                lambda: (
                    not [
                        r
                        for r in _runs(api, deployment["id"])
                        if r["state_type"] not in TERMINAL
                    ]
                ),
                final,
                "no run left in flight",
            )
        runs = {r["id"]: r for r in _runs(api, deployment["id"])}
        logs = {i: _logs(api, ids[i]) for i in range(len(PLAN))}
        logs["rerun"] = _logs(api, rerun["id"])
        server_db = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
        assert secret.encode() not in server_db  # no credential in the server's database

    # 5. what the nights did
    named = [(f"s{i}", times[i], rid) for i, rid in enumerate(ids)]
    for label, slot, rid in [*named, (f"re-run of s{KILLED}", times[KILLED], rerun["id"])]:
        r = runs[rid]
        print(
            f"{label} ({slot:%H:%M}): {r['state_type']}, ran {r['start_time']} to "
            f"{r['end_time']}, merged {expected[rid]}"
        )
    states = {i: runs[ids[i]]["state_type"] for i in range(len(PLAN))}
    # from s10 on, its refused batch stays pending: every later night fails naming it
    want = {i: "COMPLETED" for i in range(len(PLAN))} | {KILLED: "CRASHED"}
    want |= {i: "FAILED" for i in range(BAD, len(PLAN))}
    assert states == want, (states, tail())
    assert runs[rerun["id"]]["state_type"] == "COMPLETED", runs[rerun["id"]]["state"]
    refused = f"{folder[BAD]}/a.parquet was refused"
    for i in range(BAD, len(PLAN)):
        message = runs[ids[i]]["state"]["message"]
        assert refused in message and "already in the series" in message, (i, message)
        assert "b.parquet" not in message, message  # s10's good batch: published
    for i, batches in enumerate(PLAN):
        if not batches and i < BAD:
            assert "no batch in" in logs[i], (i, logs[i])
    assert "already merged (version " in logs[2], logs[2]
    assert "already merged (version " in logs["rerun"], logs["rerun"]
    # the scheduled runs ran in slot order, the missed ones after the outage
    started = [_utc(runs[r]["start_time"]) for r in ids if runs[r]["start_time"]]
    assert started == sorted(started), started
    for i in OUTAGE:
        assert _utc(runs[ids[i]]["start_time"]) > restart, runs[ids[i]]
    # unplanned runs (one due before s0, before the worker started; one due when the
    # schedule was paused): no-op nights, or after s10 the refused batch again
    for r in runs.values():
        if r["id"] not in expected:
            late = _utc(r["expected_start_time"]) > times[BAD]
            ok = r["state_type"] == "COMPLETED" or (
                late and r["state_type"] == "FAILED" and refused in r["state"]["message"]
            )
            assert ok, r

    # every good batch merged exactly once, in the order the runs ran
    order = sorted(
        (r for r in expected if expected[r]), key=lambda r: _utc(runs[r]["start_time"])
    )
    want_sources = [b for r in order for b in expected[r]]
    pub = open_run(series, storage_options=opts)
    rows = pub.manifest["update"]["rows"][1:]
    sources = [e["source"]["path"].split(root + "/", 1)[1] for e in rows]
    assert sources == want_sources, (sources, want_sources)
    assert len({e["source"]["sha256"] for e in rows}) == len(rows)
    # the address names the last merge's version
    last = rows[-1]["run"].rstrip("/").rpartition("/")[2]
    assert last == read_pointer(Location.at(series, opts))["version"], rows[-1]
    got_ids = _plain_ids(series, opts)
    assert sorted(got_ids) == all_ids and len(set(got_ids)) == len(got_ids)
    info = _kpca("info", series, *([f"--storage-options={json.dumps(opts)}"] if opts else []))
    assert info.returncode == 0, info.stderr[-2000:]
    # storage within retention: the versions kept, and nothing complete left unnamed
    loc = Location.at(series, opts)
    pointer = read_pointer(loc)
    assert len(history_ids(pointer)) <= keep, pointer["history"]
    complete = [v for v in version_ids(loc) if version_manifest(loc, v) is not None]
    assert set(complete) <= named_ids(pointer), (complete, pointer["history"])
    assert len(complete) <= keep, complete  # retention_grace_hours 0: deleted at once
    # the only unfinished folder: the killed night's, until a writer finds it older than
    # a lease (10 minutes)
    assert set(version_ids(loc)) - set(complete) <= {half}, version_ids(loc)
    print(
        f"\n{where}: {time.monotonic() - t_test:.0f} s; complete versions on the store "
        f"{len(complete)}, kept {len(history_ids(pointer))} (keep_versions {keep}); "
        f"all version folders {version_ids(loc)}"
    )
    assert secret not in json.dumps(pub.manifest)
