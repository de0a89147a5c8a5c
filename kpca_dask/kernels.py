"""Kernel functions evaluated block by block with BLAS.

Each kernel turns two row blocks ``A`` (p x d) and ``B`` (q x d) into the p x q
block ``k(A, B)`` in a requested floating dtype. Evaluation is split in two
steps so the block-partitioned operator can hoist per-row work out of its inner
loop:

``prepare(X, dtype, side)``
    Per-row work done once per row block: dtype conversion and, for the rbf,
    polynomial and sigmoid kernels, the augmented columns that fold squared
    norms, ``gamma`` and ``coef0`` into the matrix product.
``evaluate(A, B, out=None)``
    The block itself: one GEMM on the prepared rows plus at most two
    elementwise passes (clip + exp for rbf, power for polynomial...).

The rbf kernel shows the trick: with
``a_i = [sqrt(2 g) x_i, -g |x_i|^2, 1]`` and ``b_j = [sqrt(2 g) y_j, 1, -g |y_j|^2]``,
``a_i . b_j = -g |x_i - y_j|^2``, so the block is ``exp(min(A B^T, 0))``; the clip
removes the tiny positive values that rounding leaves where the squared
distance is (nearly) zero.

Distance-based kernels (rbf, laplacian: ``translation_invariant``) are evaluated
on rows centred by a fixed vector, the training mean (``with_center``): the kernel
is the same function, but the expanded squared distance above then cancels only
within the data's spread, not its offset (rows far from the origin: sensor
readings, timestamps, prices). The centre is subtracted in float64, before any
conversion to a float32 compute dtype. The bound is in docs/solvers.md.

Names, parameters and defaults follow ``sklearn.metrics.pairwise`` so results
compare one to one with scikit-learn's ``KernelPCA``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .exceptions import InvalidParameterError
from .kernel_base import Kernel
from .kernels_custom import CallableKernel, PrecomputedKernel
from .kernels_distance import LaplacianKernel, RBFKernel
from .kernels_dot import CosineKernel, LinearKernel, PolynomialKernel, SigmoidKernel

__all__ = [
    "Kernel",
    "LinearKernel",
    "PolynomialKernel",
    "RBFKernel",
    "LaplacianKernel",
    "SigmoidKernel",
    "CosineKernel",
    "CallableKernel",
    "PrecomputedKernel",
    "KERNELS",
    "make_kernel",
    "kernel_from_dict",
]


#: Named kernels and the parameters each takes (as in sklearn.metrics.pairwise).
KERNELS: dict[str, tuple[type[Kernel], tuple[str, ...]]] = {
    "linear": (LinearKernel, ()),
    "poly": (PolynomialKernel, ("gamma", "degree", "coef0")),
    "polynomial": (PolynomialKernel, ("gamma", "degree", "coef0")),
    "rbf": (RBFKernel, ("gamma",)),
    "laplacian": (LaplacianKernel, ("gamma",)),
    "sigmoid": (SigmoidKernel, ("gamma", "coef0")),
    "cosine": (CosineKernel, ()),
    "precomputed": (PrecomputedKernel, ()),
}


def make_kernel(
    kernel: str | Callable[..., Any],
    *,
    gamma: float | None = None,
    degree: float = 3,
    coef0: float = 1.0,
    kernel_params: dict[str, Any] | None = None,
) -> Kernel:
    """Build a kernel from scikit-learn style arguments.

    ``gamma`` must already be resolved to a positive number for the kernels
    that use it (the estimator resolves ``None`` and ``"scale"`` from data).
    """
    if callable(kernel):
        return CallableKernel(kernel, kernel_params)
    if kernel not in KERNELS:
        raise InvalidParameterError(
            f"Unknown kernel {kernel!r}. Use one of {sorted(KERNELS)} or a callable "
            "taking two numpy blocks."
        )
    cls, names = KERNELS[kernel]
    given = {"gamma": gamma, "degree": degree, "coef0": coef0}
    kwargs = {k: given[k] for k in names}
    if "gamma" in kwargs and (kwargs["gamma"] is None or not kwargs["gamma"] > 0):
        raise InvalidParameterError(
            f"The kernel {kernel!r} needs gamma > 0; got {gamma!r}. Pass a positive number, "
            "None (1 / n_features) or 'scale'."
        )
    return cls(**kwargs)


def kernel_from_dict(spec: dict[str, Any]) -> Kernel:
    """Inverse of :meth:`Kernel.to_dict` for named kernels (never executes code)."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name == "callable" or name not in KERNELS:
        raise InvalidParameterError(f"Cannot rebuild kernel {name!r} from a description.")
    cls, names = KERNELS[name]
    unknown = set(spec) - set(names)
    if unknown:
        raise InvalidParameterError(
            f"Unknown parameters {sorted(unknown)} for kernel {name!r}."
        )
    return cls(**spec)
