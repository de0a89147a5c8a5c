"""The pipeline end to end on real stores in temporary folders."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pyarrow.parquet
import pytest
import zarr

import kpca_dask
from kpca_dask import KernelPCA
from kpca_dask.kernels import RBFKernel
from pipeline.config import ConfigError, load_config
from pipeline.data.ingest import InputError, ingest
from pipeline.model.kernel_store import KernelBlockReader, build_kernel_store
from pipeline.output.export import (
    RunCorruptError,
    RunExistsError,
    RunIncompleteError,
    verify_run,
)
from pipeline.output.store import Location
from pipeline.runner.run import run_pipeline
from tests.published import rewrite_manifests, version_dir

RNG = np.random.default_rng(0)
N, D = 900, 5
X = RNG.standard_normal((N, D)) + np.repeat(RNG.standard_normal((3, D)) * 3, N // 3, axis=0)
LABELS = np.repeat(["a", "b", "c"], N // 3)


def write_inputs(folder):
    cols = [f"f{i}" for i in range(D)]
    df = pd.DataFrame(X, columns=cols)
    df.insert(0, "row_id", np.arange(N) + 1000)
    df["species"] = LABELS
    df["comment"] = "text is ignored"
    paths = {
        "csv": folder / "data.csv",
        "parquet": folder / "data.parquet",
        "npy": folder / "data.npy",
    }
    df.to_csv(paths["csv"], index=False)
    df.to_parquet(paths["parquet"], index=False)
    np.save(paths["npy"], X)
    return paths


def config(tmp_path, path, **over):
    cfg = {
        "input": {"path": str(path)},
        "preprocess": {"scale": "none"},  # compared with the estimator on the raw rows
        "kernel": {"name": "rbf", "gamma": 0.1},
        "solver": {
            "n_components": 4,
            "eigen_solver": "randomized",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.01, "block_rows": 128},  # several chunks and blocks
        "output": {"path": str(tmp_path / "out"), "parquet": True},
        "evaluate": {"enabled": False},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    return load_config(cfg)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return write_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def reference():
    return KernelPCA(
        4, kernel="rbf", gamma=0.1, eigen_solver="randomized", random_state=0, chunk_size=128
    ).fit(X)


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npy"])
def test_each_input_format_gives_the_in_memory_result(tmp_path, inputs, reference, fmt):
    """CSV, Parquet and NPY inputs end in the same artifacts as the in-memory estimator."""
    tab = (
        {"columns": [f"f{i}" for i in range(D)], "id_column": "row_id"} if fmt != "npy" else {}
    )
    cfg = config(tmp_path, inputs[fmt], input=tab)
    summary = run_pipeline(cfg)
    out = tmp_path / "out"
    manifest = verify_run(out)
    assert manifest["status"] == "complete" == summary.manifest["status"]
    assert manifest["input"]["n_rows"] == N and manifest["input"]["n_features"] == D
    g = zarr.open_group(str(version_dir(out)), mode="r")
    np.testing.assert_allclose(
        g["spectrum/eigenvalues"][...], reference.eigenvalues_, rtol=1e-9
    )
    emb = g["embedding"][...]
    np.testing.assert_allclose(emb, reference.fit_transform(X), atol=1e-9)
    # the saved model transforms the training rows into the stored embedding (to the
    # accuracy its residuals certify)
    model = kpca_dask.load(version_dir(out) / "model")
    # |transform(x_i) - v_i sqrt(lambda)| <= ||Kc v - lambda v|| / sqrt(lambda)
    #                                     = residual * sqrt(lambda), per component
    bound = model.residuals_ * np.sqrt(model.eigenvalues_) * (1 + 1e-6) + 1e-12
    assert np.all(np.abs(model.transform(X) - emb).max(axis=0) <= bound)
    pq = pd.read_parquet(version_dir(out) / "embedding.parquet")
    assert list(pq.columns[:1]) == ["id"] and "kernelpca3" in pq.columns
    if fmt != "npy":
        np.testing.assert_array_equal(np.sort(pq["id"].to_numpy()), np.arange(N) + 1000)
    assert len(pq) == N


def test_materialised_kernel_matches_recomputed(tmp_path, inputs, reference):
    """kernel_store.materialize = always: same spectrum and embedding, blocks counted."""
    cfg = config(tmp_path, inputs["npy"], kernel_store={"materialize": "always"})
    summary = run_pipeline(cfg)
    ks = summary.manifest["kernel_store"]
    assert ks["materialized"] and ks["computed"] == ks["n_blocks"] == 8 * 9 // 2
    g = zarr.open_group(str(version_dir(tmp_path / "out")), mode="r")
    np.testing.assert_allclose(
        g["spectrum/eigenvalues"][...], reference.eigenvalues_, rtol=1e-9
    )
    np.testing.assert_allclose(g["embedding"][...], reference.fit_transform(X), atol=1e-9)
    K = zarr.open_group(str(tmp_path / "out/work/kernel.zarr"), mode="r")["K"]
    np.testing.assert_allclose(
        K[:128, 128:256], RBFKernel(0.1)(X[:128], X[128:256]), rtol=1e-12
    )
    assert not np.any(K[128:256, :128])  # lower blocks are never computed


class FlakyRBF(RBFKernel):
    """An rbf kernel whose evaluation fails once, at the ``fail_at``-th block."""

    calls = 0

    def __init__(self, gamma, fail_at):
        super().__init__(gamma)
        self.fail_at = fail_at

    def evaluate(self, A, B, out=None):
        FlakyRBF.calls += 1
        if FlakyRBF.calls == self.fail_at:
            raise OSError("injected failure: worker lost its disk")
        return super().evaluate(A, B, out)


def test_kernel_build_resumes_after_a_failure(tmp_path):
    """A block fails part way; the re-run keeps (after verifying) the finished blocks,
    computes only the rest, and the store is identical to an undisturbed build."""
    import dask

    Xd = da.from_array(X, chunks=(128, -1))
    fp = "blake2b:test"
    clean = Location(str(tmp_path / "clean.zarr"))
    with dask.config.set(scheduler="synchronous"):  # deterministic order for the count
        build_kernel_store(Xd, RBFKernel(0.1), "float64", clean, input_fingerprint=fp)
        store = Location(str(tmp_path / "k.zarr"))
        FlakyRBF.calls = 0
        with pytest.raises(OSError, match="injected failure"):
            build_kernel_store(
                Xd, FlakyRBF(0.1, fail_at=12), "float64", store, input_fingerprint=fp
            )
        done = zarr.open_group(str(tmp_path / "k.zarr"), mode="r")["done"][...]
        finished = int(np.count_nonzero(done))
        assert 0 < finished < 36
        res = build_kernel_store(Xd, RBFKernel(0.1), "float64", store, input_fingerprint=fp)
    assert res.skipped == finished and res.computed == 36 - finished
    a = zarr.open_group(str(tmp_path / "k.zarr"), mode="r")
    b = zarr.open_group(str(tmp_path / "clean.zarr"), mode="r")
    np.testing.assert_array_equal(a["K"][...], b["K"][...])
    np.testing.assert_array_equal(a["done"][...], b["done"][...])
    # a corrupted block is detected by the reader and rewritten by a re-run
    z = zarr.open_group(str(tmp_path / "k.zarr"), mode="r+")["K"]
    z[0:128, 0:128] = 0.0
    with pytest.raises(Exception, match="checksum"):
        KernelBlockReader(str(tmp_path / "k.zarr"))(0, 0)
    res = build_kernel_store(Xd, RBFKernel(0.1), "float64", store, input_fingerprint=fp)
    assert res.computed == 1 and res.skipped == 35
    np.testing.assert_array_equal(a["K"][...], b["K"][...])


def test_kernel_reader_reads_verified_blocks_and_refuses_a_rebuilt_store(tmp_path):
    from pipeline.model.kernel_store import KernelStoreError

    Xd = da.from_array(X, chunks=(128, -1))
    store = Location(str(tmp_path / "k.zarr"))
    with pytest.raises(KernelStoreError, match="no kernel store"):
        KernelBlockReader(store.url)
    build_kernel_store(Xd, RBFKernel(0.1), "float32", store, input_fingerprint="blake2b:a")
    reader = KernelBlockReader(store.url)
    K = RBFKernel(0.1)(X[:128], X[128:256], dtype=np.float32)
    # whole blocks are read raw (the chunk's bytes in place), edge blocks through zarr
    from pipeline.model.kernel_store import _raw_layout

    assert _raw_layout(reader._open().K, 128)
    np.testing.assert_array_equal(reader(0, 1), K)
    np.testing.assert_array_equal(reader(0, 1), K)  # from the handles opened once
    # the build writes whole blocks' chunk files itself: zarr reads them (checking their
    # CRC-32C) as its own, and no temporary file is left behind
    np.testing.assert_array_equal(zarr.open_group(store.url, mode="r")["K"][0:128, 128:256], K)
    assert not list((tmp_path / "k.zarr").rglob("*.partial"))
    # the marker is cached per process while the chunk file stays the same: a chunk
    # replaced afterwards is checked against the marker on disk, not the cached one
    g = zarr.open_group(store.url, mode="r+")
    g["K"][0:128, 128:256] = K + 1
    with pytest.raises(KernelStoreError, match="checksum"):
        reader(0, 1)
    from pipeline.model.kernel_store import _DONE, _crc

    g["done"][0, 1] = _DONE | np.uint64(_crc(K + 1))  # as a resumed build rewrites a block
    np.testing.assert_array_equal(reader(0, 1), K + 1)
    g["K"][0:128, 128:256] = K
    g["done"][0, 1] = _DONE | np.uint64(_crc(K))
    nb = -(-X.shape[0] // 128)
    assert X.shape[0] % 128  # the last block row is an edge block
    np.testing.assert_array_equal(
        reader(0, nb - 1), RBFKernel(0.1)(X[:128], X[(nb - 1) * 128 :], dtype=np.float32)
    )
    # another input: the store is rebuilt under a new build id, and a reader made for
    # the old build refuses it rather than mixing two builds' blocks
    build_kernel_store(Xd, RBFKernel(0.1), "float32", store, input_fingerprint="blake2b:b")
    stale = KernelBlockReader(store.url, build_id="an-earlier-build")
    with pytest.raises(KernelStoreError, match="rebuilt"):
        stale(0, 1)
    np.testing.assert_array_equal(KernelBlockReader(store.url)(0, 1), K)


def test_pipeline_rerun_reuses_kernel_store_and_gives_identical_artifacts(tmp_path, inputs):
    cfg = config(tmp_path, inputs["npy"], kernel_store={"materialize": "always"})
    first = run_pipeline(cfg)
    emb1 = zarr.open_group(str(version_dir(tmp_path / "out")), mode="r")["embedding"][...]
    cfg.output.overwrite = True
    second = run_pipeline(cfg)
    assert second.manifest["kernel_store"]["computed"] == 0
    assert (
        second.manifest["kernel_store"]["skipped"] == first.manifest["kernel_store"]["n_blocks"]
    )
    emb2 = zarr.open_group(str(version_dir(tmp_path / "out")), mode="r")["embedding"][...]
    np.testing.assert_array_equal(emb1, emb2)
    assert second.manifest["checksums"] == first.manifest["checksums"]


def test_ingest_is_idempotent_and_sees_changes(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, X)
    cfg = config(tmp_path, path)
    store = Location(str(tmp_path / "ingest.zarr"))
    a = ingest(cfg.input, cfg.chunks, store)
    b = ingest(cfg.input, cfg.chunks, store)
    assert not a.reused and b.reused and a.fingerprint == b.fingerprint
    np.save(path, X + 1.0)
    c = ingest(cfg.input, cfg.chunks, store)
    assert not c.reused and c.fingerprint != a.fingerprint


def test_nan_rows_error_or_drop(tmp_path):
    Xn = X.copy()
    Xn[[10, 500], 2] = np.nan
    path = tmp_path / "nan.npy"
    np.save(path, Xn)
    with pytest.raises(InputError, match=r"NaN or infinity .*rows 0-\d+.*nonfinite: drop"):
        run_pipeline(config(tmp_path, path))
    assert not (tmp_path / "out" / "manifest.json").exists()
    summary = run_pipeline(config(tmp_path, path, input={"nonfinite": "drop"}))
    assert summary.manifest["input"]["dropped_rows"] == 2
    assert summary.manifest["input"]["n_rows"] == N - 2


def test_labels_split_and_parquet(tmp_path, inputs):
    """With a label column, a seeded held-out split is made before fitting."""
    cfg = config(
        tmp_path,
        inputs["parquet"],
        input={
            "label_column": "species",
            "id_column": "row_id",
            "columns": [f"f{i}" for i in range(D)],
        },
        evaluate={"enabled": True, "test_fraction": 0.25},
    )
    run_pipeline(cfg)
    g = zarr.open_group(str(version_dir(tmp_path / "out")), mode="r")
    split = g["split"][...]
    assert split.sum() == N - round(0.25 * N)
    assert g["labels"].attrs["classes"] == ["a", "b", "c"]
    model = kpca_dask.load(version_dir(tmp_path / "out") / "model")
    assert model.X_fit_.shape[0] == split.sum()  # fitted on training rows only
    np.testing.assert_allclose(model.X_fit_, X[split.astype(bool)])
    pq = pd.read_parquet(version_dir(tmp_path / "out") / "embedding.parquet")
    assert set(pq["split"]) == {"train", "test"} and set(pq["label"]) == {"a", "b", "c"}
    np.testing.assert_array_equal(
        pq[[c for c in pq.columns if c.startswith("kernelpca")]].to_numpy(), g["embedding"][...]
    )
    # dictionary pages for the text columns only: ids and components are written plain
    # (a dictionary of unique floats is built, then abandoned: pipeline/embed/parquet.py)
    for part in sorted((version_dir(tmp_path / "out") / "embedding.parquet").glob("*.parquet")):
        meta = pyarrow.parquet.ParquetFile(part).metadata
        for i in range(meta.num_columns):
            col = meta.row_group(0).column(i)
            dictionary = col.dictionary_page_offset is not None
            assert dictionary == (col.path_in_schema in ("label", "split")), (
                col.path_in_schema,
                col.encodings,
            )


def test_complete_run_is_not_overwritten_silently(tmp_path, inputs):
    run_pipeline(config(tmp_path, inputs["npy"]))
    with pytest.raises(RunExistsError, match="--overwrite"):
        run_pipeline(config(tmp_path, inputs["npy"]))


def test_readers_refuse_incomplete_or_tampered_runs(tmp_path, inputs):
    run_pipeline(config(tmp_path, inputs["npy"]))
    out = tmp_path / "out"
    verify_run(out)
    z = zarr.open_group(str(version_dir(out)), mode="r+")["embedding"]
    z[0, 0] = z[0, 0] + 1.0
    with pytest.raises(RunCorruptError, match="checksum mismatch for 'embedding'"):
        verify_run(out)
    rewrite_manifests(out, lambda m: {**m, "status": "running"})
    with pytest.raises(RunIncompleteError, match="not 'complete'"):
        verify_run(out)
    (out / "manifest.json").unlink()
    with pytest.raises(RunIncompleteError, match="no manifest.json"):
        verify_run(out)


@pytest.mark.parametrize(
    "bad,msg",
    [
        ({"input": {"path": "x.csv"}, "kernel": {"gamma": -1}}, "kernel.gamma"),
        ({"input": {"path": "x.csv"}, "solver": {"n_componets": 3}}, "unknown field"),
        ({"input": {"path": "x.csv", "storage_options": {"secret": "s3cr3t"}}}, "credentials"),
        ({"input": {"path": "s3://user:pw@bucket/x.csv"}}, "embedded credentials"),
        ({"input": {"path": "x.csv"}, "cluster": {"address": "localhost:8786"}}, "tcp://"),
        ({}, "input: required field is missing"),
    ],
)
def test_config_errors_name_the_field(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(bad)


def test_yaml_config_round_trip(tmp_path, inputs):
    p = tmp_path / "run.yaml"
    p.write_text(f"input:\n  path: {inputs['npy']}\nsolver:\n  n_components: 3\n")
    cfg = load_config(p)
    assert cfg.solver.n_components == 3 and cfg.kernel.name == "rbf"
    p.write_text("input: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_config_reference_is_up_to_date():
    """docs/config.md is generated from the config model; regenerate it when fields change."""
    from pathlib import Path

    from pipeline.config import reference_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "config.md"
    assert doc.read_text().strip() == reference_markdown().strip(), (
        "docs/config.md is stale: run `python -m pipeline.config > docs/config.md`"
    )


def test_example_config_validates():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[2] / "deploy" / "examples" / "run.yaml")
    assert cfg.kernel.gamma == "scale"
