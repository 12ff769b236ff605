"""Every project module imports on its own in a fresh interpreter (an import cycle between project
modules fails here), imports of project modules sit at module top, and the imports between ctrlg's
packages follow the layering table :data:`LAYERS` (no arrow up, no circle; docs/architecture.md)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "ctrlg").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "app" in parts[:2] and path.name == "__main__.py":
            continue
        names.append(".".join(p for p in parts if p != "__init__"))
    for path in sorted((ROOT / "kernels").glob("*.py")):
        if path.name != "__init__.py":
            names.append("ctrlg.kernels." + path.stem)
    return names


# Runs in one fresh interpreter: third-party packages are imported once, then each project module
# is imported in a forked child whose sys.modules holds no ctrlg module yet, i.e. as if alone.
_ZYGOTE = r"""
import importlib, os, sys, traceback
import numpy, torch, transformers  # noqa: F401  (shared, already-initialised third-party state)
assert not [m for m in sys.modules if m == "ctrlg" or m.startswith("ctrlg.")]
failures = []
for name in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            importlib.import_module(name)
        except BaseException:
            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())
            code = 1
        os._exit(code)
    os.close(write)
    message = os.read(read, 65536).decode()
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if status:
        failures.append(f"{name}: {message}")
print("\n".join(failures))
sys.exit(1 if failures else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_every_module_imports_alone():
    """Each module imported first, on its own (a cycle between project modules shows up as an
    ImportError on a partially initialised module when one of its members is imported first)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", _ZYGOTE, *_modules()], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def _function_level_project_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("ctrlg"):
                    targets = [sub.module] if sub.module != "ctrlg" else \
                        [f"ctrlg.{alias.name}" for alias in sub.names]
                elif isinstance(sub, ast.Import):
                    targets = [a.name for a in sub.names if a.name.startswith("ctrlg")]
                else:
                    continue
                found += [f"{path.relative_to(ROOT)}:{sub.lineno} {t}" for t in targets]
    return found


# ctrlg's own modules imported inside functions, each for a heavy optional third-party package
ALLOWED = {"ctrlg.sampler": "transformers", "ctrlg.kernels.backward_table": "triton",
           "ctrlg.kernels.em_estep": "triton",
           "ctrlg.hmm.kv_cache": "transformers",
           "ctrlg.lm.growing_cache": "transformers"}  # each subclasses a transformers cache


@pytest.mark.parametrize("folder", ["ctrlg", "kernels"])
def test_project_imports_at_module_top(folder):
    lines = [line for path in sorted((ROOT / folder).rglob("*.py"))
             for line in _function_level_project_imports(path)
             if line.split()[-1] not in ALLOWED]
    assert not lines, "move these imports to the module top:\n" + "\n".join(lines)


def _module_top_edges() -> dict[str, set[str]]:
    """Project module → project modules it imports at module level (statically)."""
    names = set(_modules())
    files = {name: ROOT / ("kernels/" + name.split(".")[-1] + ".py" if name.startswith("ctrlg.kernels.")
                           else name.replace(".", "/") + ("/__init__.py" if (ROOT / name.replace(".", "/")).is_dir() else ".py"))
             for name in names}
    edges: dict[str, set[str]] = {name: set() for name in names}
    for name, path in files.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ctrlg"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges[name].add(sub if sub in names else node.module)
            elif isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name in names)
    return edges


def test_module_top_imports_have_no_cycle():
    """The static import graph (module-level imports only) is acyclic, so the import order is
    one-way even where a cycle would not fail at run time."""
    edges = _module_top_edges()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = 2
        stack.pop()
        return None

    for start in sorted(edges):
        if start not in state:
            cycle = visit(start)
            assert cycle is None, "import cycle: " + " → ".join(cycle)


# ---------------------------------------------------------------------- the layering rules
# What each part of ctrlg may import (its package `__init__` docstring says the same in words).
# A part is a top-level package or module of ctrlg ("ctrlg" itself is the package's __init__).
# The table is a one-way order: no part may reach itself through it, so no arrow runs upward.
LAYERS: dict[str, set[str]] = {
    "errors": set(),
    "vocab": {"errors"},
    "validation": {"errors", "vocab"},
    "checkpoint": {"errors"},
    "metrics": {"errors"},
    "memory": {"errors"},
    "kernels": set(),
    "dfa": {"errors", "vocab", "validation"},
    "lm": {"errors", "vocab", "validation", "checkpoint", "kernels"},
    "data": {"errors", "dfa"},
    "hmm": {"errors", "vocab", "validation", "checkpoint", "kernels", "data", "lm"},
    "guide": {"errors", "vocab", "validation", "memory", "dfa", "kernels"},
    "sampler": {"errors", "vocab", "validation", "memory", "dfa", "guide", "lm", "hmm"},
    "fast_forward": {"errors", "dfa", "guide", "lm", "hmm"},
    "relm": {"errors", "vocab", "validation", "dfa", "lm"},
    "app": {"errors", "vocab", "validation", "checkpoint", "metrics", "memory", "dfa", "lm", "data", "hmm",
            "guide", "sampler", "relm"},
    "tasks": {"errors", "vocab", "validation", "checkpoint", "metrics", "memory", "kernels", "dfa", "lm",
              "data", "hmm", "guide", "sampler", "relm", "fast_forward"},
    "ctrlg": {"errors", "vocab", "dfa", "hmm", "sampler"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ctrlg"


def _all_project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import of ctrlg in ``path``, at module top or inside a
    function (a function-level import is an arrow too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ctrlg":
            found += [(node.lineno, f"ctrlg.{a.name}" if node.module == "ctrlg" else node.module)
                      for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "ctrlg"]
    return found


def _library_files() -> dict[str, Path]:
    """ctrlg's module name → file, the kernels folder included as ctrlg.kernels."""
    files = {}
    for path in sorted((ROOT / "ctrlg").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(p for p in parts if p != "__init__")] = path
    for path in sorted((ROOT / "kernels").glob("*.py")):
        files["ctrlg.kernels" + ("" if path.stem == "__init__" else "." + path.stem)] = path
    return files


def test_layer_table_is_one_way():
    """The allowed-import table has no circle (so 'below' is well defined)."""
    order: list[str] = []
    remaining = {part: set(deps) for part, deps in LAYERS.items()}
    while remaining:
        ready = sorted(p for p, deps in remaining.items() if deps <= set(order))
        assert ready, f"the layer table has a circle among {sorted(remaining)}"
        order += ready
        for p in ready:
            del remaining[p]


def test_imports_follow_the_layers():
    """Every import between parts of ctrlg is allowed by :data:`LAYERS`: no arrow runs upward
    (e.g. dfa → its grammar readers live inside dfa; data → hmm is gone)."""
    files = _library_files()
    assert {_part(name) for name in files} == set(LAYERS), "a part of ctrlg is missing from LAYERS"
    wrong = []
    for name, path in files.items():
        source = _part(name)
        for line, target in _all_project_imports(path):
            if _part(target) != source and _part(target) not in LAYERS[source]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} "
                             f"({source} may import {sorted(LAYERS[source]) or 'nothing of ctrlg'})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_library_never_imports_experiments_or_benchmarks():
    wrong = []
    for path in _library_files().values():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("experiments", "benchmarks", "tests")]
    assert not wrong, "\n".join(wrong)


def test_experiments_import_no_other_experiment():
    """Entry points share code through experiments/common.py or the library, never each other;
    common.py imports no entry point."""
    wrong = []
    for path in sorted((ROOT / "experiments").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "experiments":
                names = [f"experiments.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("experiments.") and (name != "experiments.common"
                                                        or path.name == "common.py"):
                    wrong.append(f"experiments/{path.name}:{node.lineno} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_each_package_says_what_it_may_import():
    packages = [p for p in sorted((ROOT / "ctrlg").glob("*/__init__.py"))]
    packages += [ROOT / "ctrlg/tasks/commongen/__init__.py", ROOT / "ctrlg/dfa/cfg/__init__.py",
                 ROOT / "kernels/__init__.py"]
    silent = [str(p.relative_to(ROOT)) for p in packages
              if "May import" not in (ast.get_docstring(ast.parse(p.read_text())) or "")]
    assert not silent, "package docstrings without a 'May import' rule: " + ", ".join(silent)

