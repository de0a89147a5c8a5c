"""Never destroy what is not ours (issue 19, deletion and publishing): each case of the
issue, in a temporary folder with a canary file, a victim folder outside the output and
a published run; after each, the canary and the victim are byte for byte the same,
nothing wrong was published and the previous good run still verifies."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest
import zarr

from kpca_dask import UnsafeRemovalError
from kpca_dask.removal import removal_refusal, remove_owned
from pipeline.output.export import verify_run
from pipeline.output.lock import RunLock
from pipeline.output.store import Location
from pipeline.output.versions import open_output, version_ids
from pipeline.runner.run import run_pipeline
from tests.published import version_dir
from tests.reliability.helpers import small_config

from .conftest import error_line, kpca, new_batch, tree_hashes


def _survived(world, before):
    assert world.user_files() == before
    verify_run(world.run)


# ------------------------------------------------------------------ kpca transform
@pytest.mark.parametrize("output", ["", ".", "./", ".."])
def test_transform_to_an_empty_or_dot_output_deletes_nothing(world, dask_client, output):
    """`kpca transform RUN x.npy "" --overwrite` (an unset shell variable) and "." used to
    delete the current folder: refused with one line, the current folder untouched."""
    before, run = world.user_files(), tree_hashes(world.run)
    rc, err = kpca("transform", world.run, world.new, output, "--overwrite", "--no-progress")
    assert rc == 2
    assert "names no new folder" in error_line(err)
    _survived(world, before)
    assert tree_hashes(world.run) == run


def test_transform_output_equal_to_its_input_is_refused(world, dask_client):
    """Output == input with --overwrite used to delete the input and embed zeros."""
    before = world.user_files()
    rc, err = kpca("transform", world.run, world.new, world.new, "--overwrite", "--no-progress")
    assert rc == 2 and "lies inside the input" in error_line(err)
    _survived(world, before)


@pytest.mark.parametrize("where", ["run", "run/model", "run/inside.zarr", "other run"])
def test_transform_output_in_a_run_folder_is_refused(world, dask_client, where):
    """Output == the model's run, its model/, a path inside it, or another run folder:
    refused; the run still verifies, byte for byte."""
    other = world.tmp / "other"
    shutil.copytree(world.run, other, symlinks=True)
    target = {
        "run": world.run,
        "run/model": version_dir(world.run) / "model",
        "run/inside.zarr": world.run / "inside.zarr",
        "other run": other,
    }[where]
    before, run, run2 = world.user_files(), tree_hashes(world.run), tree_hashes(other)
    rc, err = kpca("transform", world.run, world.new, target, "--overwrite", "--no-progress")
    assert rc == 2
    assert "run" in error_line(err)
    _survived(world, before)
    assert tree_hashes(world.run) == run and tree_hashes(other) == run2
    verify_run(other)


@pytest.mark.parametrize("kind", ["user folder", "user file", "link to victim"])
def test_transform_never_replaces_what_it_did_not_write(world, dask_client, kind):
    """An existing output kpca did not write (a folder or file of the user's, a link) is
    refused even with --overwrite."""
    out = world.tmp / "emb.zarr"
    if kind == "user folder":
        out.mkdir()
        (out / "mine.txt").write_bytes(b"mine\n")
    elif kind == "user file":
        out.write_bytes(b"mine\n")
    else:
        out.symlink_to(world.victim, target_is_directory=True)
    before, theirs = world.user_files(), tree_hashes(out)
    rc, err = kpca("transform", world.run, world.new, out, "--overwrite", "--no-progress")
    assert rc == 2
    line = error_line(err)
    assert "was not written by kpca" in line or "symbolic link" in line
    _survived(world, before)
    assert tree_hashes(out) == theirs


@pytest.mark.parametrize("suffix", [".zarr", ".parquet"])
def test_a_failed_transform_leaves_the_previous_output(world, dask_client, suffix):
    """A transform that fails while writing (NaN in the batch) leaves the previous output
    exactly as it was and no temporary folder behind."""
    out = world.tmp / f"emb{suffix}"
    rc, err = kpca("transform", world.run, world.new, out, "--no-progress")
    assert rc == 0, err
    prev = tree_hashes(out)
    bad = new_batch(world.tmp, seed=3)
    x = np.load(bad)
    x[-1, 0] = np.nan
    np.save(bad, x)
    before = world.user_files()
    rc, err = kpca("transform", world.run, bad, out, "--overwrite", "--no-progress")
    assert rc == 2 and "NaN" in error_line(err)
    assert tree_hashes(out) == prev
    assert not [p for p in os.listdir(world.tmp) if p.startswith(".kpca-")]
    _survived(world, before)


def test_transform_replaces_its_own_output_with_overwrite(world, dask_client):
    """The safe path still works: an output of ours is replaced, the new rows are there."""
    out = world.tmp / "emb.zarr"
    assert kpca("transform", world.run, world.new, out, "--no-progress")[0] == 0
    other = new_batch(world.tmp, seed=2, rows=7)
    before = world.user_files()
    assert kpca("transform", world.run, other, out, "--overwrite", "--no-progress")[0] == 0
    g = open_output(str(out)).data.open_group("r")
    assert g["embedding"].shape[0] == 7 and g.attrs["status"] == "complete"
    assert not [p for p in os.listdir(world.tmp) if p.startswith(".kpca-")]
    _survived(world, before)


def test_concurrent_transforms_to_one_output_cannot_both_publish(world, dask_client):
    """While one writer holds the output's lock (<out>/.kpca-run.lock), a transform is
    refused and publishes nothing; the first's output is unchanged."""
    out = world.tmp / "emb.zarr"
    assert kpca("transform", world.run, world.new, out, "--no-progress")[0] == 0
    prev = tree_hashes(out)
    with RunLock(Location(str(out))):
        prev = {k: v for k, v in tree_hashes(out).items() if ".kpca-run.lock" not in k}
        rc, err = kpca(
            "transform",
            world.run,
            new_batch(world.tmp, seed=4),
            out,
            "--overwrite",
            "--no-progress",
        )
        assert rc == 2 and "locked by a running job" in error_line(err)
    assert tree_hashes(out) == prev
    assert not (out / ".kpca-run.lock").exists()  # released, removed


def test_transform_inverse_output_is_checked_the_same_way(world, dask_client):
    """`kpca transform --inverse` (denoise) refuses "" and the input like a transform."""
    before = world.user_files()
    for target in ("", world.new):
        rc, err = kpca(
            "transform",
            world.run,
            world.new,
            target,
            "--inverse",
            "--overwrite",
            "--no-progress",
        )
        assert rc == 2, err
    _survived(world, before)


# ------------------------------------------------------------------------- kpca run
def _cfg(world, out, **over):
    over.setdefault("output", {})
    over["output"] = {**over["output"], "path": str(out)}
    return small_config(world.data, out, **over)


@pytest.mark.parametrize("name", ["embedding.parquet", "model", "work"])
def test_a_link_inside_the_output_is_never_followed(world, dask_client, name):
    """`embedding.parquet -> ../victim` (or model/ in the published version, work/) used
    to make `kpca run` delete the folder it points to: refused, the victim and the link
    survive."""
    link = (world.run if name == "work" else version_dir(world.run)) / name
    shutil.rmtree(link)
    link.symlink_to(world.victim, target_is_directory=True)
    before, manifest = world.user_files(), world.run_manifest()
    with pytest.raises(Exception, match="symbolic link"):
        run_pipeline(_cfg(world, world.run, output={"overwrite": True}))
    assert world.user_files() == before
    assert os.path.islink(link) and world.run_manifest() == manifest


@pytest.mark.parametrize("name", [".kpca-run.lock", "manifest.json"])
def test_a_linked_lock_or_manifest_never_overwrites_its_target(world, dask_client, name):
    """A symlinked `.kpca-run.lock` or `manifest.json` used to overwrite the file it points
    to: refused, the target byte for byte the same."""
    target = world.victim / "precious.txt"
    link = world.run / name
    if link.exists():
        link.unlink()
    link.symlink_to(target)
    before = world.user_files()
    with pytest.raises(Exception, match="symbolic link"):
        run_pipeline(_cfg(world, world.run, output={"overwrite": True}))
    assert world.user_files() == before
    assert os.path.islink(link)


def test_output_path_on_a_folder_of_the_users_is_refused(world, dask_client):
    """`output.path` on the user's own folder with their model/ and embedding.parquet/:
    refused without a word of deletion, every file byte for byte."""
    mine = world.tmp / "results"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "weights.bin").write_bytes(os.urandom(64))
    (mine / "embedding.parquet").mkdir()
    (mine / "embedding.parquet" / "part.0.parquet").write_bytes(b"PAR1 theirs")
    theirs, before = tree_hashes(mine), world.user_files()
    with pytest.raises(Exception, match="not a kpca-dask run folder"):
        run_pipeline(_cfg(world, mine, output={"overwrite": True}))
    assert tree_hashes(mine) == theirs
    _survived(world, before)


