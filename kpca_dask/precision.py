"""How exactly a kernel is evaluated on the training data, and what to say when it cannot
be (docs/solvers.md, "Kernel evaluation").

Distance-based kernels (rbf, laplacian) are translation invariant: the fit evaluates them
on rows minus the training mean (``Kernel.with_center``), from the column sums the
finiteness pass computes anyway (float64 sums, no pass of its own). The mean is mapped
through the fitted scaling when there is one. Rows far from the origin then cost nothing:
the expanded squared distance ``|x|^2 + |y|^2 - 2 x.y`` cancels only within the spread.

What centring cannot restore is the input's own precision: a float32 value near 1e4
carries steps of 1e-3, whatever is done with it afterwards. :func:`centre_kernel` warns
(:class:`~kpca_dask.exceptions.PrecisionWarning`) when the input's quantisation step is
a noticeable part of a column's range.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from .exceptions import PrecisionWarning

__all__ = [
    "INPUT_STEP_WARN",
    "centre_kernel",
    "centred_for_rows",
    "check_centred_scale",
    "grid_rounded",
    "input_step_ratio",
    "is_distance_kernel",
]

#: Warn when the input dtype's rounding of a column's values (half a unit in the last
#: place of its largest magnitude) exceeds this fraction of the column's range.
INPUT_STEP_WARN = 1e-6


def input_step_ratio(stats: Any) -> tuple[float, int]:
    """``(ratio, column)``: the largest ``u |x|_max / range`` over the columns, with
    ``u`` the input dtype's unit roundoff (0.0 for constant or non-float input)."""
    dtype = np.dtype(stats.dtype)
    if not np.issubdtype(dtype, np.floating):
        return 0.0, -1
    u = float(np.finfo(dtype).eps) / 2
    span = np.asarray(stats.max, dtype=np.float64) - np.asarray(stats.min, dtype=np.float64)
    big = np.maximum(np.abs(stats.max), np.abs(stats.min))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(span > 0, u * big / span, 0.0)
    if r.size == 0:
        return 0.0, -1
    j = int(np.argmax(r))
    return float(r[j]), j


#: The kernel centre is rounded to 2**-CENTRE_GRID_BITS of each column's range.
CENTRE_GRID_BITS = 12


def grid_rounded(mean: Any, span: Any) -> np.ndarray:
    """``mean`` rounded to a power-of-two grid of about ``span / 4096`` per column.

    Any centre near the data gives the same kernel; a rounded one is the same bits
    whatever the row chunking summed it (the sums' rounding is far below the grid), so
    results that amplify last-bit differences (Nyström's ``W^-1/2``, pivoted landmark
    choices) depend on the seed alone, as documented. It moves the centre by at most
    ``span / 8192``: nothing for the cancellation it is there to avoid."""
    mean = np.asarray(mean, dtype=np.float64)
    span = np.asarray(span, dtype=np.float64)
    ok = np.isfinite(span) & (span > 0)
    exp = np.floor(np.log2(np.where(ok, span, 1.0))) - CENTRE_GRID_BITS
    step = np.ldexp(1.0, exp.astype(int))
    return np.where(ok, np.round(mean / step) * step, mean)


def is_distance_kernel(kernel: Any) -> bool:
    """Whether the ``kernel`` parameter names a translation-invariant (distance) kernel."""
    from .kernels import KERNELS

    return (
        isinstance(kernel, str)
        and kernel in KERNELS
        and KERNELS[kernel][0].translation_invariant
    )


def centre_kernel(plan: Any, stats: Any, scaler: Any = None) -> Any:
    """``plan`` with its kernel centred on the training mean (distance-based kernels;
    ``plan`` itself otherwise), after checking the input's precision."""
    kernel = plan.kernel
    if stats is None or kernel is None or not kernel.translation_invariant:
        return plan
    ratio, j = input_step_ratio(stats)
    if ratio > INPUT_STEP_WARN:
        dt = np.dtype(stats.dtype)
        big = max(abs(float(stats.max[j])), abs(float(stats.min[j])))
        warnings.warn(
            f"X is {dt.name} and column {j} holds values near {big:.3g} that vary over "
            f"{float(stats.max[j] - stats.min[j]):.3g}: {dt.name} keeps them to steps of "
            f"{ratio:.1e} of that range, so the {kernel.name} kernel (of differences of "
            "rows) and its eigenvalues carry that relative error whatever the solver "
            "certifies; pass the data as float64 (or subtract the offset before storing it "
            f"as {dt.name}).",
            PrecisionWarning,
            stacklevel=4,
        )
    mean = grid_rounded(stats.mean, np.asarray(stats.max) - np.asarray(stats.min))
    if scaler is not None and not scaler.identity:
        mean = (mean - scaler.center) / scaler.scale
    return dataclasses.replace(plan, kernel=kernel.with_center(mean))


