"""The fit spec: how a run's config sets up the estimator, in one place.

One table (:data:`PARAMS`) maps each config field to the
:class:`~kpca_dask.KernelPCA` parameter it sets. Everything else derives from it:

* the estimator (:func:`make_estimator`), built from the table and the overrides a
  stage decided (the kernel stage's resolved gamma, an update's kept solver) -- the
  config itself is never written to;
* the config slices the stages declare (:data:`PLAN_FIELDS`: what chooses the solver
  and its kernel partition, the kernel stage's cache key; :data:`FIT_FIELDS`: all that
  the fit reads, the solve and update stages' key);
* the validation of those fields when the config is loaded (:func:`check_field`): the
  estimator's own rules (kpca_dask/plan.py), so a bad value gets the estimator's words
  with the config field's name, from one validation system;
* the plan of the fit (:func:`plan_fit`): the solver, the rows per block of the kernel
  partition (``chunks.block_rows: auto`` resolved here and nowhere else in the
  pipeline) and whether the kernel matrix is materialised. The kernel stage makes it
  once and carries it to the solve in its :class:`~pipeline.runner.results.KernelResult`;
  ``kpca update`` and ``kpca plan`` (pipeline/runtime/sizing.py) make it with the same function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kpca_dask.exceptions import InvalidParameterError
from kpca_dask.params import check_param, check_params

if TYPE_CHECKING:  # pragma: no cover
    from kpca_dask import KernelPCA
    from kpca_dask.plan import FitPlan

# Loading a config checks its values here (check_field) before anything starts, so this
# module's top imports only the estimator's light parameter rules (kpca_dask/params.py):
# the estimator and its planner (dask) are imported where a fit is built.

__all__ = [
    "FIT_FIELDS",
    "PARAMS",
    "PLAN_FIELDS",
    "Fit",
    "Param",
    "auto_rows",
    "check_field",
    "estimator_params",
    "make_estimator",
    "plan_fit",
]


@dataclass(frozen=True)
class Param:
    """One config field and the estimator parameter it sets."""

    field: str
    param: str
    #: True: it chooses the solver or the kernel partition (the kernel stage plans with
    #: it and its cache key hashes it); False: only the fit reads it
    plans: bool = False
    #: set only when this boolean config field is true (the pre-image map's parameters
    #: exist only when denoising; otherwise the estimator's defaults stay in the model)
    when: str | None = None


#: config field -> KernelPCA parameter: the one table (docs/design.md, "the fit spec")
PARAMS: tuple[Param, ...] = (
    Param("kernel.name", "kernel", plans=True),
    Param("kernel.gamma", "gamma", plans=True),
    Param("kernel.degree", "degree", plans=True),
    Param("kernel.coef0", "coef0", plans=True),
    Param("solver.n_components", "n_components", plans=True),
    Param("solver.eigen_solver", "eigen_solver", plans=True),
    Param("solver.n_oversamples", "n_oversamples", plans=True),
    Param("solver.random_state", "random_state", plans=True),
    Param("solver.dtype", "dtype", plans=True),
    Param("solver.n_landmarks", "n_landmarks", plans=True),
    Param("solver.landmark_method", "landmark_method", plans=True),
    Param("chunks.block_rows", "chunk_size", plans=True),
    Param("solver.n_power_iter", "n_power_iter"),
    Param("solver.tol", "tol"),
    Param("solver.max_iter", "max_iter"),
    # Nyström: for `kpca update` (pipeline/update/run.py)
    Param("solver.keep_statistics", "keep_statistics"),
    # the scaling a refit (the evaluate stage's gamma cross-validation clones the model)
    # fits on its own training rows; the solve passes the split stage's fitted scaler
    Param("preprocess.scale", "preprocess"),
    Param("denoise.enabled", "fit_inverse_transform", when="denoise.enabled"),
    Param("denoise.alpha", "alpha", when="denoise.enabled"),
    Param("denoise.preimage", "preimage", when="denoise.enabled"),
    Param("denoise.sample_size", "preimage_sample_size", when="denoise.enabled"),
    Param("denoise.tol", "preimage_tol", when="denoise.enabled"),
    Param("denoise.max_iter", "preimage_max_iter", when="denoise.enabled"),
)

#: parameters every pipeline fit has, whatever the config says: only positive
#: components (the solve's check_fit says when there are fewer than asked)
FIXED: Mapping[str, Any] = {"remove_zero_eig": True}

#: fields the plan reads besides the estimator's: whether the kernel is materialised
#: (stored blocks are capped in size, pipeline.model.kernel_store.plan_materialize)
_PLAN_EXTRA = ("kernel_store.materialize",)
#: fields the fit reads besides the estimator's: the residual a published model may have
#: (pipeline.model.solve.check_fit)
_FIT_EXTRA = ("solver.max_residual",)


#: the kernel stage's config slice: what chooses the solver and its kernel partition
PLAN_FIELDS: tuple[str, ...] = (*(p.field for p in PARAMS if p.plans), *_PLAN_EXTRA)
#: the solve's (and the update's) config slice: everything the fit reads
FIT_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys((*PLAN_FIELDS, *(p.field for p in PARAMS), *_FIT_EXTRA))
)

_BY_FIELD = {p.field: p for p in PARAMS}


def _get(cfg: Any, field: str) -> Any:
    section, _, name = field.partition(".")
    return getattr(getattr(cfg, section), name)


def estimator_params(
    cfg: Any, *, plans_only: bool = False, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The KernelPCA parameters the config describes (:data:`PARAMS`, :data:`FIXED`),
    then ``overrides`` (parameter -> value; a stage's decision, never written into the
    config). ``plans_only``: only the parameters that choose the solver and partition."""
    params: dict[str, Any] = {}
    for p in PARAMS:
        if plans_only and not p.plans:
            continue
        if p.when is not None and not _get(cfg, p.when):
            continue
        params[p.param] = _get(cfg, p.field)
    params.update(FIXED)
    params.update(overrides or {})
    return params