def test_output_beside_the_users_files_leaves_them_alone(world, dask_client):
    """A folder of the user's whose names do not collide with a run's: the run is written
    beside them, their files unchanged; a re-run with --overwrite leaves them too."""
    mine = world.tmp / "results"
    mine.mkdir()
    (mine / "notes.txt").write_bytes(b"notes\n")
    run_pipeline(_cfg(world, mine))
    run_pipeline(_cfg(world, mine, output={"overwrite": True}))
    verify_run(mine)
    assert (mine / "notes.txt").read_bytes() == b"notes\n"


@pytest.mark.parametrize("where", ["input file", "input folder", "inside input folder"])
def test_run_output_overlapping_the_input_is_refused(world, dask_client, where):
    zin = world.tmp / "in.zarr"
    if where == "input file":
        cfg = _cfg(world, world.x)
    else:
        z = zarr.open_array(str(zin), mode="w", shape=(300, 5), chunks=(100, 5), dtype="f8")
        z[...] = np.load(world.x)
        out = zin if where == "input folder" else zin / "out"
        cfg = _cfg(world, out, input={"path": str(zin)})
    before, zin_before = world.user_files(), tree_hashes(zin)
    with pytest.raises(Exception, match="lies inside the input"):
        run_pipeline(cfg)
    _survived(world, before)
    assert tree_hashes(zin) == zin_before


