#!/usr/bin/env bash
# A real Dask cluster on this machine, the kpca_pipeline flow on it, and a clean stop.
#
#   bash deploy/local-cluster.sh [--workers N] [--memory-limit 1GiB] [--rows 6000] [--keep DIR]
#
# 1. starts `dask scheduler` and N `dask worker` processes, all bound to
#    127.0.0.1, each worker one process with one thread and a memory limit;
# 2. waits until all N workers have joined;
# 3. writes a small labelled dataset (Parquet) and a pipeline config whose
#    cluster.address is that scheduler, and runs `kpca run` -- the Prefect
#    flow (against PREFECT_API_URL if set, else an ephemeral local API);
# 4. checks the published run (`kpca info` verifies manifest and checksums),
#    that the scheduler really executed the work, that a second identical run
#    is entirely cached -- this one against a Prefect server the script starts
#    (unless PREFECT_API_URL names one), checked in the server's records -- and
#    that the kpca_transform flow embeds a new batch;
# 5. stops every process it started (also on failure or Ctrl-C) and checks
#    that none is left.
#
# Needs the project installed in the active Python environment (or in ./.venv):
#   python3 -m venv .venv && . .venv/bin/activate && pip install -e .
# CI (.ci/run) runs it after the tests. Environment overrides: KPCA_WORKERS,
# KPCA_MEMORY_LIMIT, KPCA_ROWS.
set -euo pipefail
cd "$(dirname "$0")/.."

workers="${KPCA_WORKERS:-2}"
memory_limit="${KPCA_MEMORY_LIMIT:-1GiB}"
rows="${KPCA_ROWS:-6000}"
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --memory-limit) memory_limit="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "local-cluster.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if ! command -v kpca >/dev/null 2>&1 && [ -f .venv/bin/activate ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
for cmd in python dask kpca; do
  command -v "$cmd" >/dev/null 2>&1 || {
    echo "local-cluster.sh: '$cmd' not found; install the project first:" >&2
    echo "  python3 -m venv .venv && . .venv/bin/activate && pip install -e ." >&2
    exit 2
  }
done

if [ -n "$keep" ]; then
  work="$keep"; mkdir -p "$work"
else
  work="$(mktemp -d "${TMPDIR:-/tmp}/kpca-local-cluster.XXXXXX")"
fi
mkdir -p "$work/logs"
# a throwaway Prefect home unless the caller chose one (or a server via PREFECT_API_URL)
export PREFECT_HOME="${PREFECT_HOME:-$work/prefect-home}"
t_start=$(date +%s)
log() { echo "[local-cluster $(( $(date +%s) - t_start ))s] $*"; }

pids=()
stop_all() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "${#pids[@]}" -gt 0 ]; then
    log "stopping ${#pids[@]} processes: ${pids[*]}"
    # children first (the nannies' worker processes), then the processes we started
    for pid in "${pids[@]}"; do
      for child in $(pgrep -P "$pid" 2>/dev/null || true); do kill -TERM "$child" 2>/dev/null || true; done
      kill -TERM "$pid" 2>/dev/null || true
    done
    for _ in $(seq 1 40); do
      alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ "$alive" = 0 ] && break
      sleep 0.25
    done
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        log "process $pid did not stop; killing it"
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done
    left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    if [ "$left" = 1 ]; then echo "local-cluster.sh: processes left running" >&2; rc=1; fi
  fi
  if [ "$rc" != 0 ]; then
    echo "local-cluster.sh: FAILED (exit $rc); logs in $work/logs:" >&2
    for f in "$work"/logs/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 25 "$f" >&2; }; done
  elif [ -z "$keep" ]; then
    rm -rf "$work"
  fi
  exit "$rc"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# Free ports on 127.0.0.1 for the scheduler and its dashboard.
read -r port dash_port < <(python - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
EOF
)
address="tcp://127.0.0.1:$port"

