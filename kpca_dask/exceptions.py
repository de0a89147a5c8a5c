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


def _make_convergence_warnings() -> tuple[type, type]:
    """``ConvergenceWarning`` (also scikit-learn's ``ConvergenceWarning``, so filters on
    scikit-learn's class catch it) and its subclass ``PreimageConvergenceWarning``,
    built on first access like :func:`_make_not_fitted_error`."""
    try:
        from sklearn.exceptions import ConvergenceWarning as _SkConvergence
    except ImportError:  # pragma: no cover
        bases: tuple = (KpcaWarning,)
    else:
        bases = (KpcaWarning, _SkConvergence)
    conv = type("ConvergenceWarning", bases, {
        "__doc__": "An iterative solver could not certify its result to its tolerance "
                   "(also a sklearn.exceptions.ConvergenceWarning).",
        "__module__": __name__})
    pre = type("PreimageConvergenceWarning", (conv,), {
        "__doc__": "Fixed-point pre-images did not converge for some rows (they fell back "
                   "to the learned pre-image); the message counts them.",
        "__module__": __name__})
    return conv, pre


def __getattr__(name: str):
    # Classes that subclass scikit-learn's are built on first use: importing kpca_dask
    # (Dask workers import kpca_dask.gram and kpca_dask.kernels) must not import it.
    if name == "NotFittedError":
        cls = _make_not_fitted_error()
        globals()["NotFittedError"] = cls
        return cls
    if name in ("ConvergenceWarning", "PreimageConvergenceWarning"):
        conv, pre = _make_convergence_warnings()
        globals().update(ConvergenceWarning=conv, PreimageConvergenceWarning=pre)
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


class InvalidInputTypeError(InvalidInputError, TypeError):
    """Input of the wrong type (e.g. an object array holding non-numbers): a
    TypeError as well, as numpy's and scikit-learn's checks raise."""