def test_overwrite_with_a_typo_in_the_input_keeps_the_published_run(world, dask_client):
    """`kpca run --overwrite --no-prefect` with a typo in input.path used to delete the
    published manifest before checking the input: now the input is checked first."""
    before, manifest = world.user_files(), world.run_manifest()
    with pytest.raises(Exception, match="does not exist"):
        run_pipeline(
            _cfg(
                world,
                world.run,
                output={"overwrite": True},
                input={"path": str(world.data / "x-typo.npy")},
            )
        )
    assert world.run_manifest() == manifest
    _survived(world, before)


def test_a_failed_run_leaves_the_previous_run_published(world, dask_client, caplog):
    """A run that fails late (too many components, found at the solve stage) publishes
    nothing: the previous run verifies byte for byte as before and the version the run
    wrote is gone."""
    run_before = {k: v for k, v in tree_hashes(world.run).items() if "/work" not in k}
    before = world.user_files()
    with (
        caplog.at_level(logging.INFO, logger="pipeline"),
        pytest.raises(ValueError, match="exceeds"),
    ):
        run_pipeline(
            _cfg(world, world.run, output={"overwrite": True}, solver={"n_components": 400})
        )
    assert "nothing was published" in caplog.text
    after = {k: v for k, v in tree_hashes(world.run).items() if "/work" not in k}
    assert after == run_before
    _survived(world, before)


def test_a_good_rerun_publishes_a_new_version_and_keeps_the_old(world, dask_client):
    before = world.user_files()
    old = version_ids(Location(str(world.run)))
    run_pipeline(_cfg(world, world.run, output={"overwrite": True}, solver={"n_components": 2}))
    m = verify_run(world.run)
    assert m["model"]["n_components"] == 2
    now = version_ids(Location(str(world.run)))
    assert len(now) == len(old) + 1 and set(old) < set(now)
    assert verify_run(world.run, version=old[-1])["model"]["n_components"] == 3
    assert world.user_files() == before


