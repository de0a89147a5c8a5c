"""Run the kpca pipeline flow on Slurm, with Dask workers as Slurm jobs (dask-jobqueue).

On a login node (or inside a small sbatch job), in the project's environment::

    pip install dask-jobqueue
    python deploy/slurm/slurm_cluster.py my-run.yaml --jobs 8 --queue compute --account myproj

``SLURMCluster`` starts a Dask scheduler in this process and submits one Slurm
job per worker; the flow (``kpca_pipeline``, recorded in the Prefect server
named by ``PREFECT_API_URL``, or an ephemeral local API) connects to that
scheduler, runs, and the workers' jobs are cancelled when it ends. Inputs and
``output.path`` must be on a filesystem every node sees (or an object store).

Sizing follows docs/design.md: one worker process per job with ``--cores`` threads
(Dask's nanny pins BLAS to one thread per worker process, so threads never
exceed cores) and a memory limit a little below the job's allocation, so Dask
spills and pauses before Slurm kills the job.

To run the workers in the project's container instead of a shared virtualenv,
build deploy/Dockerfile, push it, and pass e.g.
``--python "apptainer exec docker://registry.example.com/kpca-dask:0.1.0 python"``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def make_cluster(
    *,
    queue: str | None,
    account: str | None,
    cores: int,
    memory: str,
    walltime: str,
    python: str | None,
    log_directory: str,
) -> Any:
    """A ``SLURMCluster`` whose jobs each run one Dask worker process."""
    from dask_jobqueue import SLURMCluster

    return SLURMCluster(
        queue=queue,
        account=account,
        cores=cores,  # threads of the one worker process in each job
        processes=1,
        memory=memory,  # the job's allocation; the worker's memory limit is this
        walltime=walltime,
        python=python or sys.executable,  # the same environment as this process
        local_directory="$TMPDIR",  # spill to node-local disk
        log_directory=log_directory,
        # the flow talks to the scheduler; the workers must reach it on this host's
        # cluster network (set `interface=` to e.g. "ib0" where that is needed)
        scheduler_options={"dashboard_address": ":8787"},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="pipeline YAML (docs/config.md); cluster.address is set here")
    p.add_argument("--jobs", type=int, default=4, help="Slurm jobs = Dask workers")
    p.add_argument("--queue", default=os.environ.get("SLURM_QUEUE"))
    p.add_argument("--account", default=os.environ.get("SLURM_ACCOUNT"))
    p.add_argument("--cores", type=int, default=4, help="cores (= threads) per worker job")
    p.add_argument("--memory", default="16GiB", help="memory per worker job")
    p.add_argument("--walltime", default="04:00:00")
    p.add_argument("--python", help="the workers' python command (default: this interpreter)")
    p.add_argument("--log-directory", default="dask-slurm-logs")
    p.add_argument(
        "--wait",
        type=float,
        default=900.0,
        help="seconds to wait for the first worker job to start",
    )
    p.add_argument(
        "--no-prefect",
        dest="prefect",
        action="store_false",
        help="run the stages without Prefect",
    )
    args = p.parse_args(argv)

    from flows.pipeline_flow import run_flow_or_plain
    from pipeline.config import load_config

    cfg = load_config(args.config)
    with make_cluster(
        queue=args.queue,
        account=args.account,
        cores=args.cores,
        memory=args.memory,
        walltime=args.walltime,
        python=args.python,
        log_directory=args.log_directory,
    ) as cluster:
        cluster.scale(jobs=args.jobs)
        print(
            f"Dask scheduler {cluster.scheduler_address}; dashboard "
            f"{cluster.dashboard_link}; {args.jobs} worker jobs submitted",
            flush=True,
        )
        cfg.cluster.address = cluster.scheduler_address
        cfg.cluster.connect_timeout = args.wait  # queued jobs may take a while to start
        summary = run_flow_or_plain(cfg, use_prefect=args.prefect)
    print(f"run complete: {summary.out} ({summary.manifest['status']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
