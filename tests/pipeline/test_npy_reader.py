"""A local NPY input read by many threads at once: its header is parsed once, on the client.

``np.load`` in every chunk's task parsed the header with ``ast.literal_eval``; CPython 3.11
can fail that with ``SystemError: AST constructor recursion depth mismatch`` when threads
parse at once (python/cpython#106905; it failed a CI run of the threaded scheduler here).
"""

from __future__ import annotations

import ast

import dask
import numpy as np
import pytest

from pipeline.config import ChunkConfig, InputConfig
from pipeline.data.readers.base import InputError
from pipeline.data.readers.npy import read_npy
from pipeline.output import Location


def _read(path, target_mb=0.01):
    chunks = ChunkConfig(target_chunk_mb=target_mb)
    return read_npy(InputConfig(path=str(path)), Location.at(str(path)), chunks)


@pytest.mark.parametrize("order", ["C", "F"])
def test_the_rows_are_read_by_many_threads_without_parsing_the_header(
    tmp_path, monkeypatch, order
):
    X = np.random.default_rng(0).standard_normal((5000, 7))
    path = tmp_path / "x.npy"
    np.save(path, np.asarray(X, order=order))
    src = _read(path)  # the header parsed here, once
    assert src.X.numblocks[0] > 20

    def no_parse(*a, **k):
        raise AssertionError("a chunk's task parsed the NPY header")

    monkeypatch.setattr(ast, "literal_eval", no_parse)
    with dask.config.set(scheduler="threads", num_workers=8):
        got = src.X.compute()
    np.testing.assert_array_equal(got, X)


def test_a_file_rewritten_after_its_header_was_read_is_refused(tmp_path):
    """The same bytes, another shape (its transpose): the size alone would not tell."""
    X = np.random.default_rng(1).standard_normal((400, 5))
    path = tmp_path / "x.npy"
    np.save(path, X)
    src = _read(path)
    np.save(path, X.T.copy())
    with pytest.raises(InputError, match="changed while it was being read"):
        src.X.compute(scheduler="sync")


def test_an_empty_file_reads_as_no_rows(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((0, 3)))
    assert _read(path).X.compute(scheduler="sync").shape == (0, 3)
