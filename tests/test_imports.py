"""Every project module imports on its own in a fresh interpreter (an import cycle between project
modules fails here), and imports of project modules sit at module top."""

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
           "ctrlg.hmm.kv_cache": "transformers"}  # subclasses transformers' cache layer


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
