"""The eigensolve of a planned fit: the kernel operator, the solver the plan names, its
escalation under ``eigen_solver="auto"``, and the training rows the model keeps.

:func:`solve` is the one entry point; it returns a :class:`Solution` that the
estimator turns into its fitted attributes (``kpca_dask.estimator``). Nothing
here knows the estimator class: it reads the parameters and the :class:`FitPlan`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import dask
import dask.array as da
import numpy as np

from . import plan as _plan
from ._solution import Solution
from ._solve_nystroem import _solve_nystroem
from .centering import CentredKernel
from .exceptions import (
    AsymmetricKernelWarning,
    ConvergenceWarning,
    InvalidInputError,
)
from .gram import BlockKernelMatrix, PrecomputedKernelMatrix
from .mixed import recertify
from .plan import FitPlan
from .solvers import EigResult, dense_eigh, randomized_eigh
from .solvers.arpack import arpack_eigh
from .solvers.dense import centre_inplace
from .solvers.randomized import escalation_plan, not_converged_message
from .threads import blas_threads_for_dask

__all__ = ["Solution", "gather_rows", "solve"]

logger = logging.getLogger("kpca_dask")

#: stack depth of a warning raised by a solver function here, counted to the user's call
#: (user -> fit -> _fit -> solve -> _solve_x -> warn)
_USER_STACK = 5


def gather_rows(X: da.Array, group_bytes: int = 64 << 20) -> np.ndarray:
    """``X`` as one float64 numpy array, filled a few row chunks at a time.

    ``dask.compute(X)`` holds every chunk on the workers and the driver until it
    concatenates them (twice the array at once on each). Here the driver holds the
    result and about ``group_bytes`` of chunks in flight (at least one chunk).
    Measurements: docs/kernel-store.md (peak memory of the 100k-row run).
    """
    X = X.rechunk({1: -1})
    out = np.empty(X.shape, dtype=np.float64)
    blocks = X.to_delayed()[:, 0]
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])])
    chunk_bytes = max(1, max(X.chunks[0]) * X.shape[1] * X.dtype.itemsize)
    step = max(1, group_bytes // chunk_bytes)
    for a in range(0, len(blocks), step):
        parts = dask.compute(*blocks[a : a + step])
        for b, part in enumerate(parts, start=a):
            out[offsets[b] : offsets[b + 1]] = part
        del parts
    return out


def solve(
    plan: FitPlan,
    params: Mapping[str, Any],
    Xd: da.Array,
    Xb: da.Array,
    *,
    persisted: bool,
    kernel_blocks: Any = None,
    centring: tuple[np.ndarray, float] | None = None,
    v0: np.ndarray | None = None,
) -> Solution:
    """Run the solver ``plan`` names on the row blocks ``Xb`` (``Xd``: the input as given).

    ``v0``: starting vectors for the randomized solver (a warm start); the direct
    solvers (dense, and ARPACK's single-vector restarts) do without, and say so in
    ``info["warm_start"]``.
    """
    if plan.solver == "nystroem":
        return _solve_nystroem(plan, params, Xb)
    if plan.precomputed:
        K = _precomputed_matrix(Xd, plan)
    else:
        K = BlockKernelMatrix(Xb, plan.kernel, plan.dtype, block_reader=kernel_blocks)
    with blas_threads_for_dask():
        (trace_K,) = dask.compute(K.diag().sum())
    solver = plan.solver
    if plan.mixed and solver == "randomized" and isinstance(K, BlockKernelMatrix):
        res, mu, g, solver, cache_info = _solve_mixed(K, plan, params, v0)
    else:
        with K.kernel_cache(params["kernel_cache"], solver) as cache_info:  # released after
            if solver == "dense":
                res, mu, g = _solve_dense(K, params["n_components"])
            elif solver == "arpack":
                res, mu, g = _solve_arpack(K, params, float(trace_K), centring)
            else:
                res, mu, g, solver = _solve_randomized(K, plan, params, centring, v0)
        res.info.setdefault("block_dtype", np.dtype(getattr(K, "dtype", plan.dtype)).name)
    if v0 is not None and solver != "randomized":
        res.info["warm_start"] = f"not used by the {solver} solver"
    res.info["kernel_cache"] = cache_info
    # The training rows come to the driver after the solve, not during it: the solver's
    # basis (n x l floats) and X (n x d) are never held at once.
    if plan.precomputed:  # transform takes kernel values: no training rows to keep
        X_fit = np.zeros((plan.n_samples, 0))
    else:
        with blas_threads_for_dask():  # persisted blocks, else the source's own chunks
            X_fit = gather_rows(Xb if persisted else Xd)
    return Solution(res, mu, g, float(trace_K), solver, X_fit)


def _precomputed_matrix(Kd: da.Array, plan: FitPlan) -> PrecomputedKernelMatrix:
    """The caller's n x n kernel matrix as a block operator, after one read that refuses
    NaN/inf and decides whether its symmetric part must be formed."""
    K = PrecomputedKernelMatrix(Kd, plan.dtype, block_rows=plan.block_rows)
    bad, asym, top = K.inspect()
    if bad:
        raise InvalidInputError(
            f"The precomputed kernel matrix contains NaN or infinity ({bad} value(s)); "
            "recompute it from finite data."
        )
    if not K.symmetric:
        # symmetric to rounding (a kernel computed by GEMMs in its dtype): used silently
        ftype = Kd.dtype if np.issubdtype(Kd.dtype, np.floating) else np.float64
        level = ASYMMETRY_RTOL * float(np.finfo(ftype).eps) * top
        (logger.info if asym <= level else _warn_asymmetric)(
            "the precomputed kernel matrix is not symmetric (max |K - K.T| = %.3g of max "
            "|K| = %.3g): its symmetric part (K + K.T) / 2 is used",
            asym,
            top,
        )
    return K


#: A precomputed K whose asymmetry is at most this many units in the last place of its
#: largest entry (its dtype's) is symmetric to rounding: symmetrised without a warning.
ASYMMETRY_RTOL = 64


def _warn_asymmetric(msg: str, asym: float, top: float) -> None:
    """scikit-learn's convention for inputs that must be symmetric
    (``sklearn.utils.validation.check_symmetric``): average with the transpose, warn."""
    warnings.warn(
        (msg % (asym, top))
        + " (scikit-learn's KernelPCA reads one triangle or the whole product depending on "
        "its solver); pass (K + K.T) / 2 to silence this, or fix how K is computed.",
        AsymmetricKernelWarning,
        stacklevel=6,
    )


def _solve_dense(K: Any, n_components: int | None) -> tuple[EigResult, np.ndarray, float]:
    n = K.n
    if n > 20000:
        logger.warning(
            "dense solver on n=%d forms a %.1f GB matrix; consider eigen_solver='randomized'",
            n,
            8 * n * n / 1e9,
        )
    with blas_threads_for_dask():
        Km = K.to_numpy().astype(np.float64, copy=False)
    mu, g = centre_inplace(Km)
    k = n if n_components is None else n_components
    res = dense_eigh(Km, k)
    return res, mu, g


def _centred(K: Any, centring: tuple[np.ndarray, float] | None) -> CentredKernel:
    op = CentredKernel(K)
    if centring is not None:
        mu, g = centring
        op.row_means, op.grand_mean = np.asarray(mu, dtype=np.float64), float(g)
    return op


def _solve_arpack(
    K: Any, params: Mapping[str, Any], trace_K: float, centring: tuple[np.ndarray, float] | None
) -> tuple[EigResult, np.ndarray, float]:
    """``eigen_solver="arpack"``: Lanczos (scipy's eigsh) on the implicit centred matrix,
    shifted by ``trace(Kc) / n`` so that a low-rank kernel's zero eigenvalues converge."""
    op = _centred(K, centring)
    op.compute_means()  # one pass (none when centring is given): g for the shift
    shift = max(0.0, (trace_K - K.n * float(op.grand_mean)) / K.n)
    k = K.n if params["n_components"] is None else int(params["n_components"])
    max_iter = params["max_iter"]
    res = arpack_eigh(
        op,
        k,
        tol=float(params["tol"] or 0.0),
        maxiter=max_iter,
        random_state=params["random_state"],
        shift=shift,
    )
    if not res.converged:
        warnings.warn(
            f"ARPACK stopped at max_iter={max_iter} with {res.eigenvalues.size} of "
            f"{k} eigenpairs converged; raise max_iter (None: 10 n) or tol.",
            ConvergenceWarning,
            stacklevel=_USER_STACK,
        )
    res.info["pass_seconds"] = list(op.pass_seconds)
    return res, op.row_means, float(op.grand_mean)


def _solve_randomized(
    K: Any,
    plan: FitPlan,
    params: Mapping[str, Any],
    centring: tuple[np.ndarray, float] | None,
    v0: np.ndarray | None = None,
) -> tuple[EigResult, np.ndarray, float, str]:
    from .worker_basis import uses_worker_basis

    n, k = plan.n_samples, params["n_components"]
    kw = _randomized_kwargs(plan, params, v0, plan.dtype)
    if centring is None and uses_worker_basis(K, kw["method"]):
        return _solve_on_workers(K, plan, params, kw)
    op = _centred(K, centring)
    auto = params["eigen_solver"] == "auto"
    solver = plan.solver
    res = randomized_eigh(op, k, warn=not auto, **kw)
    if auto and not res.converged:
        # "auto" escalates before it gives up (solvers.randomized.escalation_plan); the
        # module's constant is read at call time (tests lower it)
        esc = escalation_plan(n, k, kw, _plan.DENSE_FALLBACK_SAMPLES)
        logger.info(
            "randomized solver not certified after %d passes; escalating to %s",
            res.n_passes,
            esc["solver"],
        )
        first = {"n_passes": res.n_passes, "certificate": res.info.get("certificate")}
        if esc["solver"] == "dense":
            res2, mu, g = _solve_dense(K, k)
            solver = "dense"
        else:
            res2 = randomized_eigh(op, k, warn=False, **esc["kwargs"])
            mu, g = op.row_means, float(op.grand_mean)
            if not res2.converged:
                warnings.warn(
                    not_converged_message(
                        res2.info["certificate"],
                        res.n_passes + res2.n_passes,
                        plan.tol,
                        escalated=True,
                    ),
                    ConvergenceWarning,
                    stacklevel=_USER_STACK,
                )
        res2.n_passes += res.n_passes
        res2.info["escalated_from"] = first
        res = res2
    else:
        mu, g = op.row_means, float(op.grand_mean)
    res.info["pass_seconds"] = list(op.pass_seconds)
    _pad(res, n, k)
    return res, mu, g, solver


def _solve_on_workers(
    K: Any, plan: FitPlan, params: Mapping[str, Any], kw: dict[str, Any]
) -> tuple[EigResult, np.ndarray, float, str]:
    """:func:`_solve_randomized` with the block Krylov basis on the workers
    (kpca_dask.worker_basis): the same iteration, certificate and escalation."""
    from .worker_basis import panel_krylov_eigh

    n, k = plan.n_samples, params["n_components"]
    auto = params["eigen_solver"] == "auto"
    solver = plan.solver
    kw = {key: v for key, v in kw.items()}
    res, mu, g, seconds = panel_krylov_eigh(K, k, warn=not auto, **kw)
    if auto and not res.converged:
        esc = escalation_plan(n, k, kw, _plan.DENSE_FALLBACK_SAMPLES)
        first = {"n_passes": res.n_passes, "certificate": res.info.get("certificate")}
        if esc["solver"] == "dense":
            res2, mu, g = _solve_dense(K, k)
            solver = "dense"
        else:
            res2, mu, g, more = panel_krylov_eigh(K, k, warn=False, **esc["kwargs"])
            seconds += more
            if not res2.converged:
                warnings.warn(
                    not_converged_message(
                        res2.info["certificate"],
                        res.n_passes + res2.n_passes,
                        plan.tol,
                        escalated=True,
                    ),
                    ConvergenceWarning,
                    stacklevel=_USER_STACK + 1,
                )
        res2.n_passes += res.n_passes
        res2.info["escalated_from"] = first
        res = res2
    res.info["pass_seconds"] = seconds
    _pad(res, n, k)
    return res, mu, g, solver


def _randomized_kwargs(
    plan: FitPlan, params: Mapping[str, Any], v0: np.ndarray | None, blocks: Any
) -> dict[str, Any]:
    """``randomized_eigh``'s keywords; ``eps``: the unit roundoff of the products on
    ``blocks`` (their dtype)."""
    return {
        "n_oversamples": params["n_oversamples"],
        "n_power_iter": plan.power_iter,
        "method": params["randomized_method"],
        "tol": plan.tol,
        "max_passes": plan.max_passes,
        "psd": plan.kernel.psd,
        "eps": float(np.finfo(blocks).eps),
        "random_state": params["random_state"],
        "v0": v0,
    }


def _pad(res: EigResult, n: int, k: int) -> None:
    if res.eigenvalues.shape[0] < k:
        # numerical rank below k: the missing pairs are zero eigenvalues, as
        # dense eigh reports them (drop_nonpositive then treats both alike)
        pad = k - res.eigenvalues.shape[0]
        res.eigenvalues = np.concatenate([res.eigenvalues, np.zeros(pad)])
        res.eigenvectors = np.hstack([res.eigenvectors, np.zeros((n, pad))])
        res.residuals = np.concatenate([res.residuals, np.zeros(pad)])


def _solve_mixed(
    K64: BlockKernelMatrix,
    plan: FitPlan,
    params: Mapping[str, Any],
    v0: np.ndarray | None,
) -> tuple[EigResult, np.ndarray, float, str, dict[str, Any]]:
    """Mixed precision (kpca_dask.mixed): the randomized solve on float32 blocks, one
    pass on the kernel evaluated in float64 that certifies its pairs for the kernel
    itself, else the solve again on float64 blocks from the float32 vectors."""
    n, k = plan.n_samples, params["n_components"]
    K32 = BlockKernelMatrix(K64.X, K64.kernel, np.float32, cache_eval_dtype=np.float64)
    op = CentredKernel(K32)
    kw = _randomized_kwargs(plan, params, v0, np.float32)
    rc = None
    with K32.kernel_cache(params["kernel_cache"], "randomized") as cache32:
        # no certification pass on the float32 blocks: recertify's float64 pass measures
        # the residuals that count, and a Rayleigh-Ritz step on the same span (the last
        # pass's Ritz vectors) is all the float32 pass would have added
        # the tail stops where its bounds meet tail_tol without float32's rounding level:
        # the float64 pass allows only float64's (no fallback for a bound in between)
        res = randomized_eigh(
            op, k, warn=False, certification_pass=False, tail_floor=False, **kw
        )
    cert32 = res.info.get("certificate") or {}
    if res.converged and res.eigenvalues.size:
        # certified on the kernel evaluated afresh in float64 (K64 has no cache; the
        # float32 blocks are released): the Ritz values are the float64 kernel's, and
        # the blocks' rounding enters only through the vectors (second order); on the
        # rounded blocks it would enter the eigenvalues at first order (5e-11 relative
        # at n = 10 000, docs/precision.md) and forbid lone pairs at tol = 1e-8
        rc = recertify(
            K64,
            res.eigenvectors,
            tol=plan.tol,
            rounded=False,
            had_tail=cert32.get("tail_start") is not None,
        )
    passes = res.n_passes + (rc is not None)
    seconds = list(op.pass_seconds) + ([rc["seconds"]] if rc is not None else [])
    if rc is not None and rc["certificate"]["ok"]:
        out = _mixed_result(res, rc, passes, seconds, cert32)
        _pad(out, n, k)
        return out, rc["row_means"], rc["grand_mean"], "randomized", cache32
    why = _mixed_failure(res, rc)
    logger.info("mixed precision: %s; solving again on float64 blocks", why)
    warm = res.eigenvectors if res.eigenvectors.size else v0
    with K64.kernel_cache(params["kernel_cache"], "randomized") as cache64:
        res2, mu, g, solver = _solve_randomized(K64, plan, params, None, warm)
    res2.n_passes += passes
    res2.info["pass_seconds"] = seconds + res2.info["pass_seconds"]
    res2.info["block_dtype"] = "float64"
    res2.info["mixed_precision"] = {
        "blocks": "float64",
        "tried": "float32",
        "passes": passes,
        "reason": why,
        "kernel_cache": cache32,
        "certificate": rc["certificate"] if rc is not None else cert32,
    }
    if v0 is None:
        res2.info.pop("warm_start", None)
    return res2, mu, g, solver, cache64


def _mixed_result(
    res: EigResult, rc: dict, passes: int, seconds: list, cert32: dict
) -> EigResult:
    """The float32 iteration's pairs as certified on the float64 kernel (``rc``)."""
    info = dict(res.info)
    info.update(
        certificate=rc["certificate"],
        pass_seconds=seconds,
        block_dtype="float32",
        mixed_precision={
            "blocks": "float32",
            "block_rounding": rc["delta"],
            "iteration_certificate": cert32,
        },
    )
    return EigResult(
        rc["eigenvalues"],
        rc["eigenvectors"],
        rc["residuals"],
        n_passes=passes,
        converged=True,
        info=info,
    )


def _mixed_failure(res: EigResult, rc: dict | None) -> str:
    """Why the float32 blocks' pairs are not kept (the float64 fallback's reason)."""
    if rc is None:
        return f"the iteration on float32 blocks was not certified in {res.n_passes} passes"
    c = rc["certificate"]
    bad = [i for i, ok in enumerate(c["eigenvalue_ok"]) if not ok] or [
        i for i, ok in enumerate(c["vector_ok"]) if not ok
    ]
    return (
        "the certificate on the kernel evaluated in float64 does not hold for "
        f"component(s) {bad} at the requested levels (vectors from float32 blocks)"
    )
