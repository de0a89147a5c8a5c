"""Dot-product kernels: linear, polynomial, sigmoid and cosine."""

from __future__ import annotations

import numpy as np

from .kernel_base import Kernel, _as, _matmul, _sq_norms


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
