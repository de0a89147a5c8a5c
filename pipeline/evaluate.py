"""Evaluate stage: how good is the embedding for downstream classification?

Kernel PCA's classic result (Schölkopf, Smola and Müller 1998) is that a
*linear* classifier on nonlinear principal components does as well as a
nonlinear classifier on the raw inputs. This stage lets a user check that on
their own data, in the same run that produced the embedding:

1. a linear classifier (logistic regression, linear SVM, or SGD for
   embeddings too large for memory) is trained on the training rows of the
   kernel PCA embedding and scored on the held-out rows, which the pipeline
   embedded with the saved model's ``transform`` (the model never saw them);
2. the same classifier is trained on linear PCA with the same number of
   components (fitted on the training rows only) as a baseline;
3. accuracy is swept over the number of components ``k``: kernel PCA
   components nest (the first ``k`` columns of the embedding are the
   ``k``-component embedding), so the sweep needs no refit;
4. optionally, the kernel coefficient ``gamma`` is chosen by
   cross-validation on (a subsample of) the training split;
5. ``<out>/report/metrics.json`` is written (schema: :data:`METRICS_SCHEMA`)
   and :func:`pipeline.report.write_report` draws the plots.

The array-level functions (:func:`make_split`, :func:`evaluate_embeddings`,
:func:`linear_pca_baseline`, :func:`component_sweep`, :func:`gamma_cv_sweep`)
work on numpy or dask arrays and know nothing about run folders;
:func:`evaluate_run` is the stage that reads a run folder (layout in
docs/artifacts.md).

Memory model: with ``classifier="logistic"`` or ``"linear_svc"`` the training
embedding (``n_train x k`` float64) is loaded; with ``"sgd"`` only one row
chunk at a time is (a scaling pass, ``sgd_epochs`` passes, one test pass, all
sweep points trained from the same pass). The linear PCA baseline loads the
training rows of X only when they fit in ``baseline_memory_mb``; otherwise it
streams them through :class:`~sklearn.decomposition.IncrementalPCA`.
Held-out rows are always predicted chunk by chunk. Novelty scores and the
scatter plot use documented subsamples (``max_novelty_points``,
``max_scatter_points``). The split mask is held in memory (1 byte per row).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
from threadpoolctl import threadpool_limits

from .config import SGD_MIN_ROWS, EvaluateConfig
from .errors import UserError
from .store import Location, atomic_write_json

__all__ = [
    "EvaluateConfig",
    "EvaluationError",
    "METRICS_SCHEMA",
    "METRICS_SCHEMA_VERSION",
    "SGD_MIN_ROWS",
    "make_split",
    "resolve_classifier",
    "resolve_sweep",
    "evaluate_embeddings",
    "component_sweep",
    "linear_pca_baseline",
    "gamma_cv_sweep",
    "classification_metrics",
    "evaluate_run",
]

logger = logging.getLogger("pipeline.evaluate")

METRICS_SCHEMA_VERSION = 1

#: kernels whose ``gamma`` a cross-validated sweep can tune.
GAMMA_KERNELS = ("rbf", "laplacian", "poly", "polynomial", "sigmoid")

#: multipliers of the fitted ``gamma_`` tried by ``gamma_sweep="auto"``.
AUTO_GAMMA_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


class EvaluationError(UserError, ValueError):
    """The run folder cannot be evaluated as configured (the message names the fix)."""


# --------------------------------------------------------------------------- config
def _as_config(config: EvaluateConfig | dict[str, Any] | None) -> EvaluateConfig:
    if config is None:
        return EvaluateConfig()
    if isinstance(config, EvaluateConfig):
        return config
    return EvaluateConfig.model_validate(config)


# ---------------------------------------------------------------------------- split
def make_split(labels: Any, test_fraction: float = 0.2, *, random_state: int = 0,
               stratify: bool = True) -> Any:
    """Seeded train/test split: 1 = training row, 0 = held-out row.

    Parameters
    ----------
    labels : array of shape (n_samples,), numpy or dask
        Integer class codes (negative codes are not allowed).
    test_fraction : float in (0, 1)
    random_state : int
    stratify : bool
        numpy labels: every class with at least two rows gets
        ``round(test_fraction * n_c)`` held-out rows (at least one, and at
        least one training row is always left). dask labels: each row is
        held out with probability ``test_fraction`` from a generator seeded by
        ``(random_state, chunk index)``: no pass over the labels, stratified
        only in expectation, and dependent on the chunking.

    Returns
    -------
    split : uint8 array of shape (n_samples,) (dask in, lazy dask out)
    """
    EvaluateConfig(test_fraction=test_fraction)  # same message as the config
    if isinstance(labels, da.Array):
        def _block(y: np.ndarray, block_info: Any = None) -> np.ndarray:
            idx = block_info[0]["chunk-location"][0] if block_info else 0
            rng = np.random.default_rng([random_state, idx])
            return (rng.random(y.shape[0]) >= test_fraction).astype(np.uint8)

        return labels.map_blocks(_block, dtype=np.uint8)
    y = np.asarray(labels)
    if y.ndim != 1:
        raise EvaluationError(f"labels must be 1-D; got shape {y.shape}")
    n = y.shape[0]
    if n < 2:
        raise EvaluationError(f"a train/test split needs at least 2 labelled rows; got {n}")
    rng = np.random.default_rng(random_state)
    split = np.ones(n, dtype=np.uint8)
    groups = [np.flatnonzero(y == c) for c in np.unique(y)] if stratify else [np.arange(n)]
    for idx in groups:
        if idx.size < 2:
            continue  # a singleton class stays in training
        n_test = int(round(test_fraction * idx.size))
        n_test = min(max(n_test, 1), idx.size - 1)
        split[rng.permutation(idx)[:n_test]] = 0
    if split.all():  # every class was a singleton
        split[rng.integers(n)] = 0
    return split


# ------------------------------------------------------------------- classifiers
def resolve_classifier(name: str, n_train: int, sgd_min_rows: int = SGD_MIN_ROWS) -> str:
    """The classifier ``"auto"`` stands for (logistic up to ``sgd_min_rows``, then sgd)."""
    if name != "auto":
        return name
    return "sgd" if n_train > sgd_min_rows else "logistic"


def resolve_sweep(sweep: Sequence[int] | str | None, k: int) -> tuple[list[int], list[int]]:
    """Numbers of components to evaluate (always including ``k``) and those skipped (> k)."""
    if sweep is None:
        return [k], []
    if sweep == "auto":
        # 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, ...: about 1.5x steps, powers of two kept.
        return [x for x in _AUTO_STEPS if x < k] + [k], []
    asked = sorted(set(int(x) for x in sweep))
    return sorted({x for x in asked if x <= k} | {k}), [x for x in asked if x > k]


_AUTO_STEPS = sorted({int(b * 2**e) for e in range(40) for b in (1, 1.5)})


def _make_classifier(kind: str, cfg: EvaluateConfig, n_train: int) -> Any:
    from sklearn.linear_model import LogisticRegression, SGDClassifier
    from sklearn.svm import LinearSVC

    if kind == "logistic":
        return LogisticRegression(C=cfg.C, max_iter=cfg.max_iter)
    if kind == "linear_svc":
        return LinearSVC(C=cfg.C, max_iter=cfg.max_iter, random_state=cfg.random_state)
    if kind == "sgd":
        # Same objective as LogisticRegression(C): C sum(loss) + |w|^2 / 2, divided by C n.
        return SGDClassifier(loss="log_loss", alpha=1.0 / (cfg.C * max(n_train, 1)),
                             random_state=cfg.random_state)
    raise EvaluationError(f"unknown classifier {kind!r}")


class _Identity:
    """Stand-in for StandardScaler when ``standardize`` is off."""

    def fit(self, X: np.ndarray) -> _Identity:
        return self

    def partial_fit(self, X: np.ndarray) -> _Identity:
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        return X


def _scaler(cfg: EvaluateConfig) -> Any:
    from sklearn.preprocessing import StandardScaler

    return StandardScaler() if cfg.standardize else _Identity()


# -------------------------------------------------------------- row-block streams
def _blocks(X: Any, y: Any = None, rows: int = 65536) -> Iterator[tuple[np.ndarray, Any]]:
    """Aligned numpy row blocks of ``X`` (and ``y``): dask chunk by chunk, numpy by slices."""
    if isinstance(X, da.Array):
        if y is not None:
            y = y.rechunk({0: X.chunks[0]}) if isinstance(y, da.Array) else \
                da.from_array(np.asarray(y), chunks=(X.chunks[0],))
        for i in range(len(X.chunks[0])):
            if y is None:
                (xb,) = dask.compute(X.blocks[i])
                yield np.asarray(xb), None
            else:
                xb, yb = dask.compute(X.blocks[i], y.blocks[i])
                yield np.asarray(xb), np.asarray(yb)
        return
    X = np.asarray(X)
    y = None if y is None else np.asarray(y)
    for s in range(0, X.shape[0], rows):
        yield X[s:s + rows], (None if y is None else y[s:s + rows])


def _n_rows(X: Any) -> int:
    return int(X.shape[0])


def _to_numpy(*arrays: Any) -> list[np.ndarray]:
    lazy = [a for a in arrays if isinstance(a, da.Array)]
    done = iter(dask.compute(*lazy)) if lazy else iter(())
    return [np.asarray(next(done)) if isinstance(a, da.Array) else np.asarray(a) for a in arrays]


def _confusions(train: Any, y_train: Any, test: Any, y_test: Any, ks: Sequence[int],
                n_classes: int, cfg: EvaluateConfig, kind: str) -> tuple[dict[int, np.ndarray],
                                                                         dict[str, Any]]:
    """Train one classifier per ``k`` (first ``k`` columns), return test confusion matrices.

    All classifiers learn from the same read of the data: in memory for
    logistic/linear_svc, one pass per epoch over row chunks for sgd.
    """
    from sklearn.exceptions import ConvergenceWarning as SkConvergenceWarning

    ks = sorted(set(int(k) for k in ks))
    kmax = ks[-1]
    if kmax > train.shape[1]:
        raise EvaluationError(f"asked for {kmax} components but the embedding has "
                              f"{train.shape[1]} columns")
    n_train = _n_rows(train)
    classes = np.arange(n_classes)
    scaler = _scaler(cfg)
    models = {k: _make_classifier(kind, cfg, n_train) for k in ks}
    info: dict[str, Any] = {"converged": True}
    # Small problems: one BLAS thread. lbfgs makes hundreds of tiny BLAS calls
    # whose thread wake-ups cost more than the arithmetic (measured 2.4x faster
    # for 10 fits on 1347 x 32 on a busy 2-core machine).
    blas = threadpool_limits(1, user_api="blas") if n_train * kmax <= 2_000_000 \
        else contextlib.nullcontext()
    with blas, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkConvergenceWarning)
        if kind == "sgd":
            for xb, _ in _blocks(train[:, :kmax]):
                scaler.partial_fit(xb)
            rng = np.random.default_rng(cfg.random_state)
            tr = train[:, :kmax]
            for _ in range(cfg.sgd_epochs):
                # Shuffle rows within each chunk; chunk order is kept (reads stay sequential).
                for xb, yb in _blocks(tr, y_train):
                    p = rng.permutation(xb.shape[0])
                    xs, ys = scaler.transform(xb[p]), yb[p]
                    for k, m in models.items():
                        m.partial_fit(xs[:, :k], ys, classes=classes)
        else:
            Xtr, ytr = _to_numpy(train[:, :kmax], y_train)
            Xs = scaler.fit(Xtr).transform(Xtr)
            present = np.unique(ytr)
            if present.size < 2:
                raise EvaluationError(f"the training rows hold {present.size} class(es); a "
                                      "classifier needs at least two")
            for k, m in models.items():
                m.fit(Xs[:, :k], ytr)
        info["converged"] = not any(issubclass(w.category, SkConvergenceWarning) for w in caught)
    conf = {k: np.zeros((n_classes, n_classes), dtype=np.int64) for k in ks}
    for xb, yb in _blocks(test[:, :kmax], y_test):
        xs = scaler.transform(xb)
        yb = np.asarray(yb, dtype=np.int64)
        for k, m in models.items():
            pred = np.asarray(m.predict(xs[:, :k]), dtype=np.int64)
            np.add.at(conf[k], (yb, pred), 1)
    info["n_train"] = n_train
    return conf, info


def classification_metrics(confusion: np.ndarray, classes: Sequence[str]) -> dict[str, Any]:
    """Accuracy, per-class precision/recall/F1/support and macro averages from a confusion matrix.

    ``confusion[i, j]`` counts held-out rows of class ``i`` predicted as ``j``.
    Precision of a class never predicted (or recall of a class absent from
    the test rows) is undefined and reported as ``None``.
    """
    C = np.asarray(confusion, dtype=np.int64)
    tp = np.diag(C).astype(float)
    support = C.sum(axis=1)
    predicted = C.sum(axis=0)
    total = int(C.sum())
    per_class, recalls, f1s = [], [], []
    for i, name in enumerate(classes):
        prec = tp[i] / predicted[i] if predicted[i] else None
        rec = tp[i] / support[i] if support[i] else None
        f1 = (2 * prec * rec / (prec + rec) if prec is not None and rec is not None
              and prec + rec > 0 else (0.0 if prec is not None and rec is not None else None))
        per_class.append({"class": str(name), "precision": prec, "recall": rec, "f1": f1,
                          "support": int(support[i])})
        if rec is not None:
            recalls.append(rec)
            f1s.append(f1 if f1 is not None else 0.0)
    return {
        "accuracy": float(tp.sum() / total) if total else None,
        "balanced_accuracy": float(np.mean(recalls)) if recalls else None,
        "macro_f1": float(np.mean(f1s)) if f1s else None,
        "n_test": total,
        "per_class": per_class,
        "confusion_matrix": C.tolist(),
    }


def _n_classes(classes: Sequence[str] | None, *ys: Any) -> tuple[int, list[str]]:
    if classes is not None:
        return len(classes), [str(c) for c in classes]
    top = max(int(da.max(y).compute()) if isinstance(y, da.Array) else int(np.max(y))
              for y in ys)
    return top + 1, [str(i) for i in range(top + 1)]


def evaluate_embeddings(train_embedding: Any, y_train: Any, test_embedding: Any, y_test: Any,
                        *, classes: Sequence[str] | None = None,
                        config: EvaluateConfig | dict[str, Any] | None = None,
                        n_components: int | None = None) -> dict[str, Any]:
    """Train a linear classifier on a training embedding and score it on held-out rows.

    Parameters
    ----------
    train_embedding : array of shape (n_train, k), numpy or dask
    y_train : array of shape (n_train,), int class codes ``0 .. n_classes - 1``
    test_embedding : array of shape (n_test, k), embedded with the *fitted* model
        (``transform``), never by a refit that saw these rows
    y_test : array of shape (n_test,)
    classes : sequence of str, optional
        Class names, ``classes[i]`` for code ``i`` (default: the codes).
    config : EvaluateConfig or dict, optional
        Classifier settings (classifier, C, max_iter, standardize, sgd_*).
    n_components : int, optional
        Use the first ``n_components`` columns (default: all).

    Returns
    -------
    metrics : dict
        ``accuracy``, ``balanced_accuracy``, ``macro_f1``, ``n_test``,
        ``per_class`` (list of {class, precision, recall, f1, support}),
        ``confusion_matrix`` (rows = true class), ``n_components``,
        ``n_train``, ``classifier``, ``converged``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> E = rng.normal(size=(200, 3)); y = (E[:, 0] > 0).astype(int)
    >>> m = evaluate_embeddings(E[:150], y[:150], E[150:], y[150:])
    >>> m["accuracy"] > 0.9
    True
    """
    cfg = _as_config(config)
    k = int(n_components or train_embedding.shape[1])
    n_cls, names = _n_classes(classes, y_train, y_test)
    kind = resolve_classifier(cfg.classifier, _n_rows(train_embedding), cfg.sgd_min_rows)
    conf, info = _confusions(train_embedding, y_train, test_embedding, y_test, [k], n_cls,
                             cfg, kind)
    out = classification_metrics(conf[k], names)
    out.update(n_components=k, n_train=info["n_train"], classifier=kind,
               converged=info["converged"])
    return out


def component_sweep(train_embedding: Any, y_train: Any, test_embedding: Any, y_test: Any,
                    components: Sequence[int] | str | None = "auto", *,
                    classes: Sequence[str] | None = None,
                    config: EvaluateConfig | dict[str, Any] | None = None) -> dict[str, Any]:
    """Held-out accuracy as a function of the number of components, without refitting.

    Principal components nest: the first ``k`` columns of an embedding are
    the ``k``-component embedding (kernel PCA and linear PCA alike), so each
    sweep point only trains a classifier on a column prefix. All points are
    trained from the same read of the data.

    Returns
    -------
    dict with ``n_components`` (list of k), ``accuracy`` (list), ``skipped``
    (requested k above the embedding's width) and ``classifier``.
    """
    cfg = _as_config(config)
    ks, skipped = resolve_sweep(components, int(train_embedding.shape[1]))
    n_cls, names = _n_classes(classes, y_train, y_test)
    kind = resolve_classifier(cfg.classifier, _n_rows(train_embedding), cfg.sgd_min_rows)
    conf, info = _confusions(train_embedding, y_train, test_embedding, y_test, ks, n_cls,
                             cfg, kind)
    return {"n_components": ks,
            "accuracy": [classification_metrics(conf[k], names)["accuracy"] for k in ks],
            "skipped": skipped, "classifier": kind, "converged": info["converged"]}


# ------------------------------------------------------------------ PCA baseline
def linear_pca_baseline(X_train: Any, X_test: Any, n_components: int, *,
                        random_state: int = 0, memory_mb: float = 512.0,
                        batch_rows: int | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """Linear PCA fitted on the training rows only; embed training and held-out rows.

    Parameters
    ----------
    X_train : array of shape (n_train, d), numpy or dask
    X_test : array of shape (n_test, d), numpy or dask
    n_components : int
        Capped at ``min(n_train, d)`` (linear PCA has no more components);
        the number used is ``info["n_components"]``.
    memory_mb : float
        When ``n_train * d * 8`` bytes fit, scikit-learn's PCA is fitted in
        memory; otherwise :class:`~sklearn.decomposition.IncrementalPCA`
        streams the training rows batch by batch and never holds more than
        one batch (exact for the leading, well separated directions).
    batch_rows : int, optional
        Rows per IncrementalPCA batch (default: about 64 MB of float64, at
        least ``2 * n_components``); a short last batch is merged into the
        one before it.

    Returns
    -------
    train_embedding, test_embedding : numpy arrays (numpy in) or lazy dask arrays (dask in)
    info : dict with ``method`` ("pca" or "incremental_pca"), ``n_components``,
        ``n_fit_rows`` and ``explained_variance_ratio``.
    """
    from sklearn.decomposition import PCA, IncrementalPCA

    n_train, d = int(X_train.shape[0]), int(X_train.shape[1])
    k = int(min(n_components, d, n_train))
    if k < 1:
        raise EvaluationError("the linear PCA baseline needs at least one training row and "
                              "one feature")
    lazy = isinstance(X_train, da.Array) or isinstance(X_test, da.Array)
    if n_train * d * 8 <= memory_mb * 2**20:
        (Xtr,) = _to_numpy(X_train)
        pca: Any = PCA(n_components=k, random_state=random_state).fit(Xtr)
        method = "pca"
        train_emb: Any = pca.transform(Xtr)
        if isinstance(X_train, da.Array):
            train_emb = da.from_array(train_emb, chunks=(X_train.chunks[0], (k,)))
    else:
        if batch_rows is None:
            batch_rows = max(2 * k, int(64 * 2**20 // (8 * d)))
        batch_rows = max(int(batch_rows), k)
        Xd = X_train if isinstance(X_train, da.Array) else da.from_array(np.asarray(X_train))
        Xd = Xd.rechunk({0: _batch_chunks(n_train, batch_rows), 1: -1})
        pca = IncrementalPCA(n_components=k)
        for xb, _ in _blocks(Xd):
            pca.partial_fit(xb)
        method = "incremental_pca"
        if isinstance(X_train, da.Array):
            Xw = X_train.rechunk({1: -1})
            train_emb = Xw.map_blocks(pca.transform, chunks=(Xw.chunks[0], (k,)),
                                      dtype=np.float64)
        else:
            train_emb = np.vstack([pca.transform(xb) for xb, _ in _blocks(X_train)])
    if isinstance(X_test, da.Array):
        Xt = X_test.rechunk({1: -1})
        test_emb: Any = Xt.map_blocks(pca.transform, chunks=(Xt.chunks[0], (k,)),
                                      dtype=np.float64)
    else:
        test_emb = pca.transform(np.asarray(X_test))
    if lazy and not isinstance(train_emb, da.Array):
        train_emb = da.from_array(train_emb)
    info = {"method": method, "n_components": k, "n_fit_rows": n_train,
            "explained_variance_ratio": [float(v) for v in pca.explained_variance_ratio_]}
    return train_emb, test_emb, info


def _batch_chunks(n: int, rows: int) -> tuple[int, ...]:
    """Row chunks of ``rows`` with the remainder folded into the last one (no tiny batch)."""
    q, r = divmod(n, rows)
    if q == 0:
        return (n,)
    sizes = [rows] * q
    sizes[-1] += r
    return tuple(sizes)


# --------------------------------------------------------------- gamma by CV
def gamma_cv_sweep(X_train: np.ndarray, y_train: np.ndarray, estimator: Any,
                   gammas: Sequence[float], components: Sequence[int], *,
                   config: EvaluateConfig | dict[str, Any] | None = None) -> dict[str, Any]:
    """Cross-validated accuracy over (gamma, k) on the training split only.

    For each gamma and each of ``config.cv_folds`` stratified folds, a clone
    of ``estimator`` (a KernelPCA, fitted or not: only its parameters are
    used) is fitted on the fold's training part with ``n_components =
    max(components)`` and transforms the fold's validation part; the linear
    classifier is scored at every ``k`` (columns nest, one fit per fold and
    gamma). Held-out test rows of the run are never used.

    Parameters
    ----------
    X_train : ndarray of shape (m, d)
        Training rows (the stage passes a seeded subsample of at most
        ``cv_max_rows``).
    y_train : ndarray of shape (m,)
    estimator : KernelPCA
    gammas : sequence of float
    components : sequence of int

    Returns
    -------
    dict with ``gamma`` (list), ``n_components`` (list), ``cv_accuracy`` and
    ``cv_std`` (len(gamma) x len(n_components) nested lists, None where a fit
    kept fewer components), ``best`` ({gamma, n_components, cv_accuracy}),
    ``cv_folds``, ``n_rows``.
    """
    from sklearn.base import clone
    from sklearn.model_selection import StratifiedKFold

    cfg = _as_config(config)
    X = np.asarray(X_train, dtype=np.float64)
    y = np.asarray(y_train, dtype=np.int64)
    counts = np.bincount(y)
    folds = min(cfg.cv_folds, int(counts[counts > 0].min()))
    if folds < 2:
        raise EvaluationError("gamma cross-validation needs at least 2 training rows of every "
                              "class in the subsample; raise evaluate.cv_max_rows")
    ks = sorted(set(int(k) for k in components))
    fold_size = X.shape[0] - math.ceil(X.shape[0] / folds)
    ks = [k for k in ks if k < fold_size] or [max(1, fold_size - 1)]
    kmax = ks[-1]
    skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=cfg.random_state)
    splits = list(skf.split(X, y))
    n_cls = int(y.max()) + 1
    acc = np.full((len(gammas), len(ks), folds), np.nan)
    dropped = 0
    kind = "logistic" if cfg.classifier in ("auto", "sgd") else cfg.classifier
    # One BLAS thread: the fits are small (<= cv_max_rows rows) and a
    # multi-threaded eigh on a busy 2-core machine was measured 10-60x slower
    # (threads spinning for cores) than a single-threaded one (0.13 s, n=900).
    with threadpool_limits(1, user_api="blas"):
        for gi, g in enumerate(gammas):
            for fi, (tr, va) in enumerate(splits):
                est = clone(estimator).set_params(gamma=float(g), n_components=kmax)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    Etr = np.asarray(est.fit_transform(X[tr]))
                    Eva = np.asarray(est.transform(X[va]))
                dropped += sum("DroppedComponents" in type(w.message).__name__ for w in caught)
                kk = [k for k in ks if k <= Etr.shape[1]]
                if not kk:
                    continue
                conf, _ = _confusions(Etr, y[tr], Eva, y[va], kk, n_cls, cfg, kind)
                for k in kk:
                    acc[gi, ks.index(k), fi] = np.trace(conf[k]) / conf[k].sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN cells
        mean = np.nanmean(acc, axis=2)
        std = np.nanstd(acc, axis=2)
    mean[np.isnan(acc).any(axis=2)] = np.nan
    if np.all(np.isnan(mean)):
        raise EvaluationError("gamma cross-validation produced no usable fit: every gamma "
                              "kept fewer components than asked")
    bi, bk = np.unravel_index(int(np.nanargmax(mean)), mean.shape)

    def _lists(a: np.ndarray) -> list[list[float | None]]:
        return [[None if np.isnan(v) else float(v) for v in row] for row in a]

    return {"gamma": [float(g) for g in gammas], "n_components": ks,
            "cv_accuracy": _lists(mean), "cv_std": _lists(std),
            "best": {"gamma": float(gammas[bi]), "n_components": int(ks[bk]),
                     "cv_accuracy": float(mean[bi, bk])},
            "cv_folds": folds, "n_rows": int(X.shape[0]), "dropped_component_warnings": dropped,
            "classifier": kind}


# ----------------------------------------------------------------- the stage
def _location(out_dir: Any) -> Location:
    if isinstance(out_dir, Location):
        return out_dir
    return Location(str(out_dir))


def _sample_indices(n: int, m: int, seed: int, within: np.ndarray | None = None) -> np.ndarray:
    """Sorted seeded sample of at most ``m`` row indices (of ``within`` if given)."""
    pool = np.arange(n) if within is None else np.asarray(within)
    if pool.size <= m:
        return pool
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(pool, size=m, replace=False))


def _rows(z: Any, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` (sorted) of a zarr array, reading only the chunks that hold them."""
    if idx.size == 0:
        return np.empty((0,) + tuple(z.shape[1:]), dtype=z.dtype)
    return np.asarray(z.oindex[(idx,) + (slice(None),) * (len(z.shape) - 1)])


def _skipped(reason: str) -> dict[str, Any]:
    logger.info("evaluate: skipped (%s)", reason)
    return {"schema_version": METRICS_SCHEMA_VERSION, "status": "skipped", "reason": reason}


def _quantiles(x: np.ndarray) -> dict[str, float] | None:
    if x.size == 0:
        return None
    qs = {"min": 0.0, "p05": 0.05, "p25": 0.25, "median": 0.5, "p75": 0.75, "p95": 0.95,
          "p99": 0.99, "max": 1.0}
    return {name: float(np.quantile(x, q)) for name, q in qs.items()}


def evaluate_run(out_dir: Any, config: EvaluateConfig | dict[str, Any] | None = None, *,
                 write_report: bool | None = None, title: str | None = None,
                 description: str | None = None) -> dict[str, Any]:
    """The evaluate stage: classify a run's embedding, write ``report/metrics.json``.

    Reads (docs/artifacts.md) ``<out>/embedding``, ``<out>/labels`` (with
    ``attrs["classes"]``), ``<out>/split`` (1 = training row),
    ``<out>/spectrum/*``, ``<out>/model`` (for ``score_samples`` and the
    gamma sweep) and ``<out>/work/ingest.zarr/X`` (for the linear PCA
    baseline). Writes ``<out>/report/metrics.json`` atomically and, unless
    ``config.report`` (or ``write_report``) is false, the plots and
    ``report.md`` (:func:`pipeline.report.write_report`).

    Idempotent: re-running overwrites the report with the same numbers
    (every random choice is seeded by ``config.random_state``).

    Parameters
    ----------
    out_dir : str, Path or Location
        The run folder (local path or fsspec URL).
    config : EvaluateConfig or dict, optional
    write_report : bool, optional
        Override ``config.report``.
    title, description : str, optional
        Heading and a sentence about the data for report.md (e.g. the input path).

    Returns
    -------
    metrics : dict
        ``{"status": "skipped", "reason": ...}`` when evaluation is off, or
        'auto' and the run has no labels or no held-out rows (nothing is
        written then); otherwise the metrics written to metrics.json
        (:data:`METRICS_SCHEMA`).

    Raises
    ------
    EvaluationError
        ``enabled`` is true but labels or the split are missing, or the arrays
        disagree in length, or a side of the split is empty.
    """
    import kpca_dask

    cfg = _as_config(config)
    if cfg.enabled is False:
        return _skipped("evaluate.enabled is false")
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    loc = _location(out_dir)
    try:
        root = loc.open_group("r")
    except Exception as exc:
        raise EvaluationError(f"{loc} is not a readable run folder (zarr group): {exc}") from exc
    # Membership tests look names up directly; listing the group would trip over
    # the plain work/ folder beside the arrays.
    if "embedding" not in root:
        raise EvaluationError(f"{loc} has no 'embedding' array; run the pipeline's project "
                              "stage before evaluate")
    if "labels" not in root:
        if cfg.enabled == "auto":
            return _skipped("the input has no label column")
        raise EvaluationError(f"evaluate.enabled is true but {loc} has no 'labels' array; set "
                              "input.label_column, or set evaluate.enabled to 'auto' or false")
    if "split" not in root:
        if cfg.enabled == "auto":
            return _skipped("the run holds out no rows (no 'split' array)")
        raise EvaluationError(f"{loc} has no 'split' array: held-out evaluation needs rows "
                              "held out before fitting (the pipeline writes <out>/split when "
                              "evaluation is enabled and labels exist)")

    z_emb, z_lab, z_split = root["embedding"], root["labels"], root["split"]
    n, k = int(z_emb.shape[0]), int(z_emb.shape[1])
    classes = [str(c) for c in z_lab.attrs.get("classes", [])]
    if z_lab.shape != (n,) or z_split.shape != (n,):
        raise EvaluationError(f"embedding has {n} rows but labels has shape {z_lab.shape} and "
                              f"split {z_split.shape}; the run folder is inconsistent (re-run "
                              "the project stage)")
    split = np.asarray(z_split[...]).astype(bool)  # 1 byte per row
    train_idx, test_idx = np.flatnonzero(split), np.flatnonzero(~split)
    if train_idx.size == 0 or test_idx.size == 0:
        raise EvaluationError(f"the split holds {train_idx.size} training and {test_idx.size} "
                              "held-out rows; both must be non-empty (check "
                              "evaluate.test_fraction)")
    emb = da.from_zarr(z_emb)
    labels = da.from_zarr(z_lab).rechunk({0: emb.chunks[0]})
    if not classes:
        top = int(labels.max().compute())
        classes = [str(i) for i in range(top + 1)]
    n_cls = len(classes)
    kind = resolve_classifier(cfg.classifier, int(train_idx.size), cfg.sgd_min_rows)
    ks, skipped = resolve_sweep(cfg.sweep_components, k)
    logger.info("evaluate: %d training / %d held-out rows, k=%d, classifier=%s, sweep=%s",
                train_idx.size, test_idx.size, k, kind, ks)

    # Kernel PCA embedding: training rows vs held-out rows (embedded by transform).
    t = time.perf_counter()
    E_tr, E_te = emb[split], emb[~split]
    y_tr, y_te = labels[split], labels[~split]
    conf_k, info_k = _confusions(E_tr, y_tr, E_te, y_te, ks, n_cls, cfg, kind)
    timings["kpca_classifier"] = time.perf_counter() - t

    # Linear PCA baseline on the same rows, same classifier, same k (capped at d).
    t = time.perf_counter()
    ingest_loc = loc.child("work", "ingest.zarr")
    try:
        z_X = ingest_loc.open_group("r")["X"]
    except Exception as exc:
        raise EvaluationError(f"the linear PCA baseline reads the ingested features from "
                              f"{ingest_loc}/X, which cannot be opened ({exc}); keep the work "
                              "folder until evaluate has run") from exc
    if int(z_X.shape[0]) != n:
        raise EvaluationError(f"{ingest_loc}/X has {z_X.shape[0]} rows but the embedding has "
                              f"{n}; the run folder is inconsistent")
    X = da.from_zarr(z_X)
    d = int(X.shape[1])
    P_tr, P_te, pca_info = linear_pca_baseline(
        X[split], X[~split], k, random_state=cfg.random_state, memory_mb=cfg.baseline_memory_mb)
    k_pca = pca_info["n_components"]
    ks_pca = [x for x in ks if x <= k_pca]
    if k_pca not in ks_pca:
        ks_pca.append(k_pca)
    conf_p, info_p = _confusions(P_tr, y_tr, P_te, y_te, ks_pca, n_cls, cfg, kind)
    timings["pca_baseline"] = time.perf_counter() - t

    kpca_m = classification_metrics(conf_k[k], classes)
    kpca_m.update(n_components=k, converged=info_k["converged"])
    pca_m = classification_metrics(conf_p[k_pca], classes)
    pca_m.update(n_components=k_pca, converged=info_p["converged"], method=pca_info["method"],
                 explained_variance_ratio=pca_info["explained_variance_ratio"])
    margin = (kpca_m["accuracy"] - pca_m["accuracy"]
              if kpca_m["accuracy"] is not None and pca_m["accuracy"] is not None else None)

    def _acc(conf: dict[int, np.ndarray], x: int) -> float | None:
        if x not in conf:
            return None
        c = conf[x]
        return float(np.trace(c) / c.sum()) if c.sum() else None

    sweep = {"n_components": ks, "kpca_accuracy": [_acc(conf_k, x) for x in ks],
             "pca_accuracy": [_acc(conf_p, x) for x in ks], "skipped": skipped}
    if k_pca < k:
        sweep["pca_max_components"] = k_pca

    # The model: kernel description, novelty scores, optional gamma sweep.
    t = time.perf_counter()
    model_path = loc.child("model")
    model = kpca_dask.load(str(model_path.local_path) if model_path.is_local else model_path.url)
    kernel_desc = model.kernel_.to_dict() if hasattr(model.kernel_, "to_dict") else {}
    rng_seed = cfg.random_state
    nov_test_idx = _sample_indices(n, cfg.max_novelty_points, rng_seed + 1, test_idx)
    nov_train_idx = _sample_indices(n, cfg.max_novelty_points, rng_seed + 2, train_idx)
    nov_test = np.asarray(model.score_samples(_rows(z_X, nov_test_idx)), dtype=np.float64)
    nov_train = np.asarray(model.score_samples(_rows(z_X, nov_train_idx)), dtype=np.float64)
    threshold = float(np.quantile(nov_train, 0.99)) if nov_train.size else None
    novelty = {
        "n_test_scored": int(nov_test.size), "n_train_scored": int(nov_train.size),
        "test_quantiles": _quantiles(nov_test), "train_quantiles": _quantiles(nov_train),
        "train_p99": threshold,
        "test_fraction_above_train_p99": (float(np.mean(nov_test > threshold))
                                          if threshold is not None and nov_test.size else None),
    }
    timings["novelty"] = time.perf_counter() - t

    gamma_result: dict[str, Any] | None = None
    if cfg.gamma_sweep is not None:
        t = time.perf_counter()
        kname = getattr(model, "kernel", None)
        if not (isinstance(kname, str) and kname in GAMMA_KERNELS):
            gamma_result = {"skipped": f"kernel {kname!r} has no gamma to tune"}
            logger.warning("evaluate: gamma_sweep skipped: kernel %r has no gamma", kname)
        else:
            gammas = (sorted(float(model.gamma_) * f for f in AUTO_GAMMA_FACTORS)
                      if cfg.gamma_sweep == "auto" else list(cfg.gamma_sweep))
            cv_idx = _sample_indices(n, cfg.cv_max_rows, rng_seed + 3, train_idx)
            y_all = np.asarray(z_lab.oindex[cv_idx], dtype=np.int64)
            gamma_result = gamma_cv_sweep(_rows(z_X, cv_idx), y_all, model, gammas, ks,
                                          config=cfg)
            gamma_result["fitted_gamma"] = float(model.gamma_)
        timings["gamma_sweep"] = time.perf_counter() - t

    if "spectrum/eigenvalues" in root and "spectrum/explained_variance_ratio" in root:
        ev = np.asarray(root["spectrum/eigenvalues"][...], dtype=np.float64)
        evr = np.asarray(root["spectrum/explained_variance_ratio"][...], dtype=np.float64)
    else:  # the model holds the same numbers
        ev = np.asarray(model.eigenvalues_, dtype=np.float64)
        evr = np.asarray(model.explained_variance_ratio_, dtype=np.float64)

    class_counts_train = da.bincount(y_tr.astype(np.int64), minlength=n_cls).compute()
    metrics: dict[str, Any] = {
        "schema_version": METRICS_SCHEMA_VERSION,
        "status": "complete",
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "data": {
            "n_rows": n, "n_features": d, "n_train": int(train_idx.size),
            "n_test": int(test_idx.size), "classes": classes,
            "train_class_counts": [int(c) for c in class_counts_train],
            "test_class_counts": [int(sum(r)) for r in conf_k[k]],
        },
        "model": {
            "kernel": kernel_desc, "n_components": k,
            "eigen_solver": getattr(model, "eigen_solver_", None),
            "gamma": getattr(model, "gamma_", None),
        },
        "classifier": {"name": kind, "C": cfg.C, "standardize": cfg.standardize,
                       "max_iter": cfg.max_iter if kind != "sgd" else None,
                       "sgd_epochs": cfg.sgd_epochs if kind == "sgd" else None},
        # headline numbers as top-level scalars (the manifest keeps scalars)
        "n_components": k,
        "kpca_accuracy": kpca_m["accuracy"],
        "pca_accuracy": pca_m["accuracy"],
        "margin": margin,
        "kpca": kpca_m,
        "pca": pca_m,
        "sweep": sweep,
        "gamma_sweep": gamma_result,
        "novelty": novelty,
        "spectrum": {"eigenvalues": ev.tolist(), "explained_variance_ratio": evr.tolist()},
        "config": cfg.model_dump(mode="json"),
        "timings": timings,
    }
    logger.info("evaluate: kernel PCA accuracy %.4f vs linear PCA %.4f at k=%d (margin %+.4f)",
                kpca_m["accuracy"], pca_m["accuracy"], k, margin or 0.0)

    report_loc = loc.child("report")
    do_report = cfg.report if write_report is None else write_report
    if do_report:
        from .report import write_report as _write_report  # matplotlib only when drawing

        t = time.perf_counter()
        sc_idx = _sample_indices(n, cfg.max_scatter_points, rng_seed + 4)
        sc_emb = np.asarray(z_emb.oindex[sc_idx, : min(2, k)], dtype=np.float64)
        sc_lab = np.asarray(z_lab.oindex[sc_idx], dtype=np.int64)
        metrics["timings"]["total"] = time.perf_counter() - t_start
        _write_report(loc, metrics, scatter=(sc_emb, sc_lab),
                      novelty=(nov_test, nov_train), title=title, description=description)
        metrics["timings"]["report"] = time.perf_counter() - t
    metrics["timings"]["total"] = time.perf_counter() - t_start
    atomic_write_json(report_loc.child("metrics.json"), metrics)
    return metrics


# --------------------------------------------------------------- metrics schema
_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_PROB = {"type": "number", "minimum": 0, "maximum": 1}
_PROB_OR_NULL = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
_CLASSIFICATION = {
    "type": "object",
    "required": ["accuracy", "balanced_accuracy", "macro_f1", "n_test", "n_components",
                 "per_class", "confusion_matrix", "converged"],
    "properties": {
        "accuracy": _PROB,
        "balanced_accuracy": _PROB_OR_NULL,
        "macro_f1": _PROB_OR_NULL,
        "n_test": {"type": "integer", "minimum": 1},
        "n_components": {"type": "integer", "minimum": 1},
        "converged": {"type": "boolean"},
        "per_class": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["class", "precision", "recall", "f1", "support"],
                "properties": {"class": {"type": "string"}, "precision": _PROB_OR_NULL,
                               "recall": _PROB_OR_NULL, "f1": _PROB_OR_NULL,
                               "support": {"type": "integer", "minimum": 0}},
                "additionalProperties": False,
            },
        },
        "confusion_matrix": {"type": "array",
                             "items": {"type": "array",
                                       "items": {"type": "integer", "minimum": 0}}},
    },
}

