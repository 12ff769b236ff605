"""Every ```python block in README.md and docs/*.md runs as written (offline, in-process).

Blocks of one file run in order in a shared namespace, so later blocks may use earlier names.
A block whose first line is ``# not-run`` is shown to users but skipped here (e.g. a command
that needs a network).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks(path):
    return [b for b in BLOCK.findall(path.read_text()) if not b.lstrip().startswith("# not-run")]


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d.exists()],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(document, tmp_path, monkeypatch):
    blocks = _blocks(document)
    if not blocks:
        pytest.skip(f"{document.name} has no python blocks")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for number, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"{document.name}[block {number}]", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{document.name} block {number} failed: {type(err).__name__}: {err}\n{block}")
