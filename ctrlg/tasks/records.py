"""Run records and their tables, shared by the task pipelines and the experiments.

* a run's item records: ``generations.jsonl``, one JSON object per finished item, appended and
  flushed at once (:class:`RecordWriter`), read back whole or from a gzip-compressed copy with a
  torn last line ignored (:func:`read_records`), so an interrupted run keeps what it finished;
* result files (:func:`write_json`, :func:`write_jsonl`; numpy / torch scalars and paths as JSON);
* printed tables: a GitHub-markdown table (:func:`format_table`), paired-bootstrap intervals of
  one method against a baseline on corpus metrics (:func:`paired_intervals`,
  :func:`ctrlg.metrics.paired_bootstrap`) and their cells;
* :func:`progress`: tqdm that stays silent when stderr is not a terminal.

May import: :mod:`ctrlg.metrics` and third-party packages.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ctrlg import metrics

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


def read_records(folder: Path, records_file: str = "generations.jsonl") -> list[dict]:
    """The complete item records of a (possibly interrupted) run's ``records_file`` (plain or
    gzip-compressed: :func:`records_path`); a torn last line is ignored."""
    path = records_path(folder, records_file)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            text = handle.read()
    else:
        text = path.read_text(encoding="utf-8")
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


class RecordWriter:
    """Appends each finished item to ``path`` (``generations.jsonl``) at once, flushed, so an
    interrupted or failing run keeps everything finished before it; ``previous`` records (of
    the run being resumed) are written first."""

    def __init__(self, path: Path, previous: Iterable[dict] = ()):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("w", encoding="utf-8")
        for record in previous:
            self.write(record)

    def write(self, record: dict) -> None:
        self._handle.write(json.dumps(record, default=_jsonable, ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
