"""What an eigensolve hands the estimator: :class:`Solution` (``kpca_dask._solve``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .solvers import EigResult

__all__ = ["Solution"]


@dataclass
class Solution:
    """An eigensolve's result with the centring statistics and the rows the model keeps."""

    result: EigResult
    row_means: np.ndarray
    grand_mean: float
    kernel_trace: float
    #: the solver that produced ``result`` ("auto" may escalate randomized to dense)
    solver: str
    #: exact solvers: the training rows (an (n, 0) array for a precomputed kernel);
    #: Nyström: the landmarks
    X_fit: np.ndarray
    #: Nyström only: landmark indices and methods, mean weights
    nystroem: dict[str, Any] = field(default_factory=dict)