def make_estimator(
    cfg: Any,
    block_rows: int | str | None = None,
    *,
    plans_only: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> KernelPCA:
    """The estimator the config describes (validated by the estimator at plan and fit);
    ``block_rows``: the partition, when already planned (None: ``chunks.block_rows``)."""
    params = estimator_params(cfg, plans_only=plans_only, overrides=overrides)
    if block_rows is not None:
        params["chunk_size"] = block_rows
    from kpca_dask import KernelPCA

    return KernelPCA().set_params(**params)


@dataclass(frozen=True)
class Fit:
    """A planned fit: the estimator (its ``chunk_size`` the planned block rows) and the
    estimator's :class:`~kpca_dask.plan.FitPlan`, and whether the kernel is materialised."""

    estimator: KernelPCA
    plan: FitPlan
    materialize: bool
    reason: str

    @property
    def solver(self) -> str:
        return self.plan.solver

    @property
    def block_rows(self) -> int:
        return self.plan.block_rows


def auto_rows(
    cfg: Any,
    n: int,
    d: int,
    *,
    solver: str | None = None,
    threads: int | None = None,
    stored: bool | None = None,
) -> int:
    """``chunks.block_rows`` for ``n x d`` training rows: ``auto`` is the estimator's
    rule (:func:`kpca_dask.params.auto_block_rows`) for this run's solver, on ``threads``
    (default: the active cluster's), with stored blocks capped in size when the kernel
    is materialised (``stored``; default: as ``kernel_store.materialize`` decides)."""
    if cfg.chunks.block_rows != "auto":
        return min(int(cfg.chunks.block_rows), int(n))
    from kpca_dask.params import auto_block_rows
    from kpca_dask.plan import resolve_solver

    if solver is None:
        solver = resolve_solver(make_estimator(cfg, plans_only=True).get_params(), int(n))
    if stored is None:
        from .kernel_store import plan_materialize

        stored, _ = plan_materialize(cfg.kernel_store.materialize, solver, int(d))
    if threads is None:
        from kpca_dask.cost import cluster_threads

        threads = cluster_threads()
    itemsize = np.dtype(cfg.solver.dtype).itemsize if stored else None
    return auto_block_rows(int(n), solver, threads=threads, stored_itemsize=itemsize)


def plan_fit(
    cfg: Any,
    n: int,
    d: int,
    *,
    plans_only: bool = False,
    overrides: Mapping[str, Any] | None = None,
    threads: int | None = None,
    kernel_store: bool = True,
    block_rows: int | None = None,
) -> Fit:
    """Plan the fit of ``n x d`` training rows (reads no data): the estimator, its
    solver and block rows, and whether the kernel matrix is materialised
    (``kernel_store=False``: never, e.g. an update). ``block_rows``: already planned
    (the kernel stage's, carried to the solve), else resolved here. Invalid parameters
    and impossible combinations raise the estimator's own errors, before any pass."""
    from kpca_dask.plan import make_plan, resolve_solver
    from kpca_dask.validation import check_min_samples

    from .kernel_store import plan_materialize

    n, d = int(n), int(d)
    est = make_estimator(cfg, plans_only=plans_only, overrides=overrides)
    params = est.get_params()
    check_params(params)
    check_min_samples(n)
    solver = resolve_solver(params, n)
    if kernel_store:
        materialize, why = plan_materialize(cfg.kernel_store.materialize, solver, d)
    else:
        materialize, why = False, "no kernel store for this fit"
    if block_rows is None:
        block_rows = auto_rows(cfg, n, d, solver=solver, threads=threads, stored=materialize)
    rows = int(block_rows)
    est.set_params(chunk_size=rows)
    return Fit(est, make_plan(est.get_params(), n, d), materialize, why)


def check_field(field: str, value: Any, *, nullable: bool = True) -> Any:
    """Check one config field's value by the estimator's rule for the parameter it sets
    (:data:`PARAMS`); raises ValueError in the estimator's words (pydantic names the
    field; ``nullable=False``: the field cannot be null, so the words do not offer
    None). Fields the table does not map are returned unchecked."""
    p = _BY_FIELD.get(field)
    if p is None:
        return value
    try:
        check_param(p.param, value)
    except InvalidParameterError as exc:
        msg = str(exc).removeprefix(f"The {p.param!r} parameter of KernelPCA ")
        if not nullable:
            msg = msg.replace(" or None.", ".", 1)
        raise ValueError(msg) from None
    return value
