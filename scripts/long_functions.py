"""List the functions longer than N lines (default 60) in ctrlg/, kernels/ and experiments/.

    python scripts/long_functions.py [ROOT] [N]
"""

import ast
import sys
from pathlib import Path


def long_functions(root: Path, limit: int) -> list[tuple[int, str]]:
    rows = []
    paths = [*root.glob("ctrlg/**/*.py"), *root.glob("kernels/*.py"), *root.glob("experiments/*.py")]
    for path in sorted(paths):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    rows.append((lines, f"{path.relative_to(root)}:{node.name}"))
    return sorted(rows, reverse=True)


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    for lines, name in long_functions(root, limit):
        print(f"{lines:4d}  {name}")