def centred_for_rows(kernel: Any, X: Any) -> Any:
    """``kernel`` centred on the float64 column means of the rows ``X`` (a dask or numpy
    array; one reduction) when it is distance-based; ``kernel`` otherwise. For callers
    that evaluate the kernel outside a fit (e.g. a pipeline materialising the training
    kernel matrix): any centre near the data gives the same kernel to rounding, so it
    need not be the fit's own."""
    if kernel is None or not kernel.translation_invariant:
        return kernel
    import dask.array as da

    Xd = X if isinstance(X, da.Array) else da.from_array(np.asarray(X))
    mean = Xd.map_blocks(
        lambda b: np.asarray(b.sum(axis=0, dtype=np.float64)).reshape(1, -1),
        chunks=((1,) * len(Xd.chunks[0]), Xd.chunks[1]),
        dtype=np.float64,
    ).sum(axis=0) / max(1, int(Xd.shape[0]))
    return kernel.with_center(np.asarray(mean.compute(), dtype=np.float64))


#: The relative accuracy the certificate defaults to, per compute dtype (estimator ``tol``).
DEFAULT_TOL = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-5}


def check_centred_scale(est: Any) -> None:
    """Warn when the kernel's values are so much larger than their centred variation that
    rounding in the compute dtype alone exceeds the certified accuracy.

    Every kernel value is computed to about ``u`` (the compute dtype's unit roundoff)
    relative to the values themselves, ``trace(K) / n`` on average; the spectrum is that
    of the centred matrix, of average diagonal ``trace(Kc) / n``. Their ratio
    ``trace(K) / trace(Kc)`` (an offset in feature space: polynomial, sigmoid or linear
    kernels on rows far from the origin, or an rbf / laplacian gamma so small that every
    value is near 1) multiplies the rounding; past ``tol`` no solver can certify what it
    reports, and ``est.converged_`` is set False. Costs nothing: both traces are fitted
    attributes.
    """
    tr, ctr = float(est.kernel_trace_), float(est.centred_trace_)
    if not (tr > 0 and ctr > 0):
        return  # a constant kernel is refused elsewhere; indefinite traces: no claim
    dtype = np.dtype(est._dtype)
    tol = float(est.tol) if est.tol else DEFAULT_TOL.get(dtype, 1e-8)
    u = float(np.finfo(dtype).eps) / 2
    amp = tr / ctr
    if u * amp <= tol:
        return
    # nothing is certified to ``tol`` below the rounding of the values themselves: the
    # fit does not claim it (converged_ means every pair met its level; issue 36:
    # tol=1e-300 warned here yet reported converged_=True)
    est.converged_ = False
    if isinstance(getattr(est, "solver_info_", None), dict):
        est.solver_info_["rounding_above_tol"] = {"rounding": u * amp, "tol": tol}
    name = getattr(est.kernel_, "name", "callable")
    warnings.warn(
        f"The {name} kernel's values are {amp:.3g} times larger than their centred "
        f"variation (trace(K) / trace(Kc)): {dtype.name} rounding of the values alone is "
        f"{u * amp:.1e} of the centred spectrum, above the tolerance {tol:g} the solver "
        "certifies (converged_ is False). Centre or scale the input "
        "(preprocess='standard'), raise tol, use a larger gamma "
        "or, for polynomial/sigmoid kernels, a smaller gamma or coef0"
        + ("; or dtype='float64'." if dtype == np.float32 else "."),
        PrecisionWarning,
        stacklevel=4,
    )