log "starting dask scheduler at $address (dashboard http://127.0.0.1:$dash_port/status)"
dask scheduler --host 127.0.0.1 --port "$port" --dashboard-address "127.0.0.1:$dash_port" \
  --scheduler-file "$work/scheduler.json" > "$work/logs/scheduler.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 120); do [ -s "$work/scheduler.json" ] && break; sleep 0.25; done
[ -s "$work/scheduler.json" ] || { echo "the scheduler did not start" >&2; exit 1; }

# the workers keep block-sized buffers for reuse instead of distributed's
# MALLOC_TRIM_THRESHOLD_=65536 (pipeline.runtime.cluster.WORKER_MALLOC_ENV, docs/kernel-store.md)
malloc_env="$(python -c 'from pipeline.runtime.cluster import WORKER_MALLOC_ENV as e; print(" ".join(f"{k}={v}" for k, v in e.items()))')"
for i in $(seq 1 "$workers"); do
  # shellcheck disable=SC2086
  env $malloc_env dask worker "$address" --host 127.0.0.1 --nworkers 1 --nthreads 1 \
    --memory-limit "$memory_limit" --name "local-worker-$i" --no-dashboard \
    --local-directory "$work/dask-worker-space" > "$work/logs/worker-$i.log" 2>&1 &
  pids+=($!)
done
log "started $workers workers (1 thread, memory limit $memory_limit each); waiting for them"

python - "$address" "$workers" <<'EOF'
import sys
from distributed import Client

address, n = sys.argv[1], int(sys.argv[2])
with Client(address, timeout=60) as client:
    client.wait_for_workers(n, timeout=120)
    info = client.scheduler_info()
    limits = sorted(w["memory_limit"] for w in info["workers"].values())
    hosts = {w["host"] for w in info["workers"].values()}
    assert hosts == {"127.0.0.1"}, hosts
    print(f"  {len(info['workers'])} workers on {sorted(hosts)}, memory limits {limits}")
EOF

log "writing $rows rows of test data and the run config"
python - "$work" "$rows" "$address" <<'EOF'
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

