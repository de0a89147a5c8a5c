"""Where a fit runs: the cluster, or the client's threads when the cluster would not pay.

:func:`choose_execution` uses the cost model (:func:`~kpca_dask.cost.estimate`) to run a
small fit on the client's threads when a distributed client is active but the cluster's
per-task cost exceeds what its cores would save.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .calibration import _noop
from .cluster import Cluster
from .estimation import estimate
from .machine import Machine, load_machine
from .rates import _eff_inner

__all__ = [
    "EXECUTION_CONFIG",
    "Execution",
    "choose_execution",
    "cluster_threads",
    "fit_execution",
    "transform_execution",
]


@dataclass(frozen=True)
class Execution:
    """Where a fit (or transform) runs: "cluster" (the active scheduler) or "local
    threads" (dask's threaded scheduler in this process), and why."""

    where: str
    reason: str

    @contextlib.contextmanager
    def scheduler(self) -> Iterator[None]:
        """The fit's (or transform's) scheduler, set for its duration: dask's threads
        for "local threads"; for "scheduler", without ``distributed`` imported and
        no scheduler configured, dask's threaded ``get`` itself (what dask picks for
        arrays then, named so that ``dask.base.get_scheduler`` does not import
        ``distributed`` at every compute to look for a client: 0.2-0.4 s per process,
        issue 29), and rechunking by tasks (what dask chooses without a client, after
        importing ``distributed`` to find out); else the active scheduler, untouched."""
        import dask

        if self.where == "local threads":
            with dask.config.set(scheduler="threads"):
                yield
        elif self.where == "scheduler" and _threads_by_default():
            import dask.threaded

            cfg: dict[str, Any] = {"scheduler": dask.threaded.get}
            if not dask.config.get("array.rechunk.method", None):
                cfg["array.rechunk.method"] = "tasks"  # dask's choice without a client
            with dask.config.set(cfg):
                yield
        else:
            yield


def _threads_by_default() -> bool:
    """No ``distributed`` imported (so no distributed client) and no scheduler set in
    dask's config: dask computes arrays on its threaded scheduler."""
    import sys

    import dask

    return (
        "distributed" not in sys.modules
        and not dask.config.get("scheduler", None)
        and not dask.config.get("get", None)
    )


#: dask config key forcing the choice: "auto" (default), "local" or "cluster".
EXECUTION_CONFIG = "kpca.execution"

_ROUNDTRIP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _client_roundtrip(client: Any, machine: Machine) -> float:
    """The round trip of a one-task graph on ``client``'s cluster, measured once per
    client (three trivial graphs, the median; ~tens of ms)."""
    try:
        return _ROUNDTRIP[client]
    except (KeyError, TypeError):
        pass
    import dask

    times = []
    try:
        for i in range(3):
            t0 = time.perf_counter()
            client.compute(dask.delayed(_noop)(i, dask_key_name=f"kpca-ping-{i}"), sync=True)
            times.append(time.perf_counter() - t0)
        value = float(np.median(times))
    except Exception:  # a client that cannot run a task: price it with the constant
        value = machine.roundtrip_seconds
    with contextlib.suppress(TypeError):
        _ROUNDTRIP[client] = value
    return value


def _active_client() -> Any:
    from ..gram import _scheduler_kind

    kind, client = _scheduler_kind()
    return client if kind == "distributed" else None


def _round_trips(plan: Any, passes: int) -> int:
    """Graphs a fit submits (each a round trip): finite check, rechunk/persist, trace,
    gather of X, plus the solver's own."""
    base = 4
    if plan.solver == "dense":
        return base + 1
    if plan.solver == "nystroem":
        return base + 3 + passes
    return base + 2 * passes  # Z persisted, then at least one wave per pass


