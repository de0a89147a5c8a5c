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


class _NotFittedBase(KpcaError, ValueError, AttributeError):
    """What :class:`NotFittedError` is when scikit-learn is not installed."""


def _make_not_fitted_error() -> type:
    """``NotFittedError``: subclasses scikit-learn's own ``NotFittedError`` (itself a
    ValueError and an AttributeError), so ``except sklearn.exceptions.NotFittedError``
    and scikit-learn's ``check_is_fitted`` tooling catch it.

    Built on first access (module ``__getattr__``): importing scikit-learn costs
    about 2 s and 100 MB, which Dask workers importing kpca_dask.gram and
    kpca_dask.kernels must not pay.
    """
    try:
        from sklearn.exceptions import NotFittedError as _SkNotFitted
    except ImportError:  # pragma: no cover
        bases: tuple = (_NotFittedBase,)
    else:
        bases = (_NotFittedBase, _SkNotFitted)
    cls = type("NotFittedError", bases, {
        "__doc__": "The estimator is used before ``fit`` (a subclass of scikit-learn's "
                   "NotFittedError, ValueError and AttributeError).",
        "__module__": __name__})
    return cls


_LAZY = {"NotFittedError": lambda: _make_not_fitted_error(),
         "ConvergenceWarning": lambda: _make_convergence_warning(),
         "PreimageConvergenceWarning": lambda: _make_preimage_warning()}


def __getattr__(name: str):
    if name in _LAZY:
        cls = _LAZY[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ModelFormatError(KpcaError, ValueError):
    """A saved model is missing, incomplete, corrupt or of an unknown version."""


class UnsafeRemovalError(KpcaError, PermissionError):
    """kpca-dask refused to remove or replace a path: it is not ours, or not safe to touch
    (outside the output, a link, the input, the home or current folder...)."""


class KpcaWarning(UserWarning):
    """Base class of the warnings emitted by kpca_dask."""


def _make_convergence_warning() -> type:
    """``ConvergenceWarning``: an iterative solver could not certify its result to its
    tolerance. Also a :class:`sklearn.exceptions.ConvergenceWarning`, so that code (and
    scikit-learn's own tests) filtering on scikit-learn's class catch it. Built on first
    access, like ``NotFittedError``, so that workers do not import scikit-learn."""
    try:
        from sklearn.exceptions import ConvergenceWarning as _SkConvergence
    except ImportError:  # pragma: no cover
        bases: tuple = (KpcaWarning,)
    else:
        bases = (KpcaWarning, _SkConvergence)
    return type("ConvergenceWarning", bases, {
        "__doc__": "An iterative solver could not certify its result to its tolerance "
                   "(also a scikit-learn ConvergenceWarning).",
        "__module__": __name__})


class UnverifiedAttributesWarning(KpcaWarning):
    """A saved model of an older schema: its attributes carry no checksum."""


class DroppedComponentsWarning(KpcaWarning):
    """Components with non-positive eigenvalues were removed from the result."""


def _make_preimage_warning() -> type:
    """``PreimageConvergenceWarning`` (a ``ConvergenceWarning``): fixed-point pre-images
    did not converge for some rows (they fell back to the learned pre-image); the message
    counts them."""
    return type("PreimageConvergenceWarning", (__getattr__("ConvergenceWarning"),), {
        "__doc__": _make_preimage_warning.__doc__, "__module__": __name__})


class InvalidInputTypeError(InvalidInputError, TypeError):
    """Input of the wrong type (e.g. an object array holding non-numbers): a
    TypeError as well, as numpy's and scikit-learn's checks raise."""
