"""`kpca <command> --help` documents every argument: each positional and option of every
subcommand has a help text (argparse prints a bare name otherwise)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"kpca": parser, **sub.choices}


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_every_argument_has_help_text(name):
    parser = _subparsers()[name]
    missing = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction)
        and (a.help is None or a.help == argparse.SUPPRESS or not a.help.strip())
    ]
    assert missing == [], f"kpca {name}: arguments without help: {missing}"


def test_the_subcommand_list_has_a_line_for_every_command():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert set(helps) == set(sub.choices), helps
    assert all(h and h.strip() for h in helps.values()), helps


@pytest.mark.cluster  # a kpca command or a Prefect run
def test_help_texts_print_and_name_what_the_issue_found_missing():
    """The real --help output (a subprocess): transform's --format, --chunk-mb, --overwrite;
    info's and unlock's folder argument; demo's data folder."""

    def helptext(*args: str) -> str:
        res = subprocess.run(
            [sys.executable, "-m", "flows.cli", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert res.returncode == 0, res.stderr
        return " ".join(res.stdout.split())

    t = helptext("transform")
    assert "the input's format" in t and "row chunks in MB" in t
    assert "replace an existing output" in t
    assert "a run folder" in helptext("info")
    assert "lock a run that died left behind" in helptext("unlock")
    assert "OUTPUT-data/" in helptext("demo")