def test_a_link_inside_our_model_is_not_followed_when_the_model_is_replaced(world, dask_client):
    """A link planted inside the published version's model/ folder: starting the new
    version (a copy of the published one) refuses, the victim survives, and the previous
    run is published as it was."""
    planted = version_dir(world.run) / "model" / "planted"
    planted.symlink_to(world.victim, target_is_directory=True)
    before = world.user_files()
    with pytest.raises((UnsafeRemovalError, ValueError), match="symbolic link"):
        run_pipeline(
            _cfg(world, world.run, output={"overwrite": True}, solver={"n_components": 2})
        )
    assert world.user_files() == before
    assert planted.is_symlink()
    planted.unlink()
    verify_run(world.run)
    assert version_ids(Location(str(world.run))) == [version_dir(world.run).name]


# ------------------------------------------------------------------ the primitive
def test_the_primitive_refuses_what_is_not_ours(world):
    """remove_owned refuses "", ".", "/", home, the current folder and its parents, the
    input, anything outside its root and anything its ownership check rejects."""

    def yes(_):
        return True

    for bad in ("", ".", "..", world.work, world.work.parent):
        with pytest.raises(UnsafeRemovalError):
            remove_owned(bad, root=world.tmp, owned=yes)
    with pytest.raises(UnsafeRemovalError, match="outside"):
        remove_owned(world.victim, root=world.run, owned=yes)
    with pytest.raises(UnsafeRemovalError, match="input"):
        remove_owned(world.data, root=world.tmp, owned=yes, protect=[world.x])
    with pytest.raises(UnsafeRemovalError, match="not written by kpca"):
        remove_owned(world.victim, root=world.tmp, owned=lambda p: False)
    (world.run / "victim-link").symlink_to(world.victim, target_is_directory=True)
    with pytest.raises(UnsafeRemovalError, match="symbolic link"):
        Location(str(world.run / "victim-link")).remove(root=Location(str(world.run)))
    assert (world.run / "victim-link").is_symlink()
    # checked without removing anything: these must never be tried for real
    assert "/" in removal_refusal("/", root="/")
    assert "home" in removal_refusal(os.path.expanduser("~"), root="/")
    mounts = [m for m in ("/proc", "/sys", "/dev") if os.path.ismount(m)]
    if mounts:
        assert "mount point" in removal_refusal(mounts[0], root="/")
    assert world.user_files()  # the world is still there


def test_the_primitive_removes_our_marked_folder_and_a_link_only_as_a_link(world):
    """What is ours goes: a marked store inside the root; a link the caller owns is unlinked
    without touching its target."""
    from kpca_dask.removal import write_marker

    store = world.tmp / "out" / "store"
    write_marker(store, "test")
    (store / "a.bin").write_bytes(b"x")
    assert Location(str(store)).remove(root=Location(str(world.tmp / "out")))
    assert not store.exists()
    link = world.tmp / "out" / "link"
    link.symlink_to(world.victim, target_is_directory=True)
    before = world.user_files()
    assert remove_owned(link, root=world.tmp / "out", owned=lambda p: p.name == "link")
    assert not os.path.lexists(link) and world.user_files() == before


def test_a_new_version_never_changes_the_published_one_through_its_links(world):
    """The new version starts as hard links to the published one; every writer replaces
    files (rename over, remove and recreate), so what it writes never reaches the
    published version's files, which verify byte for byte afterwards."""
    from pipeline.output.lock import RunLock
    from pipeline.output.versions import Transaction

    pub = version_dir(world.run)
    (pub / "report").mkdir()
    (pub / "report" / "metrics.json").write_text('{"old": 1}')
    before = {k: v for k, v in tree_hashes(world.run).items() if "/work" not in k}
    out = Location(str(world.run))
    with RunLock(out) as lock:
        txn = Transaction(out, lock)
        txn.begin()
        new = txn.start(seed=True).local_path
        assert (new / "report" / "metrics.json").stat().st_ino == (
            pub / "report" / "metrics.json"
        ).stat().st_ino  # linked, not copied
        tmp = new / "report" / ".metrics.tmp"
        tmp.write_text('{"new": 2}')
        os.replace(tmp, new / "report" / "metrics.json")
        Location(str(new / "model")).remove(root=Location(str(new)))
        (new / "model").mkdir()  # a half-written new model: not yet a zarr node
        txn.discard()
    assert {k: v for k, v in tree_hashes(world.run).items() if "/work" not in k} == before
    verify_run(world.run, check_arrays=True)


