"""The pipeline's error taxonomy (pipeline/errors.py): who can fix a failure, and whether
running again helps. The CLI's exit codes and the flow's retries both follow it."""

from __future__ import annotations

import errno

import pytest
from distributed.comm.core import CommClosedError
from distributed.scheduler import KilledWorker
from pydantic import ValidationError

from kpca_dask.exceptions import InvalidParameterError, UnsafeRemovalError
from pipeline.config import ChunkConfig, ConfigError
from pipeline.data.ingest import InputError
from pipeline.data.validate import PrestartError
from pipeline.embed.denoise import DenoiseError
from pipeline.errors import (
    InternalError,
    PipelineError,
    RunCorruptError,
    RunExistsError,
    TransientError,
    UserError,
    is_transient,
    is_user_error,
)
from pipeline.evaluate import EvaluationError
from pipeline.model.kernel_store import KernelStoreError
from pipeline.model.solve import SolveError
from pipeline.output.export import RunError
from pipeline.output.lock import OutputLockedError
from pipeline.output.publish import TransformOutputError, TransformOutputExistsError
from pipeline.output.store import NotLocalError, PathEscapeError
from pipeline.runtime.cluster import ClusterError


def _validation_error() -> ValidationError:
    with pytest.raises(ValidationError) as info:
        ChunkConfig(target_chunk_mb=-1)
    return info.value


USER = [
    ConfigError("x"),
    InputError("x"),
    RunError("x"),
    RunExistsError("x"),
    RunCorruptError("x"),
    DenoiseError("x"),
    EvaluationError("x"),
    SolveError("x"),
    TransformOutputError("x"),
    TransformOutputExistsError("x"),
    PrestartError([]),
    PathEscapeError("x"),
    KernelStoreError("x"),
    ClusterError("x"),
    OutputLockedError("x"),
    UserError("x"),
    InvalidParameterError("x"),
    UnsafeRemovalError("x"),
    _validation_error(),
    FileNotFoundError(errno.ENOENT, "no such file", "in.csv"),
    PermissionError("x"),
    IsADirectoryError("x"),
    NotADirectoryError("x"),
]
TRANSIENT = [
    TransientError("x"),
    ConnectionResetError("peer"),
    TimeoutError("slow"),
    CommClosedError("closed"),
    OSError(errno.EIO, "I/O error"),
    KilledWorker("('chunk-1', 0)", "tcp://w:1", 3),
]
BUGS = [
    InternalError("x"),
    NotLocalError("s3://b/k is not a local path"),
    ValueError("x"),
    TypeError("x"),
    KeyError("x"),
    AttributeError("x"),
    ZeroDivisionError(),
    IndexError("x"),
    RuntimeError("x"),
    AssertionError("x"),
    MemoryError(),
]


@pytest.mark.parametrize("exc", USER, ids=lambda e: type(e).__name__)
def test_user_errors_are_never_retried(exc):
    assert is_user_error(exc) and not is_transient(exc)


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_transient_errors_are_retried(exc):
    assert is_transient(exc) and not is_user_error(exc)


@pytest.mark.parametrize("exc", BUGS, ids=lambda e: type(e).__name__)
def test_unexpected_exceptions_are_neither(exc):
    """A bare ValueError is a bug until a pipeline error class says otherwise."""
    assert not is_user_error(exc) and not is_transient(exc)


def test_pipeline_errors_keep_their_builtin_bases():
    """``except ValueError`` / ``except RuntimeError`` written before the taxonomy still
    catch what they caught."""
    for cls in (
        ConfigError,
        InputError,
        RunError,
        DenoiseError,
        EvaluationError,
        SolveError,
        TransformOutputError,
        PathEscapeError,
        PrestartError,
    ):
        assert issubclass(cls, UserError) and issubclass(cls, ValueError), cls
    for cls in (ClusterError, KernelStoreError):
        assert issubclass(cls, UserError) and issubclass(cls, RuntimeError), cls
    assert issubclass(RunExistsError, FileExistsError)
    assert issubclass(OutputLockedError, FileExistsError)
    assert issubclass(TransformOutputExistsError, FileExistsError)
    assert issubclass(NotLocalError, InternalError) and issubclass(NotLocalError, ValueError)
    assert issubclass(UserError, PipelineError) and issubclass(TransientError, PipelineError)


def test_every_pipeline_error_class_has_a_kind():
    """Each exception class the pipeline defines is a UserError or a TransientError."""
    import importlib
    import inspect
    import pkgutil

    import pipeline

    kinds = (UserError, TransientError, InternalError)
    loose = []
    modules = list(pkgutil.walk_packages(pipeline.__path__, "pipeline."))
    assert {"pipeline.data.readers.base", "pipeline.data.checks.findings"} <= {
        m.name for m in modules
    }
    for (
        mod
    ) in modules:  # subpackages' modules too (pipeline/data/readers/, pipeline/data/checks/)
        m = importlib.import_module(mod.name)
        for name, obj in vars(m).items():
            ours = (
                inspect.isclass(obj)
                and issubclass(obj, Exception)
                and obj.__module__ == m.__name__
                and not name.startswith("_")
            )
            if ours and obj not in (PipelineError, *kinds) and not issubclass(obj, kinds):
                loose.append(f"{m.__name__}.{name}")
    assert not loose, (
        f"derive these from pipeline.errors.UserError, TransientError or InternalError: {loose}"
    )
