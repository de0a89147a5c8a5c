"""The cost model's prediction for one fit: :func:`estimate`.

:func:`estimate` reads the plan and the cluster into a :class:`~.pricing._Fit` (the shapes
and the constants every solver's pricing needs), prices reading the input, then the
solver's own stages (:mod:`.price_nystroem`, :mod:`.price_dense`, :mod:`.price_exact`),
and gathers them into an :class:`~kpca_dask.cost.result.Estimate`. How each driver is
modelled: the package's docstring (:mod:`kpca_dask.cost`) and docs/scaling.md.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .cluster import Cluster
from .machine import Machine
from .price_dense import _price_dense
from .price_exact import _price_exact
from .price_nystroem import _price_nystroem
from .price_workers import _price_exact_workers, _price_nystroem_workers
from .pricing import _Fit, _fit_of, _Priced, _read
from .result import Estimate

__all__ = ["estimate"]


def estimate(
    plan: Any,
    cluster: Cluster | None = None,
    machine: Machine | None = None,
    *,
    n_components: int | None = None,
    n_oversamples: int = 16,
    passes: int | None = None,
    kernel_cache: str = "auto",
    params: dict | None = None,
    input_in_memory: bool = True,
    persist: bool | None = None,
    driver: str = "blocks",
    store: str | None = None,
) -> Estimate:
    """Predict the cost of the fit ``plan`` describes (see :mod:`kpca_dask.cost`).

    ``n_components`` and ``n_oversamples`` set the block width ``c = k + oversamples``;
    ``passes`` overrides the expected number of passes; ``kernel_cache``: "recompute"
    (evaluate every block at every pass), "memory" (cached after the first pass),
    "store" (read from a kernel store at the machine's storage bandwidth) or "auto"
    (the estimator's rule, :meth:`kpca_dask.gram.BlockKernelMatrix.plan_cache`:
    "memory" when the upper blocks fit half of the workers' memory -- or the dask
    config ``kpca.kernel-cache-budget`` when set -- and the fit makes more than one
    pass, "partial" (the blocks that fit kept, the others evaluated at every pass)
    when at least one block fits, else "recompute"; the cluster's ``memory`` unknown
    and no budget set: "recompute").
    ``input_in_memory``: numpy rows on the client (sent to the workers once); False:
    a dask/zarr source the workers read (Nyström re-reads it at every pass above
    256 MB, as :meth:`FitPlan.persists` decides; ``persist`` overrides: the pipeline
    reads the rows into the workers' memory when they fit).
    ``driver``: "blocks" (the drivers as they run: a task per kernel block or row block)
    or "workers" (the per-worker drivers of issue 38: a few tasks per worker and a
    reduction tree per pass, the basis on the workers; :mod:`.price_workers`).
    """
    if driver not in ("blocks", "workers"):
        raise ValueError(f"driver {driver!r}: 'blocks' or 'workers'")
    f = _fit_of(plan, cluster, machine, n_components, n_oversamples, passes, params)
    f.driver, f.store = driver, store
    f.stage("read", _read(f, input_in_memory, persist))
    if plan.solver == "nystroem":
        priced = _price_nystroem_workers(f) if driver == "workers" else _price_nystroem(f)
    elif plan.solver == "dense":
        priced = _price_dense(f)
    elif driver == "workers":
        priced = _price_exact_workers(f, kernel_cache)
    else:  # randomized (and arpack, priced as block passes of one column)
        priced = _price_exact(f, kernel_cache)
    return _estimate_of(f, priced)


def _estimate_of(f: _Fit, p: _Priced) -> Estimate:
    total = sum(s.seconds for s in f.stages)
    main = max(f.stages, key=lambda s: s.seconds)
    f.assumptions.append(
        f"{p.passes} passes ({'measured' if f.passes else 'expected; the spectrum decides'})"
    )
    return Estimate(
        driver=f.driver,
        solver=f.plan.solver,
        n_samples=f.n,
        n_features=f.d,
        block_rows=f.r,
        n_blocks=f.nb,
        passes=p.passes,
        passes_range=tuple(p.passes_range),
        columns=p.columns,
        tasks_per_pass=int(p.tasks),
        block_tasks_per_pass=int(p.block_tasks),
        waves_per_pass=int(p.waves),
        graph_bytes_per_pass=int(p.graph_bytes),
        kernel_evaluations_per_pass=int(p.evals),
        flops_per_pass=float(p.flops),
        bytes_to_client_per_pass=int(p.to_client),
        bytes_from_client_per_pass=int(p.from_client),
        worker_to_worker_bytes_per_pass=int(p.w2w),
        storage_bytes_per_pass=int(p.storage),
        memory_per_worker=int(p.mem_worker),
        memory_client=int(p.mem_client),
        stages=f.stages,
        seconds=float(total),
        bound=main.bound,
        cluster=asdict(f.cl),
        machine=f.m.to_dict(),
        assumptions=f.assumptions,
        kernel_cache=p.kernel_cache,
        kernel_cache_bytes=int(p.kernel_cache_bytes),
        kernel_cache_share=float(p.kernel_cache_share),
    )