def test_two_transforms_at_once_never_publish_a_broken_output(world, dask_client):
    """Two transforms to one output started together: each either publishes a complete
    output or is refused by the lock; what is there at the end is complete and readable."""
    import threading

    out = world.tmp / "shared.zarr"
    batches = [new_batch(world.tmp, seed=s, rows=11 + s) for s in (5, 6)]
    results: list = [None, None]

    def go(i):
        from pipeline.config import InputConfig
        from pipeline.embed.transform import transform_to_store

        try:
            results[i] = transform_to_store(
                str(world.run), InputConfig(path=str(batches[i])), str(out), overwrite=True
            )
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        assert isinstance(r, dict) or "locked by a running job" in str(r), r
    g = open_output(str(out)).data.open_group("r")
    assert g.attrs["status"] == "complete"
    rows = g["embedding"].shape[0]
    assert rows in {11 + 5, 11 + 6}
    assert np.isfinite(g["embedding"][...]).all()
    assert not [p for p in os.listdir(world.tmp) if p.startswith(".kpca-")]


def test_unlock_never_removes_a_linked_lock_or_its_target(world):
    """`kpca unlock` on an output whose .kpca-run.lock is a link: refused in one line, the
    link and the file it points to unchanged."""
    link = world.run / ".kpca-run.lock"
    link.symlink_to(world.victim / "precious.txt")
    before = world.user_files()
    rc, err = kpca("unlock", world.run)
    assert rc == 2 and "symbolic link" in error_line(err)
    assert link.is_symlink() and world.user_files() == before


@pytest.mark.parametrize("what", ["folder", "file", "link"])
def test_model_save_never_replaces_what_is_not_a_model(world, what):
    """KernelPCA.save(path, overwrite=True) replaces a saved model only: a folder or file of
    the user's, or a link, at that path is refused and left byte for byte."""
    from kpca_dask import KernelPCA
    from tests.reliability.helpers import blobs

    model = KernelPCA(n_components=2, kernel="rbf", gamma=0.1).fit(blobs(40, 3))
    target = world.tmp / "model"
    if what == "folder":
        target.mkdir()
        (target / "theirs.txt").write_bytes(b"theirs\n")
    elif what == "file":
        target.write_bytes(b"theirs\n")
    else:
        target.symlink_to(world.victim, target_is_directory=True)
    before, theirs = world.user_files(), tree_hashes(target)
    with pytest.raises(UnsafeRemovalError, match="not written by kpca"):
        model.save(target, overwrite=True)
    assert tree_hashes(target) == theirs and world.user_files() == before
    assert not [p for p in os.listdir(world.tmp) if p.startswith(".model.tmp")]
    model.save(world.tmp / "mine", overwrite=False)
    model.save(world.tmp / "mine", overwrite=True)  # its own model: replaced


def test_a_second_transform_sees_a_first_one_publishing_as_a_running_job(world, tmp_path):
    """While another transform probes the output (``.kpca-probe-<time>-<random>.client``)
    or writes its pointer (``.manifest.json.<random>.tmp`` beside its lock, before the
    atomic rename) the output is that transform's, not a folder of the user's: the check
    lets the second transform on to the lock, which then refuses it as a running job (CI
    once saw "exists and was not written by kpca transform" from two transforms started
    together). A user's own file still makes it a folder that is not ours."""
    from pipeline.output.layout import LOCK
    from pipeline.output.publish import TransformOutputError, check_transform_output

    out = tmp_path / "shared.zarr"
    (out / "versions" / "20261126T000000-abc").mkdir(parents=True)
    (out / LOCK).write_text("{}")
    (out / ".manifest.json.k2j4x9.tmp").write_text("{}")
    (out / ".kpca-probe-1795720527-9fbad1f82b90.client").write_text("")

    def check():
        return check_transform_output(
            str(out), model_path=str(world.run), inputs=[], overwrite=True
        )

    assert check().local_path == out
    (out / "notes.txt").write_text("mine")
    with pytest.raises(TransformOutputError, match="was not written by kpca transform"):
        check()
