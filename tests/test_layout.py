"""The repository's layout stays as docs/architecture.md draws it: a small top level in ctrlg/ with
no re-export shims, thin experiments, a README that reads in a minute."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_top_level_stays_small():
    """The top of ctrlg/ holds packages and at most 8 modules besides __init__.py, and none of
    them merely re-exports another module (no shims)."""
    modules = sorted(p.name for p in (ROOT / "ctrlg").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 8, modules
    for name in modules:
        tree = ast.parse((ROOT / "ctrlg" / name).read_text())
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        assert not all(isinstance(n, (ast.ImportFrom, ast.Import, ast.Assign)) for n in body), \
            f"ctrlg/{name} only re-exports"


def test_experiments_are_thin():
    """Each entry point is config + calls into the library: at most 300 lines."""
    long = {p.name: n for p in sorted((ROOT / "experiments").glob("*.py"))
            if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"experiments over 300 lines (move the work into ctrlg.tasks): {long}"


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 180, f"README.md has {lines} lines; move detail into docs/"


def test_packages_are_installed():
    """pyproject's package list names every package folder of ctrlg (a missing one would be left
    out of a wheel), and the kernels folder as ctrlg.kernels."""
    tomllib = pytest.importorskip("tomllib")   # Python ≥ 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ctrlg").rglob("__init__.py")}
    assert found | {"ctrlg.kernels", "experiments"} == set(config["packages"])
    assert config["package-dir"] == {"ctrlg.kernels": "kernels"}
