"""The code blocks of the README and of docs/pipeline.md (the README's pipeline section,
moved there whole) run as written.

Every ```python block runs in a fresh interpreter in a temporary folder. Every line of a
```bash block is either run (the quick ones: ``kpca --version``, ``kpca validate`` on the
example config, with the data it names) or listed in NOT_RUN with the reason. A new
command in the README fails here until it is given one or the other.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # its tests start processes

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: pages whose code blocks a reader runs as written
PAGES = (README, ROOT / "docs" / "pipeline.md")

#: command prefixes that are not run here, and why
NOT_RUN = {
    "python3 -m venv": "installs the package into a new virtual environment (minutes)",
    "kpca run ": "a whole pipeline run; tests/flows/test_cli.py runs one",
    "kpca info ": "needs a finished run (runs/today); tests/flows/test_cli.py covers it",
    "kpca transform ": "needs a finished run; tests/flows/test_cli.py covers it",
    "kpca unlock ": "needs a locked run; tests/reliability/test_lock.py covers it",
    "kpca drain ": "needs a running Prefect work pool and worker; tests/deploy/test_drain.py "
    "drains one (slow)",
    "kpca migrate ": "needs an earlier release's output; tests/integrity/test_upgrade.py "
    "builds one with that release's code and migrates it",
    "kpca update ": "needs a published run; tests/pipeline/test_update_pipeline.py runs it",
    "kpca demo": "the whole demo job (about a minute); tests/flows/test_cli.py runs it (slow)",
    "python benchmarks/": "a benchmark (minutes to hours); results in docs/benchmarks.md",
    "kpca calibrate": "measures this machine (20 s) and writes the user's calibration file; "
    "tests/flows/test_plan_cli.py runs `kpca calibrate --quick` into a temporary file",
    "python -m pytest": "the test suite itself",
}


def _blocks(lang: str) -> list[tuple[str, str]]:
    """("page line", text) of every fenced block in ``lang``, its first line's place."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() == f"```{lang}":
                j = i + 1
                while not lines[j].startswith("```"):
                    j += 1
                out.append(
                    (f"{page.relative_to(ROOT)} line {i + 2}", "\n".join(lines[i + 1 : j]))
                )
                i = j
            i += 1
    return out


def _commands() -> list[tuple[str, str]]:
    cmds = []
    for start, text in _blocks("bash"):
        page, _, first = start.rpartition(" line ")
        joined = text.replace("\\\n", " ")
        for k, line in enumerate(joined.splitlines()):
            cmd = line.split("  #", 1)[0].strip()
            if cmd and not cmd.startswith("#"):
                cmds.append((f"{page} line {int(first) + k}", re.sub(r"\s+", " ", cmd)))
    return cmds


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("start,code", _blocks("python"), ids=lambda v: str(v)[:12])
def test_python_block_runs(start, code, tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, f"{start}:\n{res.stderr[-3000:]}"


def _example_input(folder: Path) -> None:
    """What deploy/examples/run.yaml reads as shipped: the table `kpca demo` writes
    (kpca-demo-output-data/digits.parquet beside kpca-demo-output/), written by the
    function the demo calls."""
    from pipeline.data.demo_data import write_demo_dataset

    (folder / "deploy" / "examples").mkdir(parents=True)
    shutil.copy(ROOT / "deploy" / "examples" / "run.yaml", folder / "deploy" / "examples")
    write_demo_dataset(folder / "kpca-demo-output-data")


def _reason(cmd: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if cmd.startswith(prefix)), None)


RUN_HERE = ("kpca --version", "kpca validate ", "kpca plan ")


def test_every_command_is_run_here_or_has_a_reason():
    """A new README command fails here until it is run below or listed in NOT_RUN (the
    ones not run are listed, not skipped: nothing is skipped to get green)."""
    unclassified = [
        f"{line}: `{cmd}`"
        for line, cmd in _commands()
        if _reason(cmd) is None and not cmd.startswith(RUN_HERE)
    ]
    assert not unclassified, (
        "neither run here nor listed in NOT_RUN with a reason: " + "; ".join(unclassified)
    )
    assert any(cmd.startswith(RUN_HERE) for _, cmd in _commands())


@pytest.mark.parametrize(
    "line,cmd",
    [(line, cmd) for line, cmd in _commands() if cmd.startswith(RUN_HERE)],
    ids=lambda v: str(v)[:40],
)
def test_bash_command(line, cmd, tmp_path):
    _example_input(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    args = cmd.split()[1:]
    res = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, f"{line}: `{cmd}`:\n{res.stderr[-2000:]}"
    if cmd.startswith("kpca validate"):
        assert res.stdout.startswith(
            "kpca validate: ok: kpca-demo-output-data/digits.parquet (parquet)"
        )
        assert sorted(tmp_path.rglob("*")) == before  # the output probe left nothing
    if cmd.startswith("kpca plan"):
        assert "bound:" in res.stdout and "GB on the client" in res.stdout
        assert sorted(tmp_path.rglob("*")) == before  # starts nothing, writes nothing


def _named_files() -> dict[str, str]:
    """Blocks the pages introduce with a file name ("`wine.yaml`:"), by that name."""
    files = {}
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            m = re.fullmatch(r"`([\w.-]+\.(?:yaml|yml|json))`:", line.strip())
            if m and i + 2 < len(lines) and lines[i + 2].startswith("```"):
                j = i + 3
                while not lines[j].startswith("```"):
                    j += 1
                files[m.group(1)] = "\n".join(lines[i + 3 : j]) + "\n"
    return files


def test_the_real_data_example_validates(tmp_path):
    """The own-table section (docs/pipeline.md) as a reader follows it: its python block
    writes the data, its config goes to the file it names, and `kpca validate` accepts the pair
    (`kpca run` on it is left to the scaling tests)."""
    files = _named_files()
    assert files, "the own-table section (docs/pipeline.md) names no config file"
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for _, code in _blocks("python"):
        if any(f"{Path(n).stem}.csv" in code or Path(n).stem in code for n in files):
            res = subprocess.run(
                [sys.executable, "-c", code],
                cwd=tmp_path,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert res.returncode == 0, res.stderr[-2000:]
    for name in files:
        res = subprocess.run(
            [sys.executable, "-m", "flows.cli", "validate", name],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, f"kpca validate {name}:\n{res.stderr[-2000:]}"
        assert res.stdout.startswith("kpca validate: ok: "), res.stdout
