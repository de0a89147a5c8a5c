"""Errors and warnings raised by kpca_dask.

Every error derives from :class:`KpcaError` and also from the builtin a caller
would naturally catch (``ValueError``, ``FileNotFoundError``...), so code written
against plain Python or scikit-learn keeps working.
"""

from __future__ import annotations

from sklearn.exceptions import ConvergenceWarning as _SklearnConvergenceWarning

__all__ = [
    "KpcaError",
    "InvalidParameterError",
    "InvalidInputError",
    "ConstantKernelError",
    "NotFittedError",
    "ModelFormatError",
    "UnsafeRemovalError",
    "KpcaWarning",
    "ConvergenceWarning",
    "DroppedComponentsWarning",
    "UnverifiedAttributesWarning",
    "PreimageConvergenceWarning",
]


class KpcaError(Exception):
    """Base class of every error raised by kpca_dask."""


class InvalidParameterError(KpcaError, ValueError):
    """An estimator or solver parameter is out of its allowed range."""


class InvalidInputError(KpcaError, ValueError):
    """The data passed to fit/transform cannot be used (shape, dtype, NaN...)."""


class ConstantKernelError(InvalidInputError):
    """The centred kernel matrix has no positive eigenvalue: the data are constant in
    feature space (identical rows, or a kernel parameter that makes the kernel constant)."""


class NotFittedError(KpcaError, ValueError, AttributeError):
    """The estimator is used before ``fit``.

    Like scikit-learn's ``NotFittedError`` it is both a ValueError and an
    AttributeError (what scikit-learn's tools catch); it does not subclass it
    so that importing the exceptions does not import scikit-learn.
    """


class ModelFormatError(KpcaError, ValueError):
    """A saved model is missing, incomplete, corrupt or of an unknown version."""


class UnsafeRemovalError(KpcaError, PermissionError):
    """kpca-dask refused to remove or replace a path: it is not ours, or not safe to touch
    (outside the output, a link, the input, the home or current folder...)."""


class KpcaWarning(UserWarning):
    """Base class of the warnings emitted by kpca_dask."""


class ConvergenceWarning(KpcaWarning, _SklearnConvergenceWarning):
    """An iterative solver could not certify its result to its tolerance.

    Also a :class:`sklearn.exceptions.ConvergenceWarning`, so that code (and
    scikit-learn's own tests) filtering on scikit-learn's class catch it.
    """


class UnverifiedAttributesWarning(KpcaWarning):
    """A saved model of an older schema: its attributes carry no checksum."""


class DroppedComponentsWarning(KpcaWarning):
    """Components with non-positive eigenvalues were removed from the result."""


class PreimageConvergenceWarning(ConvergenceWarning):
    """Fixed-point pre-images did not converge for some rows (they fell back to the
    learned pre-image); the message counts them."""
