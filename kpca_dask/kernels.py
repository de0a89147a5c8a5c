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

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .exceptions import InvalidParameterError

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


def _as(X: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(X, dtype=dtype)


def _sq_norms(X: np.ndarray) -> np.ndarray:
    X64 = np.asarray(X, dtype=np.float64)
    return np.einsum("ij,ij->i", X64, X64)


class Kernel:
    """A positive (semi-)definite or general kernel evaluated on row blocks.

    Subclasses set ``name`` and ``psd`` and implement :meth:`prepare`,
    :meth:`evaluate` and :meth:`diag`.
    """

    name: str = ""
    #: True when every Gram matrix of the kernel is positive semi-definite
    #: (exact arithmetic); recorded in solver_info_ (the randomized solver's
    #: Rayleigh-Ritz finish serves both cases).
    psd: bool = True
    #: True for kernels of ``x - y`` only (rbf, laplacian): evaluated on centred rows.
    translation_invariant: bool = False
    #: The vector subtracted from every row before evaluation (float64, or None).
    #: Not a parameter: ``to_dict`` and equality ignore it (the kernel function is the
    #: same); the model saves it as an array and dask tokens include it.
    center: np.ndarray | None = None

    def with_center(self, center: Any) -> Kernel:
        """A copy evaluated on rows minus ``center`` (translation-invariant kernels;
        ``self`` for the others). ``None`` removes the centre (e.g. to evaluate the
        kernel on another space, as the learned pre-image does on embeddings)."""
        if not self.translation_invariant:
            return self
        if center is None and self.center is None:
            return self
        new = copy.copy(self)
        new.center = None if center is None else _center_vector(center)
        return new

    def _centred(self, X: np.ndarray) -> np.ndarray:
        """``X - center`` in float64 (``X`` itself, as float64, without a centre)."""
        X = np.asarray(X, dtype=np.float64)
        c = self.center
        if c is None:
            return X
        if X.shape[-1] != c.shape[0]:
            raise InvalidParameterError(
                f"the {self.name} kernel is centred on {c.shape[0]} features but got rows "
                f"of {X.shape[-1]}."
            )
        return X - c

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters (without the name)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """JSON description: ``{"name": ..., **params}``."""
        return {"name": self.name, **self.params()}

    def prepare(self, X: np.ndarray, dtype: np.dtype, side: str = "left") -> np.ndarray:
        """Per-row preprocessing of a block, done once per block."""
        return _as(X, dtype)

    def evaluate(
        self, A: np.ndarray, B: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Kernel block between prepared rows ``A`` (left) and ``B`` (right).

        The result has the prepared rows' dtype, except for kernels that can only
        compute in float64 (laplacian, callable); callers cast.
        """
        raise NotImplementedError

    def diag(self, X: np.ndarray, dtype: np.dtype = np.float64) -> np.ndarray:
        """``k(x_i, x_i)`` for every row of ``X`` without forming a block."""
        raise NotImplementedError

    def __call__(
        self, X: np.ndarray, Y: np.ndarray | None = None, dtype: Any = np.float64
    ) -> np.ndarray:
        """The full block ``k(X, Y)`` (``Y = X`` when omitted) as a numpy array."""
        dtype = np.dtype(dtype)
        X = np.asarray(X)
        Y = X if Y is None else np.asarray(Y)
        K = self.evaluate(self.prepare(X, dtype, "left"), self.prepare(Y, dtype, "right"))
        return K.astype(dtype, copy=False)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.to_dict() == self.to_dict()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(repr(self))

    def __dask_tokenize__(self) -> Any:
        c = self.center
        return (type(self).__name__, repr(self.to_dict()), None if c is None else c.tobytes())


def _center_vector(center: Any) -> np.ndarray:
    c = np.array(center, dtype=np.float64, copy=True).reshape(-1)
    if not np.all(np.isfinite(c)):
        raise InvalidParameterError("a kernel centre must be finite.")
    c.setflags(write=False)
    return c


def _matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return A @ B.T
    return np.matmul(A, B.T, out=out)


class LinearKernel(Kernel):
    """``k(x, y) = x . y``."""

    name = "linear"

    def evaluate(self, A, B, out=None):
        return _matmul(A, B, out)

    def diag(self, X, dtype=np.float64):
        return _sq_norms(X).astype(dtype)


class _DotKernel(Kernel):
    """Kernels of ``gamma x.y + coef0``, folded into the GEMM with one extra column."""

    def __init__(self, gamma: float, coef0: float = 1.0):
        self.gamma = float(gamma)
        self.coef0 = float(coef0)

    def prepare(self, X, dtype, side="left"):
        X = np.asarray(X, dtype=np.float64)
        if side == "left":
            aug = np.empty((X.shape[0], X.shape[1] + 1), dtype=np.float64)
            np.multiply(X, self.gamma, out=aug[:, :-1])
            aug[:, -1] = self.coef0
        else:
            aug = np.empty((X.shape[0], X.shape[1] + 1), dtype=np.float64)
            aug[:, :-1] = X
            aug[:, -1] = 1.0
        return _as(aug, dtype)

    def _linear_part_diag(self, X):
        return self.gamma * _sq_norms(X) + self.coef0


class PolynomialKernel(_DotKernel):
    """``k(x, y) = (gamma x.y + coef0) ** degree``."""

    name = "polynomial"

    def __init__(self, gamma: float, degree: float = 3, coef0: float = 1.0):
        super().__init__(gamma, coef0)
        self.degree = float(degree) if not float(degree).is_integer() else int(degree)

    def params(self):
        return {"gamma": self.gamma, "degree": self.degree, "coef0": self.coef0}

    @property
    def psd(self) -> bool:  # type: ignore[override]
        return (
            isinstance(self.degree, int)
            and self.degree >= 1
            and self.coef0 >= 0
            and self.gamma > 0
        )

    def evaluate(self, A, B, out=None):
        K = _matmul(A, B, out)
        _power_inplace(K, self.degree)
        return K

    def diag(self, X, dtype=np.float64):
        d = self._linear_part_diag(X)
        return (d**self.degree).astype(dtype)


def _power_inplace(K: np.ndarray, degree: float) -> None:
    if degree == 1:
        return
    if degree == 2:
        np.multiply(K, K, out=K)
    elif degree == 3:
        tmp = K * K
        np.multiply(K, tmp, out=K)
    else:
        np.power(K, degree, out=K)


class SigmoidKernel(_DotKernel):
    """``k(x, y) = tanh(gamma x.y + coef0)``: not positive semi-definite in general."""

    name = "sigmoid"
    psd = False

    def params(self):
        return {"gamma": self.gamma, "coef0": self.coef0}

    def evaluate(self, A, B, out=None):
        K = _matmul(A, B, out)
        np.tanh(K, out=K)
        return K

    def diag(self, X, dtype=np.float64):
        return np.tanh(self._linear_part_diag(X)).astype(dtype)


class RBFKernel(Kernel):
    """``k(x, y) = exp(-gamma |x - y|^2)``.

    Squared norms and ``gamma`` ride along in the GEMM (two appended columns);
    what is left per element is one sign-bit OR (squared distances that
    rounding made slightly negative are reflected, see ``_force_nonpositive``)
    and one ``exp``.
    """

    name = "rbf"
    translation_invariant = True

    def __init__(self, gamma: float):
        self.gamma = float(gamma)

    def params(self):
        return {"gamma": self.gamma}

    def prepare(self, X, dtype, side="left"):
        X = self._centred(X)
        n, d = X.shape
        aug = np.empty((n, d + 2), dtype=np.float64)
        np.multiply(X, math.sqrt(2.0 * self.gamma), out=aug[:, :d])
        sq = -self.gamma * _sq_norms(X)
        if side == "left":
            aug[:, d] = sq
            aug[:, d + 1] = 1.0
        else:
            aug[:, d] = 1.0
            aug[:, d + 1] = sq
        return _as(aug, dtype)

    def evaluate(self, A, B, out=None):
        K = _matmul(A, B, out)
        _force_nonpositive(K)
        np.exp(K, out=K)
        return K

    def diag(self, X, dtype=np.float64):
        return np.ones(np.shape(X)[0], dtype=dtype)


def _force_nonpositive(E: np.ndarray) -> None:
    """``E <- -|E|`` in place by setting the sign bit.

    The exponent ``-gamma |x - y|^2`` is never positive; rounding in the
    norm-expanded GEMM can leave tiny positive values where the distance is
    (nearly) zero. Reflecting them (-|e|, same magnitude as clipping to 0, and
    within the rounding error) keeps every kernel value <= 1 and costs one
    integer OR per element: numpy's ``minimum`` is about 8x slower here.
    """
    if E.dtype == np.float32:
        view = E.view(np.int32)
        np.bitwise_or(view, np.int32(-(2**31)), out=view)
    elif E.dtype == np.float64:
        view = E.view(np.int64)
        np.bitwise_or(view, np.int64(-(2**63)), out=view)
    else:
        np.negative(np.abs(E, out=E), out=E)


class LaplacianKernel(Kernel):
    """``k(x, y) = exp(-gamma |x - y|_1)`` (L1 distances by scipy's ``cdist``)."""

    name = "laplacian"
    translation_invariant = True

    def __init__(self, gamma: float):
        self.gamma = float(gamma)

    def params(self):
        return {"gamma": self.gamma}

    def prepare(self, X, dtype, side="left"):
        # cdist works in float64 (differences: no cancellation beyond the spread; the
        # centre only keeps both distance kernels alike); the result is cast to dtype.
        return np.ascontiguousarray(self._centred(X))

    def evaluate(self, A, B, out=None):
        from scipy.spatial.distance import cdist

        D = cdist(A, B, metric="cityblock")
        D *= -self.gamma
        np.exp(D, out=D)
        if out is None:
            return D
        out[...] = D
        return out

    def diag(self, X, dtype=np.float64):
        return np.ones(np.shape(X)[0], dtype=dtype)


class CosineKernel(Kernel):
    """``k(x, y) = x.y / (|x| |y|)``; rows of norm zero give zero, as in scikit-learn."""

    name = "cosine"

    def prepare(self, X, dtype, side="left"):
        X = np.asarray(X, dtype=np.float64)
        norms = np.sqrt(_sq_norms(X))
        norms[norms == 0.0] = 1.0
        return _as(X / norms[:, None], dtype)

    def evaluate(self, A, B, out=None):
        return _matmul(A, B, out)

    def diag(self, X, dtype=np.float64):
        return (_sq_norms(X) > 0).astype(dtype)


class CallableKernel(Kernel):
    """A user function ``fn(A, B, **kernel_params)`` on two numpy blocks.

    ``fn`` receives float64 blocks of shape (p, d) and (q, d) and must return a
    (p, q) array. A function written for scikit-learn (two 1-D rows in, one
    number out: detected on the first pair) is called once per pair, as
    scikit-learn's ``pairwise_kernels`` does: correct but slow. It is treated as possibly
    indefinite and cannot be saved without pickle, so models using it cannot be saved.
    """

    name = "callable"
    psd = False

    def __init__(self, fn: Callable[..., Any], kernel_params: dict[str, Any] | None = None):
        self.fn = fn
        self.kernel_params = dict(kernel_params or {})

    def params(self):
        return {
            "function": getattr(self.fn, "__qualname__", repr(self.fn)),
            **self.kernel_params,
        }

    def prepare(self, X, dtype, side="left"):
        return np.ascontiguousarray(X, dtype=np.float64)

    def _pairwise(self, A, B) -> bool:
        """True when ``fn`` follows scikit-learn's convention for callables (two 1-D
        rows in, one number out) rather than blocks in, block out: probed on one
        row of each side (a block function returns a (1, 1) array there)."""
        mode = self.__dict__.get("_pairwise_mode")
        if mode is None:
            if A.shape[0] == 0 or B.shape[0] == 0:
                return False
            mode = self._pairwise_mode = (
                np.ndim(self.fn(A[:1], B[:1], **self.kernel_params)) == 0
            )
        return mode

    def _evaluate_pairs(self, A, B):
        """scikit-learn's ``pairwise_kernels`` for a callable: one call per pair (slow)."""
        K = np.empty((A.shape[0], B.shape[0]), dtype=np.float64)
        for i in range(A.shape[0]):
            for j in range(B.shape[0]):
                K[i, j] = self.fn(A[i], B[j], **self.kernel_params)
        return K

    def evaluate(self, A, B, out=None):
        if self._pairwise(A, B):
            K = self._evaluate_pairs(A, B)
        else:
            K = np.asarray(self.fn(A, B, **self.kernel_params))
        if K.shape != (A.shape[0], B.shape[0]):
            raise InvalidParameterError(
                f"The callable kernel returned an array of shape {K.shape} for blocks of "
                f"{A.shape[0]} and {B.shape[0]} rows; it must return shape "
                f"({A.shape[0]}, {B.shape[0]})."
            )
        if out is None:
            return K
        out[...] = K
        return out

    def diag(self, X, dtype=np.float64):
        X = np.asarray(X, dtype=np.float64)
        out = np.empty(X.shape[0], dtype=np.float64)
        step = 256
        if self._pairwise(X, X):
            for i in range(X.shape[0]):
                out[i] = self.fn(X[i], X[i], **self.kernel_params)
            return out.astype(dtype)
        for a in range(0, X.shape[0], step):
            blk = X[a : a + step]
            out[a : a + step] = np.diagonal(np.asarray(self.fn(blk, blk, **self.kernel_params)))
        return out.astype(dtype)

    def __dask_tokenize__(self):
        return ("CallableKernel", self.fn, repr(sorted(self.kernel_params.items())))


class PrecomputedKernel(Kernel):
    """``kernel="precomputed"``: the caller passes kernel values, not rows.

    A marker: fit takes the n x n kernel matrix and transform the n_new x n
    kernel between new and training rows (see
    :class:`kpca_dask.gram.PrecomputedKernelMatrix`); nothing is evaluated.
    Treated as possibly indefinite.
    """

    name = "precomputed"
    psd = False

    def prepare(self, X, dtype, side="left"):
        raise InvalidParameterError(
            "kernel='precomputed' has no kernel function to evaluate: pass kernel values "
            "(fit: the n x n kernel matrix; transform: the n_new x n_fit kernel)."
        )

    evaluate = diag = prepare


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
