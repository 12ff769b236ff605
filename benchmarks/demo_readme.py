"""Run README.md's quick start with the embedded LM and keep what it prints.

    python -m benchmarks.demo_readme        # writes benchmarks/results/demo_readme.json (~1 min)

The offline test suite runs every README block but the ones marked ``# not-run`` (they load the
embedded LM). This script runs all of README.md's python blocks in order, in one namespace, the
marked ones included, and records each block's printed lines with the machine and torch version.
The README shows a real-model block's output as comment lines after a ``# prints`` line;
``tests/test_results_doc.py`` checks that each of them is a line this script printed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import platform
import re
import time
from pathlib import Path

import torch

__all__ = ["block_hash", "readme_blocks", "run_blocks", "shown_outputs"]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
OUT = ROOT / "benchmarks" / "results" / "demo_readme.json"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SHOWN = re.compile(r"^# prints\b.*\n((?:# .*\n?)+)", re.M)


def readme_blocks(text: str) -> list[str]:
    """The python blocks of a Markdown text, in order."""
    return BLOCK.findall(text)


def shown_outputs(block: str) -> list[str]:
    """The output lines a block shows after its ``# prints`` line (``# ...`` lines left out)."""
    lines = []
    for group in SHOWN.findall(block):
        lines += [line[2:].rstrip() for line in group.splitlines() if line.strip() != "# ..."]
    return lines


def block_hash(block: str) -> str:
    """sha256 of a block's text without the outputs it shows (``# prints`` and its lines)."""
    return hashlib.sha256(SHOWN.sub("", block).encode()).hexdigest()


def run_blocks(blocks: list[str]) -> list[dict]:
    """Execute ``blocks`` in one namespace; ``[{"block", "sha256", "not_run", "printed",
    "seconds"}]`` (``sha256`` of the block's text, so a test can tell the README's example
    changed since it was run)."""
    namespace = {"__name__": "__readme__"}
    results = []
    for number, block in enumerate(blocks, 1):
        captured = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(captured):
            exec(compile(block, f"README.md[block {number}]", "exec"), namespace)
        results.append({"block": number, "sha256": block_hash(block),
                        "not_run": block.lstrip().startswith("# not-run"),
                        "printed": captured.getvalue().splitlines(),
                        "seconds": round(time.perf_counter() - start, 1)})
    return results


def main() -> None:
    results = run_blocks(readme_blocks(README.read_text()))
    record = {"command": "python -m benchmarks.demo_readme", "machine": platform.platform(),
              "processor": platform.processor(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "blocks": results}
    OUT.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    for result in results:
        print(f"block {result['block']} ({result['seconds']} s):")
        print("\n".join(f"  {line}" for line in result["printed"]))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
