"""Kernels the caller supplies: a callable, or precomputed kernel values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .exceptions import InvalidParameterError
from .kernel_base import Kernel


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
