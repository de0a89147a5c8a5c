"""Imports only point down: flows -> pipeline -> kpca_dask (DESIGN.md), and no
pickle-like loader anywhere in the packages."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "kpca_dask": {"pipeline", "flows", "prefect", "prefect_dask"},
    "pipeline": {"flows", "prefect", "prefect_dask"},
    "flows": set(),
}
UNSAFE = {"pickle", "cPickle", "joblib", "cloudpickle", "dill", "shelve", "marshal"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


def package_files(pkg: str):
    return sorted((ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_imports_point_down(pkg):
    bad = {str(f.relative_to(ROOT)): sorted(imported_modules(f) & FORBIDDEN[pkg])
           for f in package_files(pkg)}
    assert not {f: m for f, m in bad.items() if m}


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_no_pickle_or_eval_on_any_path(pkg):
    for f in package_files(pkg):
        assert not imported_modules(f) & UNSAFE, f
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec"), f"{f}: {node.func.id}()"
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                assert isinstance(node.value, ast.Constant) and node.value.value is False, f
