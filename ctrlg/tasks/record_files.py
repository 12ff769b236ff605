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

A **resumed** run also checks each record against what the run expects (a
:class:`RecordSchema`: the fields and their JSON types, the key that names the item, an extra
check) and against its ``selection`` (the keys of the items the run selects): a record of the
wrong shape (``{"index": "1"}``, one without ``references``), one of an item the run does not
select, or a second record of the same item (the first is kept) is a bad line like the others,
set aside with its reason. A gzip copy that ends early (a truncated download or copy) keeps every
line before the break.

**One writer per run folder.** A :class:`RecordWriter` holds an exclusive lock on its folder
(:func:`lock_run_folder`: ``flock`` on ``.ctrlg-run.lock``, which names the holder — pid, host,
start time, command) for as long as it is open: a second writer, in this process or another,
is refused with an error naming the holder (or waits up to ``lock_wait`` seconds). The kernel
drops the lock when its process dies, so a lock left by a killed run never blocks. A writer
whose file was nevertheless replaced under it (outside ctrlg) stops with an error and puts the
record it was writing in the side file instead of losing it.

Cost: reading is one pass over the file, O(bytes); starting a writer over an existing file is
one more read and one write of it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ctrlg.errors import ExperimentConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock (documented)
    fcntl = None

__all__ = ["BadLine", "RecordsRead", "RecordSchema", "missing_seconds", "read_records",
           "set_aside_path", "set_aside", "RecordWriter", "describe_bad_lines", "lock_run_folder",
           "RunLock", "LOCK_NAME"]

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


def _read_bytes(path: Path) -> tuple[bytes, str | None]:
    """The bytes of ``path`` (gunzipped when it ends in ``.gz``) and, for a gzip stream that
    breaks off (truncated, or corrupt past some point), why. The stream is inflated in small
    pieces (zlib), so what came before the break is kept (``gzip.open`` raises ``EOFError`` and
    returns nothing of the read that meets it); concatenated members are read one after the
    other."""
    data = path.read_bytes()
    if path.suffix != ".gz":
        return data, None
    out: list[bytes] = []
    inflater = zlib.decompressobj(wbits=31)
    piece = 4096
    try:
        for start in range(0, len(data), piece):
            chunk = data[start:start + piece]
            while chunk:
                out.append(inflater.decompress(chunk))
                if not inflater.eof:
                    break
                chunk = inflater.unused_data             # the next gzip member
                inflater = zlib.decompressobj(wbits=31) if chunk else inflater
        out.append(inflater.flush())
    except zlib.error as err:
        return b"".join(out), f"the gzip stream breaks off (corrupt data: {err})"
    if not inflater.eof:
        return b"".join(out), "the gzip stream breaks off (the file ends before the stream does)"
    return b"".join(out), None


def _lines(path: Path) -> tuple[list[bytes], bool, str | None]:
    """The lines of ``path`` without their newlines, whether the last one lacked its newline,
    and why the file ends early (a broken gzip stream), if it does."""
    data, broken = _read_bytes(path)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()          # the newline that ends the last complete line
        return lines, False, broken
    return lines, bool(lines), broken


@dataclass(frozen=True)
class RecordSchema:
    """What each record of a run must be (module docstring): ``fields`` maps a field to its
    JSON type(s) (``int`` is never a bool), ``key`` names the fields that identify the item
    (one record per key), and ``check(record)`` returns a reason the record is unusable, or
    None (e.g. the item's concepts differ from the data's)."""

    fields: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)
    key: tuple[str, ...] = ("index",)
    check: Callable[[dict], str | None] | None = None

    def key_of(self, record: dict):
        """The record's key: the value of its one key field, or a tuple of them."""
        values = tuple(record[k] for k in self.key)
        return values[0] if len(values) == 1 else values

    def problem(self, record: dict) -> str | None:
        """Why ``record`` does not fit the schema, or None."""
        for name in (*self.key, *self.fields):
            if name not in record:
                return f"a record without {name!r}"
        for name, kinds in self.fields.items():
            kinds = kinds if isinstance(kinds, tuple) else (kinds,)
            value = record[name]
            wrong_bool = isinstance(value, bool) and bool not in kinds
            if wrong_bool or not isinstance(value, kinds):
                expected = " or ".join(k.__name__ for k in kinds)
                return (f"{name!r} is a {type(value).__name__} ({_short(value)}), not "
                        f"a {expected}")
        return self.check(record) if self.check is not None else None


