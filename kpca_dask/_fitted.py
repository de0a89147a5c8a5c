"""Fitted-model strategies: what differs between an exact and a Nyström model.

A fitted :class:`~kpca_dask.KernelPCA` keeps rows ``X_fit_`` and coefficients on
them; how it got them and what it keeps differ by solver:

- :class:`ExactModel` (dense, arpack, randomized): every training row, the
  eigenvectors of the centred kernel matrix and its row means;
- :class:`PrecomputedModel`: the same from a caller's kernel matrix, so new rows
  come as their kernel values against the training rows (no rows are kept);
- :class:`NystroemModel`: the landmarks, an m x k projection, the centring
  vector and the mean weights; nothing of size n.

Each strategy is stateless: its methods read and write the estimator's fitted
attributes (scikit-learn's public names), so that an estimator holds no other
state and :func:`model_of` picks the strategy from ``eigen_solver_``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import dask.array as da
import numpy as np

from ._eigvals import inv_sqrt
from .exceptions import ModelFormatError
from .preimage import Expansion, exact_expansion, nystroem_expansion
from .projection import project_block, project_precomputed_block

__all__ = ["ExactModel", "NystroemModel", "PrecomputedModel", "model_of"]


class ExactModel:
    """Exact kernel PCA: ``transform(x) = (k(x, X) - mu - mean + g) @ V / sqrt(lambda)``."""

    #: ``model_kind`` of a saved model
    kind = "exact"
    #: attributes only this kind has (removed by a refit of another kind)
    ATTRS: tuple[str, ...] = ()
    #: saved array name -> attribute
    ARRAYS: ClassVar[dict[str, str]] = {
        "X_fit": "X_fit_",
        "eigenvectors": "eigenvectors_",
        "row_means": "row_means_",
    }

    @staticmethod
    def set_solution(est: Any, vectors: np.ndarray, row_means: np.ndarray) -> None:
        """Fitted attributes from the selected eigenvectors."""
        est.eigenvectors_ = np.ascontiguousarray(
            vectors
        )  # layout-independent sums: bitwise reload

    @staticmethod
    def coefficients(est: Any) -> tuple[np.ndarray, tuple]:
        """``[A, 1]`` with ``A = V / sqrt(lambda)``, and ``(mu^T A, 1^T A, g, n)``."""
        A = est.eigenvectors_ * inv_sqrt(est.eigenvalues_)  # zero components: 0
        A_aug = np.hstack([A, np.ones((A.shape[0], 1))])
        consts = (
            est.row_means_ @ A,
            A.sum(axis=0),
            float(est.grand_mean_),
            est.X_fit_.shape[0],
        )
        return A_aug, consts

    @staticmethod
    def block_task(
        est: Any,
        x_key: Any,
        train_key: str,
        coef_key: str,
        consts: tuple,
        what: str,
        out_dtype: np.dtype,
    ) -> tuple:
        """The task that embeds (or scores) one block of new rows."""
        return (
            project_block,
            x_key,
            train_key,
            coef_key,
            consts,
            est.kernel_,
            est._dtype.str,
            what,
            out_dtype.str,
        )

    @staticmethod
    def fit_embedding(est: Any, Xd: da.Array, kind: str) -> Any:
        """The training embedding ``V sqrt(lambda)``: no kernel pass."""
        emb = (est.eigenvectors_ * np.sqrt(est.eigenvalues_)).astype(
            est._out_dtype(), copy=False
        )
        if kind == "numpy":
            return emb
        return da.from_array(emb, chunks=(Xd.chunks[0], (emb.shape[1],)))

    @staticmethod
    def expansion(est: Any) -> Expansion:
        """The model as a weighted sum of kernel functions (fixed-point pre-images)."""
        return exact_expansion(est.X_fit_, est.eigenvectors_, est.eigenvalues_)

    @staticmethod
    def preimage_rows(est: Any, Xb: da.Array, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Training rows ``idx`` and their embedding, as scikit-learn: ``V sqrt(lambda)``."""
        return est.X_fit_[idx], est.eigenvectors_[idx] * np.sqrt(est.eigenvalues_)

    @classmethod
    def arrays(cls, est: Any) -> dict[str, np.ndarray]:
        """The arrays a saved model of this kind holds besides the spectrum."""
        return {name: getattr(est, attr) for name, attr in cls.ARRAYS.items()}

    @classmethod
    def restore(cls, est: Any, arrays: dict[str, np.ndarray], where: Any) -> None:
        """Inverse of :meth:`arrays` (the arrays are checksummed already)."""
        for name, attr in cls.ARRAYS.items():
            setattr(est, attr, arrays[name])


class PrecomputedModel(ExactModel):
    """Exact kernel PCA on a caller's kernel matrix: new rows come as ``k(x, X_fit)``."""

    @staticmethod
    def block_task(
        est: Any,
        x_key: Any,
        train_key: str,
        coef_key: str,
        consts: tuple,
        what: str,
        out_dtype: np.dtype,
    ) -> tuple:
        return (
            project_precomputed_block,
            x_key,
            coef_key,
            consts,
            est._dtype.str,
            out_dtype.str,
        )


