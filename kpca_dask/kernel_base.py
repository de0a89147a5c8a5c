"""The base class of the kernels and the helpers their evaluations share (the
prepare/evaluate split and the centring: :mod:`kpca_dask.kernels`)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from .exceptions import InvalidParameterError


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
