"""Core-seconds of the kernel work from a :class:`~kpca_dask.cost.machine.Machine`'s rates.

What one core takes, by the one-thread rates, to evaluate kernel values (a distance GEMM
with a short inner dimension, then the elementwise part) and to multiply them by skinny
blocks; the block factors (measured with every core busy) scale these in the estimate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .machine import Machine

__all__ = ["EIGH_EFFICIENCY", "embed_seconds"]


#: Efficiency of the two GEMM shapes of a kernel block against a square GEMM, as
#: measured on one block (README, "the exact solve against the roofline"): the
#: distance GEMM with a short inner dimension ``d + 2`` runs at about half the rate
#: at d = 32; the skinny products with ``c`` columns at 55-75 % of it.
def _eff_inner(d: int) -> float:
    return (d + 2) / (d + 2 + 32)


def _eff_skinny(c: int) -> float:
    return c / (c + 16)


#: Efficiency of LAPACK's symmetric eigensolver (tridiagonal reduction: half of its
#: flops are matrix-vector products, memory bound) against a square GEMM.
EIGH_EFFICIENCY = 0.25


def _eval_seconds(evals: float, d: int, elem: float, m: Machine, dtype) -> float:
    """Core-seconds the rates give for evaluating ``evals`` kernel values (distance GEMM
    and the elementwise part)."""
    g = m.gemm(dtype)
    return evals * 2 * (d + 2) / (g * _eff_inner(d)) + evals * elem / m.exp(dtype)


def _stored_seconds(evals: float, c: int, m: Machine, dtype) -> float:
    """Core-seconds the rates give for multiplying ``evals`` kept kernel values by two
    ``c``-column blocks (GEMM or memory bound, whichever is slower)."""
    g = m.gemm(dtype)
    return max(
        evals * 4 * c / (g * _eff_skinny(c)), evals * np.dtype(dtype).itemsize / m.mem_bandwidth
    )


def embed_seconds(
    rows: float, cols: float, d: int, k: int, m: Machine, dtype: Any, cores: int
) -> float:
    """Seconds to embed ``rows`` rows against ``cols`` kernel columns (training rows or
    landmarks) on ``cores`` cores: the kernel values and their product with the ``cols x k``
    projection, at the machine's block-task rate."""
    g = m.gemm(dtype)
    per_value = _eval_seconds(1.0, d, 1.0, m, dtype) + 2 * k / (g * _eff_skinny(k))
    return rows * cols * per_value * m.factor("recompute", dtype) / max(1, cores)


def _recompute_seconds(evals: float, d: int, c: int, elem: float, m: Machine, dtype) -> float:
    """Core-seconds the rates give for evaluating ``evals`` kernel values and multiplying
    them by two ``c``-column blocks (a recomputed block task)."""
    g = m.gemm(dtype)
    return _eval_seconds(evals, d, elem, m, dtype) + evals * 4 * c / (g * _eff_skinny(c))


def _pass_compute(evals: float, d: int, c: int, elem: float, m: Machine, dtype, cores: int):
    """Seconds of one exact pass's block tasks on ``cores`` cores (recompute tier)."""
    return (
        _recompute_seconds(evals, d, c, elem, m, dtype) * m.factor("recompute", dtype) / cores
    )
