"""Run records and their tables, shared by the task pipelines and the experiments.

* a run's item records: ``generations.jsonl``, one JSON object per finished item, appended and
  flushed at once by the one writer the run folder's lock admits (:class:`RecordWriter`), read
  back whole or from a gzip-compressed copy (:func:`read_records`); a torn or corrupt line, and
  on a resume a record of the wrong shape, of an item the run does not select or repeating one,
  is skipped with a warning and set aside when the file is resumed, never deleted
  (:mod:`ctrlg.tasks.record_files`);
* result files (:func:`write_json`, :func:`write_jsonl`; numpy / torch scalars and paths as JSON);
* printed tables: a GitHub-markdown table (:func:`format_table`), paired-bootstrap intervals of
  one method against a baseline on corpus metrics (:func:`paired_intervals`,
  :func:`ctrlg.metrics.paired_bootstrap`) and their cells;
* :func:`progress`: tqdm that stays silent when stderr is not a terminal.

May import: :mod:`ctrlg.metrics`, :mod:`ctrlg.tasks.record_files` and third-party packages.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ctrlg import metrics
from ctrlg.tasks import record_files

log = logging.getLogger(__name__)

__all__ = ["write_json", "write_jsonl", "records_path", "read_records", "RecordWriter", "format_table", "METRIC_NAMES", "paired_intervals", "interval_cell", "interval_header", "progress"]


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    return path


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, default=_jsonable, ensure_ascii=False) + "\n")
    return path


def records_path(folder: Path, records_file: str = "generations.jsonl") -> Path:
    """``folder / records_file``, or its gzip-compressed copy ``records_file + ".gz"`` when only
    that exists (how finished runs are kept in the repository, e.g.
    ``benchmarks/results/commongen/``); the plain name when neither exists."""
    plain = Path(folder) / records_file
    packed = plain.with_name(plain.name + ".gz")
    return packed if not plain.exists() and packed.exists() else plain


def read_records(folder: Path, records_file: str = "generations.jsonl", *,
                 schema: record_files.RecordSchema | None = None, selection=None) -> list[dict]:
    """The complete item records of a (possibly interrupted or damaged) run's ``records_file``
    (plain or gzip-compressed: :func:`records_path`): every good line, also after a bad one, and
    every line before a gzip stream breaks off (:func:`ctrlg.tasks.record_files.read_records`).
    A run that resumes gives its ``schema`` (:class:`~ctrlg.tasks.record_files.RecordSchema`:
    fields, types, the key naming the item) and ``selection`` (the keys of the items it
    selects): a record that does not fit, one of another item, or a second one of the same item
    is bad too. Each bad line (a torn last line, a corrupt line, a misfit) is skipped with a
    warning naming the file, its line numbers and reasons; :class:`RecordWriter` sets such lines
    aside when it rewrites the file."""
    path = records_path(folder, records_file)
    found = record_files.read_records(path, required=("index",), schema=schema,
                                      selection=selection)
    if found.bad:
        log.warning("%s: %d line(s) are not complete records of this run and were skipped (%d "
                    "good records kept): %s; resuming in place sets them aside in %s", path,
                    len(found.bad), len(found.records), record_files.describe_bad_lines(found.bad),
                    record_files.set_aside_path(path))
    return found.records


class RecordWriter(record_files.RecordWriter):
    """Appends each finished item to ``path`` (``generations.jsonl``) at once, flushed, so an
    interrupted or failing run keeps everything finished before it; ``previous`` records (of
    the run being resumed) are written first, and any other line already in ``path`` is set
    aside, never deleted, with the reason (``schema`` / ``selection``: :func:`read_records`).
    Holds the run folder's lock while open: a second writer there is refused, naming the
    holder (:class:`ctrlg.tasks.record_files.RecordWriter`)."""

    def __init__(self, path: Path, previous: Iterable[dict] = (), *,
                 schema: record_files.RecordSchema | None = None, selection=None,
                 lock_wait: float = 0.0):
        super().__init__(path, previous, default=_jsonable, schema=schema, selection=selection,
                         lock_wait=lock_wait)


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(rows: Sequence[dict], columns: Sequence[str], headers: Sequence[str] | None = None) -> str:
    """A GitHub-markdown table of ``rows`` (dicts) restricted to ``columns``; floats with 2 decimals,
    None as an en dash."""
    headers = list(headers or columns)
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)

METRIC_NAMES = {"bleu4": "BLEU-4", "rouge_l": "ROUGE-L", "cider": "CIDEr", "meteor": "METEOR"}


def paired_intervals(records: Sequence[dict], references: Sequence[Sequence[str]], baseline: str,
                     compared: Sequence[str], names: Sequence[str], boot,
                     meteor_session=None) -> dict[str, dict]:
    """``{method: metrics.paired_bootstrap(method − baseline)}`` for each method in ``compared``,
    on the corpus metrics ``names``, each method's outputs being ``record[method]["text"]``;
    ``boot`` holds the ``bootstrap.*`` settings (resamples, seed, confidence)."""
    scorer = lambda m: metrics.CorpusScorer(  # noqa: E731
        [r[m]["text"] for r in records], references, names, meteor_session=meteor_session)
    base = scorer(baseline)
    return {method: metrics.paired_bootstrap(scorer(method), base,
                                             num_resamples=int(boot.resamples), seed=int(boot.seed),
                                             confidence=float(boot.confidence))
            for method in compared}


def interval_cell(ci: dict) -> str:
    """One interval as printed: ``+Δ [+low, +high]``."""
    return f"{ci['delta']:+.2f} [{ci['low']:+.2f}, {ci['high']:+.2f}]"


def interval_header(metric: str, confidence: float) -> str:
    return f"{METRIC_NAMES[metric]} ({100 * confidence:.0f} % CI)"


def progress(iterable, **kwargs):
    """tqdm that stays silent when stderr is not a terminal (logs, CI, tests)."""
    kwargs.setdefault("disable", not sys.stderr.isatty())
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs)
