"""Locating bundled data files (shipped inside the package under ``ctrlg/data/bundled``)."""

from __future__ import annotations

import json
from pathlib import Path

from ctrlg.errors import CtrlgError

__all__ = ["BUNDLED_DIR", "BUNDLED", "DatasetError", "bundled_path", "data_path", "read_jsonl"]

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


class DatasetError(CtrlgError):
    """A dataset file that is missing, malformed, or an invalid reader argument."""


def bundled_path(name: str) -> Path:
    """Path of a bundled data file; raises DatasetError naming the file when it is absent."""
    path = BUNDLED_DIR / name
    if not path.is_file():
        raise DatasetError(f"bundled data file {name!r} not found under {BUNDLED_DIR}")
    return path


BUNDLED = "bundled:"           # prefix of a path that names a bundled data file


def data_path(path) -> Path:
    """``path`` as a Path; ``"bundled:<name>"`` names a bundled file (:func:`bundled_path`)."""
    if isinstance(path, str) and path.startswith(BUNDLED):
        return bundled_path(path[len(BUNDLED):])
    return Path(path)


def read_jsonl(path, limit: int | None = None) -> list[dict]:
    """Rows of a JSON-lines file (blank lines skipped), at most ``limit`` of them."""
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be None or >= 0, got {limit}")
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"data file {str(path)!r} does not exist")
    rows: list[dict] = []
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if limit is not None and len(rows) >= limit:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DatasetError(f"{path}:{line_number} is not valid UTF-8 text (byte "
                                   f"{raw[error.start]:#04x} at column {error.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DatasetError(f"{path}:{line_number} is not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{line_number} is not a JSON object")
            rows.append(row)
    return rows