#: JSON Schema (draft 2020-12) of a complete ``report/metrics.json``.
METRICS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "kpca-dask evaluate metrics",
    "type": "object",
    "required": ["schema_version", "status", "created", "data", "model", "classifier",
                 "n_components", "kpca_accuracy", "pca_accuracy", "margin", "kpca", "pca",
                 "sweep", "gamma_sweep", "novelty", "spectrum", "config", "timings"],
    "properties": {
        "schema_version": {"const": METRICS_SCHEMA_VERSION},
        "status": {"const": "complete"},
        "created": {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"},
        "data": {
            "type": "object",
            "required": ["n_rows", "n_features", "n_train", "n_test", "classes",
                         "test_class_counts"],
            "properties": {
                "n_rows": {"type": "integer", "minimum": 2},
                "n_features": {"type": "integer", "minimum": 1},
                "n_train": {"type": "integer", "minimum": 1},
                "n_test": {"type": "integer", "minimum": 1},
                "classes": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "train_class_counts": {"type": ["array", "null"], "items": {"type": "integer"}},
                "test_class_counts": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "model": {"type": "object", "required": ["kernel", "n_components"],
                  "properties": {"kernel": {"type": "object"},
                                 "n_components": {"type": "integer", "minimum": 1}}},
        "classifier": {"type": "object", "required": ["name"],
                       "properties": {"name": {"enum": ["logistic", "linear_svc", "sgd"]}}},
        "kpca": _CLASSIFICATION,
        "pca": {"allOf": [_CLASSIFICATION,
                          {"type": "object", "required": ["method"],
                           "properties": {"method": {"enum": ["pca", "incremental_pca"]}}}]},
        "n_components": {"type": "integer", "minimum": 1},
        "kpca_accuracy": _PROB,
        "pca_accuracy": _PROB,
        "margin": {"type": "number", "minimum": -1, "maximum": 1},
        "sweep": {
            "type": "object",
            "required": ["n_components", "kpca_accuracy", "pca_accuracy", "skipped"],
            "properties": {
                "n_components": {"type": "array", "minItems": 1,
                                 "items": {"type": "integer", "minimum": 1}},
                "kpca_accuracy": {"type": "array", "items": _PROB},
                "pca_accuracy": {"type": "array", "items": _PROB_OR_NULL},
                "skipped": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "gamma_sweep": {"oneOf": [
            {"type": "null"},
            {"type": "object", "required": ["skipped"]},
            {"type": "object",
             "required": ["gamma", "n_components", "cv_accuracy", "best", "cv_folds", "n_rows"],
             "properties": {"gamma": {"type": "array", "items": {"type": "number",
                                                                  "exclusiveMinimum": 0}},
                            "cv_accuracy": {"type": "array",
                                            "items": {"type": "array", "items": _PROB_OR_NULL}},
                            "best": {"type": "object",
                                     "required": ["gamma", "n_components", "cv_accuracy"]}}},
        ]},
        "novelty": {"type": "object",
                    "required": ["n_test_scored", "n_train_scored", "test_quantiles",
                                 "train_quantiles"]},
        "spectrum": {"type": "object",
                     "required": ["eigenvalues", "explained_variance_ratio"],
                     "properties": {"eigenvalues": {"type": "array", "items": _NUM},
                                    "explained_variance_ratio": {"type": "array",
                                                                 "items": _NUM}}},
        "config": {"type": "object"},
        "timings": {"type": "object", "additionalProperties": _NUM},
    },
}