work, rows, address = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
d, k = 12, 4
centres = rng.normal(scale=3.0, size=(k, d))
labels = rng.integers(0, k, size=rows + 200)
X = centres[labels] + rng.normal(size=(rows + 200, d))
cols = [f"f{j}" for j in range(d)]
frame = pd.DataFrame(X, columns=cols)
frame.insert(0, "id", np.arange(rows + 200, dtype=np.int64))
frame["label"] = [f"class{c}" for c in labels]
frame.iloc[:rows].to_parquet(work / "features.parquet", index=False)
frame.iloc[rows:][["id"] + cols].to_parquet(work / "batch.parquet", index=False)
config = {
    "input": {"path": str(work / "features.parquet"), "label_column": "label",
              "id_column": "id"},
    "kernel": {"name": "rbf", "gamma": "scale"},
    "solver": {"n_components": 8, "eigen_solver": "randomized", "dtype": "float32",
               "random_state": 0},
    # small chunks and blocks on purpose: many chunks, a kernel store of many blocks
    "chunks": {"target_chunk_mb": 0.1, "block_rows": 1000},
    "kernel_store": {"materialize": "always"},
    "output": {"path": str(work / "run"), "parquet": True},
    "cluster": {"address": address, "connect_timeout": 60},
    "evaluate": {"enabled": True, "sweep_components": [2, 8], "gamma_sweep": None},
}
(work / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
EOF

# the registry's stages (one Prefect task each in the flow): ingest ... export
nstages=$(python -c "from pipeline.stages import REGISTRY; print(len(REGISTRY))")

log "kpca run (the kpca_pipeline flow) against $address"
kpca run "$work/run.yaml" --no-progress > "$work/logs/run-1.log" 2>&1 || { cat "$work/logs/run-1.log"; exit 1; }
sed -n '/run complete/,$p' "$work/logs/run-1.log"
grep -q "0 of $nstages stages cached" "$work/logs/run-1.log"
grep -q "connected to $address ($workers workers)" "$work/logs/run-1.log"

log "kpca info: manifest complete, checksums match"
kpca info "$work/run" > "$work/logs/info.log" 2>&1 || { cat "$work/logs/info.log"; exit 1; }
grep -q "complete, verified" "$work/logs/info.log"
grep -q "$rows rows x 12 features" "$work/logs/info.log"

python - "$address" "$work/run" <<'EOF'
import json, sys
from distributed import Client

address, out = sys.argv[1], sys.argv[2]
with Client(address, timeout=30) as client:
    done = client.run_on_scheduler(
        lambda dask_scheduler: sum(1 for _ in dask_scheduler.transition_log))
    per_worker = client.run(lambda dask_worker: len(dask_worker.state.log))
assert done > 0, "the scheduler executed nothing"
assert all(n > 0 for n in per_worker.values()), per_worker
m = json.load(open(f"{out}/manifest.json"))
assert m["status"] == "complete" and m["kernel_store"]["materialized"], m["kernel_store"]
print(f"  scheduler transitions logged: {done}; worker task events: {sorted(per_worker.values())}")
EOF

if [ -z "${PREFECT_API_URL:-}" ]; then
  # The first run used an ephemeral API; the rest run against a real server.
  read -r api_port < <(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  log "starting a Prefect server on 127.0.0.1:$api_port (PREFECT_HOME=$PREFECT_HOME)"
  PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_ENABLED=false \
    prefect server start --host 127.0.0.1 --port "$api_port" > "$work/logs/prefect-server.log" 2>&1 &
  pids+=($!)
  export PREFECT_API_URL="http://127.0.0.1:$api_port/api"
  python - "$PREFECT_API_URL" <<'EOF'
import sys, time
import httpx

url = sys.argv[1] + "/health"
for _ in range(240):
    try:
        if httpx.get(url, timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
else:
    sys.exit(f"the Prefect server did not answer at {url}")
EOF
fi

log "second, identical run against $PREFECT_API_URL: every stage must be a cache hit"
kpca run "$work/run.yaml" --overwrite --no-progress > "$work/logs/run-2.log" 2>&1 || { cat "$work/logs/run-2.log"; exit 1; }
grep "prefect " "$work/logs/run-2.log"
grep -q "$nstages of $nstages stages cached; nothing recomputed" "$work/logs/run-2.log"
NSTAGES=$nstages python - <<'EOF'
# what the server recorded for that run: one task run per stage, all Cached
import os

from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter
from prefect.client.schemas.sorting import FlowRunSort, TaskRunSort

with get_client(sync_client=True) as client:
    runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["kpca-pipeline"])),
                                 sort=FlowRunSort.START_TIME_DESC, limit=1)
    assert runs and runs[0].state.is_completed(), runs
    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [runs[0].id]}),
                                  sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=50)
    states = sorted(t.state.name for t in tasks)
    assert states == ["Cached"] * int(os.environ["NSTAGES"]), states
    print(f"  server: flow run {runs[0].name!r} completed, task runs {states.count('Cached')}x Cached")
EOF

log "kpca_transform flow: embed a new batch with the saved model, on the same cluster"
python - "$work" "$address" > "$work/logs/transform.log" 2>&1 <<'EOF' || { cat "$work/logs/transform.log"; exit 1; }
import sys

import zarr

from flows.transform_flow import kpca_transform

work, address = sys.argv[1], sys.argv[2]
res = kpca_transform(model=f"{work}/run", input={"path": f"{work}/batch.parquet", "id_column": "id"},
                     output=f"{work}/batch-embedding.zarr", cluster={"address": address})
from pipeline.output.versions import open_output
emb = open_output(res["output"]).data.open_group("r")["embedding"]  # the published version
assert emb.shape == (200, 8), emb.shape
print(f"transform: {res['rows']} rows -> {res['components']} components at {res['output']}")
EOF
grep "^transform:" "$work/logs/transform.log"

log "OK: flow ran on the local cluster, run verified, re-run fully cached"
