"""A fitted estimator as a :class:`~kpca_dask.persistence.ModelState` and back.

The estimator's side of saving: which parameters and fitted scalars are
recorded, which arrays each kind of model (``kpca_dask._fitted``) and the
pre-image keep, and the checks a loaded state must pass before it becomes an
estimator. :mod:`kpca_dask.persistence` writes and reads the state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._fitted import STRATEGIES, model_of
from .exceptions import ModelFormatError
from .kernels import kernel_from_dict
from .persistence import ModelState
from .preimage import PREIMAGE_METHODS
from .preprocess import Scaler

__all__ = ["restore", "state_of"]

#: fitted scalars a saved model records (and the only ones a load sets)
FITTED_SCALARS = (
    "gamma_",
    "n_components_",
    "n_features_in_",
    "chunk_size_",
    "grand_mean_",
    "kernel_trace_",
    "centred_trace_",
    "eigen_solver_",
    "n_passes_",
    "converged_",
    "n_samples_fit_",
    "landmark_method_",
    "nystroem_method_",
)
_PARAM_TYPES = (type(None), bool, int, float, str)


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return v


def state_of(est: Any) -> ModelState:
    """The state of a fitted estimator; refuses what cannot be stored without pickle."""
    est._check_fitted()
    if callable(est.kernel):
        raise ModelFormatError(
            "A model with a callable kernel cannot be saved: code is never stored (no "
            "pickle). Use a named kernel, or refit from data where the model is needed."
        )
    params = {k: _jsonable(v) for k, v in est.get_params(deep=False).items()}
    if not isinstance(params.get("random_state"), (int, type(None))):
        params["random_state"] = None
    bad = {
        k: type(v).__name__
        for k, v in params.items()
        if not isinstance(v, _PARAM_TYPES) and not isinstance(v, dict)
    }
    if bad:
        raise ModelFormatError(f"Parameters {bad} cannot be stored as JSON.")
    model = model_of(est)
    arrays = {
        "eigenvalues": est.eigenvalues_,
        "explained_variance_ratio": est.explained_variance_ratio_,
        "residuals": est.residuals_,
    }
    arrays.update(model.arrays(est))
    arrays.update(_preimage_arrays(est))
    arrays["kernel_center"] = getattr(est.kernel_, "center", None)  # distance kernels
    return ModelState(
        kind=model.kind,
        params=params,
        kernel=est.kernel_.to_dict(),
        dtype=np.dtype(est._dtype).name,
        fitted={k: _jsonable(getattr(est, k)) for k in FITTED_SCALARS if hasattr(est, k)},
        arrays={k: np.asarray(v) for k, v in arrays.items() if v is not None},
        extra=_extra_of(est),
    )


def _extra_of(est: Any) -> dict[str, Any]:
    """The optional blocks of a saved model: "preimage", "features" and "preprocess"."""
    extra: dict[str, Any] = {}
    if hasattr(est, "dual_coef_"):
        extra["preimage"] = {"method": est.preimage_}
    scaler = getattr(est, "preprocess_", None)
    if scaler is not None:
        extra["preprocess"] = scaler.to_dict()
    features = features_of(est)
    if features is not None:
        extra["features"] = features
    return extra


def features_of(est: Any) -> dict[str, Any] | None:
    """The model's "features" block (names, dtypes, ...), or None when it has no names."""
    names = getattr(est, "feature_names_in_", None)
    if names is None:
        return None
    block = dict(getattr(est, "features_", None) or {})
    block["names"] = [str(c) for c in names]
    block.setdefault("dtypes", None)
    return block


def _restore_preprocess(est: Any, extra: dict[str, Any], where: str) -> None:
    """The fitted scaling (``extra["preprocess"]``); ModelFormatError when malformed."""
    info = extra.get("preprocess") if isinstance(extra, dict) else None
    est.preprocess_ = None
    if info is None:
        return
    try:
        scaler = Scaler.from_dict(info)
    except (ValueError, TypeError) as exc:
        raise ModelFormatError(f"{where}: malformed preprocess block ({exc}).") from None
    if scaler.n_features != int(est.n_features_in_):
        raise ModelFormatError(
            f"{where}: the preprocess block has {scaler.n_features} columns but the model "
            f"{est.n_features_in_} features."
        )
    est.preprocess_ = scaler


