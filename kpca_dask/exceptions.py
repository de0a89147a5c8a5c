"""Errors and warnings raised by kpca_dask.

Every error derives from :class:`KpcaError` and also from the builtin a caller
would naturally catch (``ValueError``, ``FileNotFoundError``...), so code written
against plain Python or scikit-learn keeps working.
"""

from __future__ import annotations

__all__ = [
    "KpcaError",
    "InvalidParameterError",
    "InvalidInputError",
    "ConstantKernelError",
    "NotFittedError",  # noqa: F822 (built on first use by __getattr__)
    "ModelFormatError",
    "UnsafeRemovalError",
    "NotUpdatableError",
    "PartialFitUnavailableError",
    "BasisLostError",
    "KpcaWarning",
    "ConvergenceWarning",  # noqa: F822 (built on first use by __getattr__)
    "DroppedComponentsWarning",
    "PrecisionWarning",
    "AsymmetricKernelWarning",
    "UnverifiedAttributesWarning",
    "PreimageConvergenceWarning",  # noqa: F822 (built on first use by __getattr__)
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


class _NotFittedBase(KpcaError, ValueError, AttributeError):
    """What :class:`NotFittedError` is when scikit-learn is not installed."""


def _sklearn_subclass(name: str, base: type, sklearn_name: str, doc: str) -> type:
    """``name``: a subclass of ``base`` and of ``sklearn.exceptions.<sklearn_name>``, so
    that ``except``/warning filters on scikit-learn's class (and its tooling, e.g.
    ``check_is_fitted``) catch ours. Built on first access (module ``__getattr__``):
    importing scikit-learn costs about 2 s and 100 MB, which Dask workers importing
    kpca_dask.gram and kpca_dask.kernels must not pay."""
    try:
        import sklearn.exceptions as sk
    except ImportError:  # pragma: no cover
        bases: tuple = (base,)
    else:
        bases = (base, getattr(sk, sklearn_name))
    return type(name, bases, {"__doc__": doc, "__module__": __name__})


#: The classes built on first use, each from the ones before it.
_LAZY = {
    "NotFittedError": lambda: _sklearn_subclass(
        "NotFittedError",
        _NotFittedBase,
        "NotFittedError",
        "The estimator is used before ``fit`` (a subclass of scikit-learn's "
        "NotFittedError, ValueError and AttributeError).",
    ),
    "ConvergenceWarning": lambda: _sklearn_subclass(
        "ConvergenceWarning",
        KpcaWarning,
        "ConvergenceWarning",
        "An iterative solver could not certify its result to its tolerance "
        "(also a sklearn.exceptions.ConvergenceWarning).",
    ),
    "PreimageConvergenceWarning": lambda: type(
        "PreimageConvergenceWarning",
        (__getattr__("ConvergenceWarning"),),
        {
            "__doc__": "Fixed-point pre-images did not converge for some rows (they fell "
            "back to the learned pre-image); the message counts them.",
            "__module__": __name__,
        },
    ),
}


def __getattr__(name: str):
    # Python calls it for names not yet in the module; _LAZY calls it for a base class
    # that may be built already: build once, then keep (one class per name).
    if name in _LAZY:
        if name not in globals():
            globals()[name] = _LAZY[name]()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ModelFormatError(KpcaError, ValueError):
    """A saved model is missing, incomplete, corrupt or of an unknown version."""


class UnsafeRemovalError(KpcaError, PermissionError):
    """kpca-dask refused to remove or replace a path: it is not ours, or not safe to touch
    (outside the output, a link, the input, the home or current folder...)."""


class KpcaWarning(UserWarning):
    """Base class of the warnings emitted by kpca_dask."""


class UnverifiedAttributesWarning(KpcaWarning):
    """A saved model of an older schema: its attributes carry no checksum."""


class DroppedComponentsWarning(KpcaWarning):
    """Components with non-positive eigenvalues were removed from the result."""


class AsymmetricKernelWarning(KpcaWarning):
    """A precomputed kernel matrix is not symmetric beyond rounding: its symmetric part
    ``(K + K.T) / 2`` is used."""


class PrecisionWarning(KpcaWarning):
    """The data's own precision, or the kernel's evaluation in the compute dtype, cannot
    support the accuracy the fit certifies (the message names the cause and the fix)."""


class InvalidInputTypeError(InvalidInputError, TypeError):
    """Input of the wrong type (e.g. an object array holding non-numbers): a
    TypeError as well, as numpy's and scikit-learn's checks raise."""


class NotUpdatableError(KpcaError, ValueError):
    """A model cannot take new rows exactly (not Nyström, or no sufficient statistics)."""


class PartialFitUnavailableError(NotUpdatableError, AttributeError):
    """``partial_fit`` on an exact estimator: an AttributeError as well, so that
    ``hasattr(est, "partial_fit")`` is False for it (scikit-learn's checks, duck typing)."""


class BasisLostError(KpcaError, ConnectionError):
    """A Dask worker holding part of the solver's Krylov basis (``kpca.worker-basis``) was
    lost during the fit: the basis cannot be rebuilt from the others, so the fit stops.
    A ConnectionError (an OSError): an environment failure, worth running again."""
