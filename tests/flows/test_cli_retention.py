"""``--keep-versions`` and ``--retention-grace-hours`` on the command line (issue 36: the
grace period was a config key only, so ``kpca transform`` outputs always kept expired
versions 24 h). Three transforms to one output with ``--keep-versions 1``: with the
default grace the expired versions stay for their readers; with
``--retention-grace-hours 0`` the publish that expires a version deletes it."""

from __future__ import annotations

import pytest

from flows.cli import main
from pipeline.output.store import Location
from pipeline.output.versions import expired_entries, read_pointer, version_ids
from tests.reliability.helpers import make_published_run


def _transform(run, new, out, *flags: str) -> None:
    argv = ["transform", str(run), str(new), str(out), "--overwrite", *flags]
    assert main(argv) == 0


def test_the_grace_period_is_a_flag_and_zero_deletes_at_expiry(tmp_path, dask_client, capsys):
    run = make_published_run(tmp_path / "r")
    new = tmp_path / "r" / "new.npy"
    kept, gone = tmp_path / "kept.zarr", tmp_path / "gone.zarr"
    for _ in range(3):
        _transform(run, new, kept, "--keep-versions", "1")
    for _ in range(3):
        _transform(run, new, gone, "--keep-versions", "1", "--retention-grace-hours", "0")
    # default grace (24 h): every version still on the store, two of them expired
    k = Location(str(kept))
    assert len(version_ids(k)) == 3
    assert len(expired_entries(read_pointer(k))) == 2
    # grace 0: a version is deleted by the publish that expires it; only the newest remains
    g = Location(str(gone))
    assert version_ids(g) == [read_pointer(g)["version"]]


@pytest.mark.parametrize("bad", ["-1", "nan", "1e9", "soon"])
def test_a_grace_period_that_is_not_hours_is_refused(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["transform", "m", "x.npy", "o.zarr", "--retention-grace-hours", bad])
    assert exc.value.code == 2
    assert "--retention-grace-hours" in capsys.readouterr().err
