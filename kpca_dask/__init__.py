"""kpca_dask: kernel PCA on Dask, exact where affordable, Nyström where not.

The estimator follows scikit-learn's ``KernelPCA`` conventions; the kernel
matrix is handled block by block on whatever Dask scheduler is active.

>>> from kpca_dask import KernelPCA, load
"""

from . import kernels
from .estimator import KernelPCA
from .exceptions import (
    ConvergenceWarning,
    DroppedComponentsWarning,
    InvalidInputError,
    InvalidParameterError,
    KpcaError,
    ModelFormatError,
    NotFittedError,
)
from .persistence import load

__all__ = [
    "KernelPCA",
    "load",
    "kernels",
    "KpcaError",
    "InvalidInputError",
    "InvalidParameterError",
    "NotFittedError",
    "ModelFormatError",
    "ConvergenceWarning",
    "DroppedComponentsWarning",
]

__version__ = "0.1.0"