def restore(est: Any, state: ModelState) -> Any:
    """Set a fresh estimator's parameters and fitted attributes from ``state``."""
    where = state.source
    valid = est.get_params(deep=False)
    unknown = set(state.params) - set(valid)
    if unknown:
        raise ModelFormatError(f"{where}: unknown parameters {sorted(unknown)}.")
    if state.kind not in STRATEGIES:
        raise ModelFormatError(f"{where} has an unknown model_kind {state.kind!r}.")
    est.set_params(**state.params)
    est.kernel_ = kernel_from_dict(state.kernel)
    est._dtype = np.dtype(state.dtype)
    for k, v in state.fitted.items():
        if k in FITTED_SCALARS:
            setattr(est, k, v)
    arrays = state.arrays
    _restore_kernel_center(est, arrays, where)
    est.eigenvalues_ = arrays["eigenvalues"]
    STRATEGIES[state.kind].restore(est, arrays, where)
    est.explained_variance_ratio_ = arrays.get("explained_variance_ratio")
    est.residuals_ = arrays.get("residuals")
    _restore_preimage(est, state.extra, arrays)
    _restore_features(est, state.extra, where)
    _restore_preprocess(est, state.extra, where)
    est._coef_cache = None
    return est


def _restore_kernel_center(est: Any, arrays: dict[str, np.ndarray], where: Any) -> None:
    """The centre of a distance-based kernel (models saved before it was kept have none:
    they evaluate on uncentred rows, the same kernel to rounding)."""
    c = arrays.get("kernel_center")
    if c is None:
        return
    d = est.n_features_in_
    if not est.kernel_.translation_invariant or c.shape != (d,) or not np.isfinite(c).all():
        raise ModelFormatError(
            f"{where}: kernel_center must be {d} finite numbers of a distance-based kernel "
            f"(got shape {c.shape} for kernel {est.kernel_.name!r})."
        )
    est.kernel_ = est.kernel_.with_center(c)


def _preimage_arrays(est: Any) -> dict[str, np.ndarray]:
    """Arrays the pre-image needs."""
    if not hasattr(est, "dual_coef_"):
        return {}
    arrays = {
        "preimage_embedding": est.X_transformed_fit_,
        "preimage_dual_coef": est.dual_coef_,
        "preimage_indices": np.asarray(est.preimage_indices_, dtype=np.int64),
    }
    if getattr(est, "preimage_components_", None) is not None:
        arrays.update(
            preimage_mean=est.preimage_mean_, preimage_components=est.preimage_components_
        )
    return arrays


def _restore_preimage(est: Any, extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Inverse of :func:`_preimage_arrays`; raises ModelFormatError."""
    est._preimage_cache = None
    info = extra.get("preimage") if isinstance(extra, dict) else None
    if not est.fit_inverse_transform:
        return
    if not isinstance(info, dict) or "preimage_dual_coef" not in arrays:
        raise ModelFormatError(
            "the model says fit_inverse_transform=True but lacks its pre-image arrays "
            "(preimage_embedding, preimage_dual_coef); re-save it from a fitted model."
        )
    method = info.get("method")
    E, D = arrays.get("preimage_embedding"), arrays["preimage_dual_coef"]
    idx = arrays.get("preimage_indices")
    k, d = est.n_components_, est.n_features_in_
    ok = (
        E is not None
        and idx is not None
        and E.ndim == 2
        and D.ndim == 2
        and E.shape[1] == k
        and D.shape == (E.shape[0], d)
        and idx.shape == (E.shape[0],)
    )
    if not ok or method not in PREIMAGE_METHODS[1:]:
        raise ModelFormatError(
            f"inconsistent pre-image arrays or method {method!r} for {k} components and "
            f"{d} features."
        )
    est.X_transformed_fit_, est.dual_coef_, est.preimage_indices_ = E, D, idx
    est.preimage_ = method
    if "preimage_components" in arrays:
        C, mu = arrays["preimage_components"], arrays.get("preimage_mean")
        if C.shape != (k, d) or mu is None or mu.shape != (d,):
            raise ModelFormatError("inconsistent linear pre-image arrays.")
        est.preimage_components_, est.preimage_mean_ = C, mu
    if method == "exact" and "preimage_components" not in arrays:
        raise ModelFormatError("an exact (linear) pre-image needs preimage_components.")


def _restore_features(est: Any, extra: dict[str, Any], where: str) -> None:
    """The "features" block back as ``feature_names_in_`` and ``features_`` (models saved
    before it existed, or fitted without names, have none: they load without names)."""
    block = extra.get("features") if isinstance(extra, dict) else None
    if block is None:
        return
    names = block.get("names") if isinstance(block, dict) else None
    dtypes = block.get("dtypes")
    ok = (
        isinstance(names, list)
        and all(isinstance(c, str) for c in names)
        and len(names) == est.n_features_in_
        and len(set(names)) == len(names)
        and (dtypes is None or (isinstance(dtypes, list) and len(dtypes) == len(names)))
    )
    if not ok:
        raise ModelFormatError(
            f'{where}: malformed "features" block (need one distinct name per each of '
            f"the {est.n_features_in_} features); re-save the model from a fitted one."
        )
    est.feature_names_in_ = np.asarray(names, dtype=object)
    est.features_ = dict(block)
