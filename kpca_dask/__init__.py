"""kpca_dask: kernel PCA on Dask, exact where affordable, Nyström where not.

The estimator follows scikit-learn's ``KernelPCA`` conventions; the kernel
matrix is handled block by block on whatever Dask scheduler is active.

>>> from kpca_dask import KernelPCA, load
"""

from typing import TYPE_CHECKING, Any

from . import kernels
from .exceptions import (
    AsymmetricKernelWarning,
    DroppedComponentsWarning,
    InvalidInputError,
    InvalidParameterError,
    KpcaError,
    ModelFormatError,
    PrecisionWarning,
    UnsafeRemovalError,
)

#: Subclasses of scikit-learn's classes, built on first use (kpca_dask.exceptions).
_SKLEARN_SUBCLASSES = ("NotFittedError", "ConvergenceWarning", "PreimageConvergenceWarning")

if TYPE_CHECKING:  # pragma: no cover
    from .estimator import KernelPCA, load


def __getattr__(name: str) -> Any:
    # The estimator (and scikit-learn behind it, ~100 MB per process) is
    # imported on first use only: Dask workers import kpca_dask.gram and
    # kpca_dask.kernels to run block tasks and never need it.
    if name == "KernelPCA":
        from .estimator import KernelPCA

        return KernelPCA
    if name in _SKLEARN_SUBCLASSES:
        from . import exceptions

        return getattr(exceptions, name)
    if name == "load":
        from .estimator import load

        return load
    raise AttributeError(f"module 'kpca_dask' has no attribute {name!r}")


__all__ = [
    "KernelPCA",
    "load",
    "kernels",
    "KpcaError",
    "InvalidInputError",
    "InvalidParameterError",
    "NotFittedError",
    "ModelFormatError",
    "UnsafeRemovalError",
    "ConvergenceWarning",
    "DroppedComponentsWarning",
    "PreimageConvergenceWarning",
    "PrecisionWarning",
    "AsymmetricKernelWarning",
]

__version__ = "0.1.0"