class NystroemModel:
    """Nyström kernel PCA: ``transform(x) = k(x, Z) @ projection_ - offset_``."""

    kind = "nystroem"
    ATTRS = (
        "landmarks_",
        "landmark_indices_",
        "n_landmarks_",
        "projection_",
        "offset_",
        "mean_weights_",
        "landmark_method_",
        "nystroem_method_",
        "statistics_",
    )

    @staticmethod
    def set_solution(est: Any, vectors: np.ndarray, row_means: np.ndarray) -> None:
        est.projection_ = np.ascontiguousarray(vectors)
        est.offset_ = row_means @ est.projection_
        est.eigenvectors_ = NystroemModel.eigenvectors(est)

    @staticmethod
    def eigenvectors(est: Any) -> np.ndarray:
        """``projection_ * sqrt(eigenvalues_)``, computed the same way after a reload."""
        return est.projection_ * np.sqrt(est.eigenvalues_)

    @staticmethod
    def coefficients(est: Any) -> tuple[np.ndarray, tuple]:
        """``[projection_, mean_weights_]`` and ``(offset_, 0, g, 1)``: the embedding is
        ``k(x, Z) A - offset_`` and ``k(x, Z) . mean_weights_`` stands in for
        ``mean(k(x, X))``."""
        A = est.projection_
        A_aug = np.hstack([A, est.mean_weights_[:, None]])
        consts = (est.offset_, np.zeros(A.shape[1]), float(est.grand_mean_), 1.0)
        return A_aug, consts

    block_task = ExactModel.block_task

    @staticmethod
    def fit_embedding(est: Any, Xd: da.Array, kind: str) -> Any:
        """The embedding of every training row by the fitted model (one more pass)."""
        return est._project_array(Xd, kind, "transform")

    @staticmethod
    def expansion(est: Any) -> Expansion:
        return nystroem_expansion(est.landmarks_, est.projection_, est.mean_weights_)

    @staticmethod
    def preimage_rows(est: Any, Xb: da.Array, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Training rows ``idx`` (read from X) and their embedding by the model."""
        from .threads import blas_threads_for_dask

        n = Xb.shape[0]
        with blas_threads_for_dask():
            rows = np.asarray(
                Xb[idx].compute() if idx.size < n else Xb.compute(), dtype=np.float64
            )
        return rows, est._embed_rows(rows)

    @staticmethod
    def arrays(est: Any) -> dict[str, np.ndarray]:
        return {
            "landmarks": est.landmarks_,
            "landmark_indices": np.asarray(est.landmark_indices_, dtype=np.int64),
            "projection": est.projection_,
            "offset": est.offset_,
            "landmark_means": est.row_means_,
            "mean_weights": est.mean_weights_,
            # sufficient statistics for exact updates (kpca_dask.update), when kept
            **(est.statistics_.arrays() if getattr(est, "statistics_", None) else {}),
        }

    @staticmethod
    def restore(est: Any, arrays: dict[str, np.ndarray], where: Any) -> None:
        if est.eigen_solver_ != "nystroem":
            raise ModelFormatError(
                f"{where}: a Nyström model must record eigen_solver_='nystroem'."
            )
        est.landmarks_ = est.X_fit_ = arrays["landmarks"]
        est.landmark_indices_ = arrays["landmark_indices"]
        est.n_landmarks_ = int(arrays["landmarks"].shape[0])
        est.projection_ = arrays["projection"]
        est.offset_ = arrays["offset"]
        est.row_means_ = arrays["landmark_means"]
        est.mean_weights_ = arrays["mean_weights"]
        est.eigenvectors_ = NystroemModel.eigenvectors(est)
        est.statistics_ = NystroemModel.restore_statistics(est, arrays, where)
        m, d = est.landmarks_.shape
        k = est.eigenvalues_.shape[0]
        expected = {
            "projection": (est.projection_.shape, (m, k)),
            "offset": (est.offset_.shape, (k,)),
            "landmark_means": (est.row_means_.shape, (m,)),
            "mean_weights": (est.mean_weights_.shape, (m,)),
            "landmark_indices": (est.landmark_indices_.shape, (m,)),
        }
        bad = {name: got for name, (got, want) in expected.items() if got != want}
        if bad or d != est.n_features_in_:
            raise ModelFormatError(
                f"{where}: inconsistent Nyström array shapes {bad} for "
                f"{m} landmarks, {k} components and {d} features."
            )

    @staticmethod
    def restore_statistics(est: Any, arrays: dict[str, np.ndarray], where: Any) -> Any:
        """The saved sufficient statistics (None when the model has none: older models,
        ``keep_statistics=False``, or a randomized fit under "auto")."""
        from .solvers.nystroem import NystroemStatistics

        names = ("stat_shift", "stat_colsum", "stat_cross")
        if not any(n in arrays for n in names):
            return None
        m = int(arrays["landmarks"].shape[0])
        want = {"stat_shift": (m,), "stat_colsum": (m,), "stat_cross": (m, m)}
        bad = {n: arrays[n].shape if n in arrays else None for n in names}
        bad = {n: got for n, got in bad.items() if got != want[n]}
        if bad or not hasattr(est, "n_samples_fit_") or not hasattr(est, "kernel_trace_"):
            raise ModelFormatError(
                f"{where}: inconsistent sufficient statistics {bad} for {m} landmarks "
                "(or no row count and trace); re-save the model from a fit."
            )
        return NystroemStatistics(
            np.asarray(arrays["stat_shift"], dtype=np.float64),
            int(est.n_samples_fit_),
            np.asarray(arrays["stat_colsum"], dtype=np.float64),
            np.asarray(arrays["stat_cross"], dtype=np.float64),
            float(est.kernel_trace_),
        )


STRATEGIES = {"exact": ExactModel, "nystroem": NystroemModel}


def model_of(est: Any) -> type[ExactModel | NystroemModel]:
    """The strategy of a fitted (or fitting) estimator."""
    if getattr(est, "eigen_solver_", None) == "nystroem":
        return NystroemModel
    if isinstance(est.kernel, str) and est.kernel == "precomputed":
        return PrecomputedModel
    return ExactModel