def missing_seconds(record: dict, names: Sequence[str]) -> str | None:
    """For a schema's ``check``: a reason when ``record["seconds"]`` lacks a number for one of
    ``names`` (the methods or variants timed), else None."""
    seconds = record.get("seconds")
    missing = [n for n in names
               if not isinstance(seconds, dict) or type(seconds.get(n)) not in (int, float)]
    return f"no seconds of {', '.join(missing)}" if missing else None


def _short(value, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


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


def read_records(path: str | Path, required: Sequence[str] = (), *,
                 schema: RecordSchema | None = None, selection=None) -> RecordsRead:
    """Every good record of the JSON-lines file ``path`` (plain, or gzip when it ends in
    ``.gz``) and every bad line (not UTF-8, not JSON, not an object, or without one of the
    ``required`` keys). A blank line is neither. A bad last line without its newline is a torn
    write; its reason says so; a gzip stream that breaks off keeps every line before the break
    and adds one bad line saying where it broke. With ``schema``, a record that does not fit it
    (:meth:`RecordSchema.problem`) and a second record of the same key are bad lines too; with
    ``selection`` (the keys of the items the run selects), so is a record of another item."""
    path = Path(path)
    found = RecordsRead(path)
    selection = None if selection is None else {_typed(key) for key in selection}
    raw_lines, torn, broken = _lines(path)
    first_of: dict = {}
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        record, reason = _parse(raw.rstrip(b"\r"), required)
        if record is not None and (schema is not None or selection is not None):
            reason = _misfit(record, schema or RecordSchema(), selection, first_of, number)
            record = None if reason else record
        if record is not None:
            found.records.append(record)
            found.numbers.append(number)
            continue
        if torn and number == len(raw_lines):
            reason = (f"torn last line, {broken}" if broken
                      else f"torn last line, an interrupted write ({reason})")
        found.bad.append(BadLine(number, reason, raw.decode("utf-8", errors="backslashreplace")))
    if broken and not torn:
        found.bad.append(BadLine(len(raw_lines) + 1, f"{broken} after line {len(raw_lines)}: "
                                 f"whatever followed is lost", ""))
    return found


def _misfit(record: dict, schema: RecordSchema, selection, first_of: dict,
            number: int) -> str | None:
    """Why a parsed record is not one the run can use (schema, selection, a repeated key), or
    None; records the first line of each key in ``first_of``."""
    reason = schema.problem(record)
    if reason:
        return reason
    key = schema.key_of(record)
    try:
        hash(key)
    except TypeError:
        return f"its key {_short(key)} is not a plain value"
    shown = ", ".join(f"{k} {_short(record[k])}" for k in schema.key)
    if selection is not None and _typed(key) not in selection:
        return f"{shown} is not among the items this run selects"
    if key in first_of:
        return f"a second record of {shown} (line {first_of[key]} holds the first, kept)"
    first_of[key] = number
    return None


def _typed(key):
    """``key`` with the type of each part, so that ``True`` or ``1.0`` is not the item ``1``."""
    if isinstance(key, tuple):
        return tuple(_typed(part) for part in key)
    return type(key).__name__, key


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


LOCK_NAME = ".ctrlg-run.lock"


@dataclass
class RunLock:
    """An exclusive lock on a run folder (:func:`lock_run_folder`); :meth:`release` it (or use
    it as a context manager)."""

    folder: Path
    handle: Any = None

    def release(self) -> None:
        """Remove the lock file while still holding it, then drop the lock (a waiting process
        that opened the removed file notices and opens the new one: :func:`lock_run_folder`)."""
        if self.handle is None:
            return
        try:
            if _same_file(self.folder / LOCK_NAME, self.handle):
                (self.folder / LOCK_NAME).unlink()
        except OSError:
            pass
        self.handle.close()              # closing the descriptor drops the flock
        self.handle = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(path: Path, handle) -> bool:
    """Whether ``path`` still names the file open as ``handle``."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def _holder_text() -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "command": " ".join(sys.argv)[:300]}, ensure_ascii=False)


def _describe_holder(lock_file: Path) -> str:
    try:
        info = json.loads(lock_file.read_text(encoding="utf-8"))
        where = "this process" if (info.get("pid") == os.getpid()
                                   and info.get("host") == socket.gethostname()) else "another process"
        return (f"pid {info.get('pid')} on {info.get('host')} ({where}), since "
                f"{info.get('since')}: {info.get('command') or '?'}")
    except (OSError, ValueError, AttributeError):
        return "a process that has not written its name yet"


def lock_run_folder(folder: str | Path, *, wait: float = 0.0) -> RunLock:
    """An exclusive lock on ``folder`` (module docstring): ``flock`` on its ``.ctrlg-run.lock``,
    whose text then names this process; the file is removed again on release. ExperimentConfigError
    naming the holder when another writer holds it (this process's own included) after waiting
    ``wait`` seconds. The kernel releases the lock of a process that dies, so a lock file left
    by a killed run never blocks. On a system or file system without ``flock`` no lock is taken
    (a warning says so)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock_file = folder / LOCK_NAME
    deadline = time.monotonic() + max(float(wait), 0.0)
    while True:
        handle = open(lock_file, "a+", encoding="utf-8")
        if fcntl is None:  # pragma: no cover - not POSIX
            log.warning("%s: no file locks on this system; two writers could mix their "
                        "records", folder)
            return RunLock(folder, handle)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                log.warning("%s: cannot lock the run folder (%s); continuing without a lock",
                            folder, err.strerror or err)
                return RunLock(folder, handle)
            handle.close()
            if time.monotonic() >= deadline:
                raise ExperimentConfigError(
                    f"the run folder {folder} is in use: another writer holds its lock "
                    f"({_describe_holder(lock_file)}); wait until it finishes, or write this "
                    f"run to another folder (a killed run's lock is released at once)") from None
            time.sleep(0.1)
            continue
        if _same_file(lock_file, handle):        # not removed by a releasing holder meanwhile
            break
        handle.close()
    handle.seek(0)
    handle.truncate()
    handle.write(_holder_text() + "\n")
    handle.flush()
    return RunLock(folder, handle)


class RecordWriter:
    """Appends each record to ``path`` as one line, flushed at once, after the ``previous``
    records (those of the run being resumed, written first). Never deletes a line: any line
    already in ``path`` that is not one of ``previous`` is set aside first (module docstring),
    and a warning names the side file and the line numbers — with ``schema`` / ``selection``
    (:func:`read_records`) each with the reason the resume left it out. ``default`` serialises
    values ``json`` cannot (as ``json.dumps(default=)``). Holds the lock of ``path``'s folder
    while open (:func:`lock_run_folder`, waiting up to ``lock_wait`` seconds for it)."""

    def __init__(self, path: str | Path, previous: Iterable[dict] = (), *,
                 default: Callable[[Any], Any] | None = None, schema: RecordSchema | None = None,
                 selection=None, lock_wait: float = 0.0):
        self.path = Path(path)
        self._default = default
        previous = list(previous)
        self._lock = lock_run_folder(self.path.parent, wait=lock_wait)
        try:
            if self.path.exists():
                self._set_aside_lines_not_kept(previous, schema, selection)
            self._replace_with(previous)
            self._handle = open(self.path, "a", encoding="utf-8")
            self._inode = os.fstat(self._handle.fileno()).st_ino
        except BaseException:
            self._lock.release()
            raise

    def _set_aside_lines_not_kept(self, previous: list[dict], schema, selection) -> None:
        kept = {_canonical(r, self._default) for r in previous}
        found = read_records(self.path, schema=schema, selection=selection)
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
        """Append ``record``; ExperimentConfigError (the record set aside, not lost) when the
        file this writer appends to is no longer the one at ``path``."""
        line = _dump(record, self._default)
        try:
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            current = None
        if current != self._inode:
            side = set_aside(self.path, [BadLine(0, "written after the file was replaced or "
                                                    "removed by someone else", line)])
            raise ExperimentConfigError(
                f"{self.path} was replaced or removed while this run was appending to it (by "
                f"something other than ctrlg's writer, which locks the folder); the record is "
                f"kept in {side}; nothing more is written")
        self._handle.write(line + "\n")
        self._handle.flush()

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()
        self._lock.release()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
