"""Append-only JSON-lines record files that survive damage: a run's ``generations.jsonl``.

A record file holds one JSON object per line, appended (and flushed) as each item finishes, so
an interrupted run keeps everything it finished. Two kinds of damage are expected and handled
without losing a finished record:

* a **torn last line** — the process died in the middle of a write: the last line is not a
  complete JSON object (and usually lacks its newline);
* a **corrupt line anywhere** — a disk hiccup, an editor, a stray paste: a line that is not a
  JSON object, or lacks a key the reader requires.

:func:`read_records` keeps every good line, before *and after* a bad one, and reports each bad
line by number (:class:`BadLine`). :class:`RecordWriter` starts a file from the records being
resumed without ever deleting a line it does not write back: every line of an existing file at
that path that is not among the resumed records (the bad ones, and any other) is first appended
to the **side file** ``<name>.set-aside`` next to it (:func:`set_aside_path`; one JSON object per
set-aside line: ``{"source", "line", "reason", "text", "time"}``), then the file is replaced
atomically (write a sibling temporary file, fsync, ``os.replace``) by the resumed records, and
new records are appended. A crash at any moment leaves either the old file or the new one whole.

Cost: reading is one pass over the file, O(bytes); starting a writer over an existing file is
one more read and one write of it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["BadLine", "RecordsRead", "read_records", "set_aside_path", "set_aside",
           "RecordWriter", "describe_bad_lines"]

log = logging.getLogger(__name__)

SIDE_SUFFIX = ".set-aside"


@dataclass(frozen=True)
class BadLine:
    """One line of a record file that is not a complete record: its 1-based ``number``, why
    (``reason``) and its ``text`` (undecodable bytes shown as ``\\xNN`` escapes)."""

    number: int
    reason: str
    text: str


@dataclass
class RecordsRead:
    """What :func:`read_records` found in ``path``: the good ``records`` in file order, their
    1-based line ``numbers``, and the ``bad`` lines."""

    path: Path
    records: list[dict] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


def _lines(path: Path) -> tuple[list[bytes], bool]:
    """The lines of ``path`` without their newlines, and whether the last one lacked its newline."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()          # the newline that ends the last complete line
        return lines, False
    return lines, bool(lines)


def _parse(raw: bytes, required: Sequence[str]) -> tuple[dict | None, str | None]:
    """``(record, None)`` for a good line, ``(None, reason)`` for a bad one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 ({err.reason} at byte {err.start})"
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"not JSON ({err.msg} at column {err.colno})"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    missing = [key for key in required if key not in record]
    if missing:
        return None, f"a JSON object without {', '.join(map(repr, missing))}"
    return record, None


def read_records(path: str | Path, required: Sequence[str] = ()) -> RecordsRead:
    """Every good record of the JSON-lines file ``path`` (plain, or gzip when it ends in
    ``.gz``) and every bad line (not UTF-8, not JSON, not an object, or without one of the
    ``required`` keys). A blank line is neither. A bad last line without its newline is a torn
    write; its reason says so."""
    path = Path(path)
    found = RecordsRead(path)
    raw_lines, torn = _lines(path)
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        record, reason = _parse(raw.rstrip(b"\r"), required)
        if record is not None:
            found.records.append(record)
            found.numbers.append(number)
            continue
        if torn and number == len(raw_lines):
            reason = f"torn last line, an interrupted write ({reason})"
        found.bad.append(BadLine(number, reason, raw.decode("utf-8", errors="backslashreplace")))
    return found


def describe_bad_lines(bad: Sequence[BadLine], limit: int = 5) -> str:
    """``line 3 (not JSON ...), line 9 (...)`` for the first ``limit`` bad lines, then a count."""
    shown = ", ".join(f"line {b.number} ({b.reason})" for b in bad[:limit])
    return shown + (f" and {len(bad) - limit} more" if len(bad) > limit else "")


def set_aside_path(path: str | Path) -> Path:
    """The side file of ``path``: ``generations.jsonl`` → ``generations.jsonl.set-aside``."""
    path = Path(path)
    return path.with_name(path.name + SIDE_SUFFIX)


def set_aside(path: str | Path, lines: Iterable[BadLine]) -> Path:
    """Append ``lines`` of ``path`` to its side file (:func:`set_aside_path`), flushed and
    fsynced before returning; returns the side file."""
    side = set_aside_path(path)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with open(side, "a", encoding="utf-8") as handle:
        for bad in lines:
            handle.write(json.dumps({"source": Path(path).name, "line": bad.number,
                                     "reason": bad.reason, "text": bad.text, "time": stamp},
                                    ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return side


def _dump(record: dict, default: Callable[[Any], Any] | None) -> str:
    return json.dumps(record, default=default, ensure_ascii=False)


def _canonical(record: dict, default) -> str:
    return json.dumps(record, default=default, ensure_ascii=False, sort_keys=True)


class RecordWriter:
    """Appends each record to ``path`` as one line, flushed at once, after the ``previous``
    records (those of the run being resumed, written first). Never deletes a line: any line
    already in ``path`` that is not one of ``previous`` is set aside first (module docstring),
    and a warning names the side file and the line numbers. ``default`` serialises values
    ``json`` cannot (as ``json.dumps(default=)``)."""

    def __init__(self, path: str | Path, previous: Iterable[dict] = (), *,
                 default: Callable[[Any], Any] | None = None):
        self.path = Path(path)
        self._default = default
        previous = list(previous)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._set_aside_lines_not_kept(previous)
        self._replace_with(previous)
        self._handle = open(self.path, "a", encoding="utf-8")

    def _set_aside_lines_not_kept(self, previous: list[dict]) -> None:
        kept = {_canonical(r, self._default) for r in previous}
        found = read_records(self.path)
        dropped = list(found.bad)
        for number, record in zip(found.numbers, found.records):
            if _canonical(record, self._default) not in kept:
                dropped.append(BadLine(number, "a record not among the resumed ones",
                                       _dump(record, self._default)))
        if dropped:
            dropped.sort(key=lambda b: b.number)
            side = set_aside(self.path, dropped)
            log.warning("%s: set aside %d line(s) in %s before resuming: %s", self.path,
                        len(dropped), side, describe_bad_lines(dropped))

    def _replace_with(self, records: list[dict]) -> None:
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(staging, "w", encoding="utf-8") as handle:
                for record in records:
                    handle.write(_dump(record, self._default) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(staging, self.path)
        except BaseException:
            staging.unlink(missing_ok=True)     # the old file is untouched
            raise

    def write(self, record: dict) -> None:
        self._handle.write(_dump(record, self._default) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