def choose_execution(
    plan: Any, params: dict | None = None, *, rows: int | None = None, what: str = "fit"
) -> Execution:
    """Run on the client's threads when a distributed client is active and the cluster's
    overhead for this fit (its measured round trips and per-task cost, and moving X and
    the results) exceeds the compute time its extra cores would save (the cost model's
    prediction); else on the active scheduler. ``rows``: a transform of that many rows
    (each against ``plan.n_samples`` training rows, or the landmarks). The dask config
    key ``kpca.execution`` ("local" or "cluster") forces it."""
    import dask

    forced = dask.config.get(EXECUTION_CONFIG, "auto")
    client = _active_client()
    if client is None:
        return Execution("scheduler", "the active dask scheduler (no distributed client)")
    if forced == "cluster":
        return Execution("cluster", f"cluster (forced: {EXECUTION_CONFIG}='cluster')")
    if forced == "local":
        return Execution("local threads", f"local threads (forced: {EXECUTION_CONFIG}='local')")
    try:
        machine = load_machine()
        cl = Cluster.from_client(client)
        local = Cluster.local()
        n = int(plan.n_samples)
        if what == "fit":
            est_c = estimate(plan, cl, machine, params=params, **_est_kwargs(params))
            compute = sum(s.parts.get("compute", 0.0) for s in est_c.stages)
            passes = est_c.passes
            tasks = est_c.tasks_per_pass * max(1, passes)
            moved = est_c.bytes_to_client_per_pass * passes + 2 * n * plan.n_features * 8
            mem_local = est_c.memory_client + est_c.memory_per_worker * cl.workers
            trips = _round_trips(plan, passes)
        else:
            cols = int(plan.n_landmarks or n) if plan.solver == "nystroem" else n
            d = int(plan.n_features)
            g = machine.gemm(plan.dtype)
            work = (
                rows * cols * (2 * (d + 2) / (g * _eff_inner(d)) + 1 / machine.exp(plan.dtype))
            )
            compute = work / cl.cores
            tasks = math.ceil(rows / max(1, plan.block_rows))
            moved = rows * d * 8 * 2 + cols * d * 8
            mem_local = rows * 8 * 64 + cols * d * 8
            trips = 1
        roundtrip = _client_roundtrip(client, machine)
        overhead = trips * roundtrip + tasks * machine.task_seconds + moved / machine.network
        local_compute = compute * cl.cores / max(1, local.cores)
        saved = local_compute - compute
        if overhead > saved and mem_local < 0.25 * (local.memory or 0):
            return Execution(
                "local threads",
                f"local threads (n={n}{'' if rows is None else f', {rows} rows'}: cluster "
                f"overhead {overhead:.2g} s > compute saved {max(saved, 0):.2g} s of "
                f"{local_compute:.2g} s)",
            )
        return Execution(
            "cluster",
            f"cluster (n={n}: compute {compute:.2g} s on {cl.cores} threads saves "
            f"{saved:.2g} s against overhead {overhead:.2g} s)",
        )
    except Exception as exc:  # the model must never stop a fit: run as before
        return Execution("cluster", f"cluster (execution not modelled: {exc})")


def _est_kwargs(params: dict | None) -> dict[str, Any]:
    if not params:
        return {}
    return {
        "n_components": params.get("n_components"),
        "n_oversamples": int(params.get("n_oversamples", 16)),
    }


def fit_execution(est: Any, X: Any, **fit_kw: Any) -> Execution:
    """:func:`choose_execution` for ``est.fit(X, **fit_kw)``; never raises (a bad input is
    the fit's to refuse, with its own message)."""
    if _active_client() is None:
        return Execution("scheduler", "the active dask scheduler (no distributed client)")
    try:
        params = est.get_params(deep=False)
        plan = est.plan(
            X,
            kernel_blocks=fit_kw.get("kernel_blocks"),
            centring=fit_kw.get("centring"),
            kernel=False,
        )
    except Exception:
        return Execution("cluster", "cluster (the fit's input could not be planned)")
    return choose_execution(plan, params)


def transform_execution(est: Any, rows: int) -> Execution:
    """:func:`choose_execution` for embedding ``rows`` in-memory rows with a fitted ``est``."""
    if _active_client() is None:
        return Execution("scheduler", "the active dask scheduler (no distributed client)")
    from types import SimpleNamespace

    plan = SimpleNamespace(
        n_samples=int(est.n_samples_fit_),
        n_features=int(est.n_features_in_),
        solver=est.eigen_solver_,
        n_landmarks=getattr(est, "n_landmarks_", None),
        block_rows=int(est.chunk_size_),
        dtype=est.dtype_,
    )
    return choose_execution(plan, rows=rows, what="transform")


def cluster_threads() -> int:
    """Threads of the active distributed cluster, else this machine's cores (what the
    block rule and the exact product's waves are sized by)."""
    from ..gram import _cluster_threads

    return _cluster_threads()
