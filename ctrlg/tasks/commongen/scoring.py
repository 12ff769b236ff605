"""Scoring a CommonGen run: BLEU-4 / ROUGE-L / CIDEr / METEOR (the papers' units,
:data:`ctrlg.metrics.SCALES`), constraint success, keyword coverage and words per method, the
paired-bootstrap intervals of each guided method against ``bootstrap.baseline``, and the printed
tables.

May import: the library below :mod:`ctrlg.tasks` and :mod:`ctrlg.tasks.records` / :mod:`ctrlg.tasks.config`; within
this package, :mod:`~ctrlg.tasks.commongen.items`.
"""

from __future__ import annotations

from omegaconf import DictConfig

from ctrlg import metrics
from ctrlg.tasks.commongen.items import word_count
from ctrlg.tasks.records import (METRIC_NAMES, format_table, interval_cell, interval_header,
                                 paired_intervals)

__all__ = ["TABLE_COLUMNS", "TABLE_HEADERS", "score_methods", "format_intervals", "reference_words", "print_tables",
           "coco_rouge_l"]

TABLE_COLUMNS = ["method", "bleu4", "rouge_l", "cider", "meteor", "success", "keywords", "words",
                 "seconds"]

TABLE_HEADERS = ["method", "BLEU-4", "ROUGE-L", "CIDEr", "METEOR", "success %", "all words %",
                 "words", "time s"]


def score_methods(records: list[dict], methods: list[str], specs: dict, cfg) -> tuple[dict, dict]:
    """The metric table (one row per method) and the paired-bootstrap intervals of each guided
    method − ``bootstrap.baseline`` (corpus metrics recomputed on every resample of items)."""

    with_meteor = cfg.metrics.meteor in ("auto", True) and metrics.java_available()
    refs = [r["references"] or [" ".join(r["concepts"])] for r in records]
    table = {}
    for method in methods:
        hyps = [r[method]["text"] for r in records]
        row = metrics.evaluate_generations(hyps, refs, [r[method]["accepted"] for r in records],
                                           with_meteor=with_meteor)
        row["keywords"] = metrics.success_rate(
            metrics.keyword_groups_covered(r[method]["text"], r["keyword_groups"]) for r in records)
        row["words"] = sum(r[method]["words"] for r in records) / len(records)
        row["seconds"] = sum(r["seconds"][method] for r in records)
        table[method] = row
    boot = cfg.bootstrap
    baseline = boot.baseline
    compared = [m for m in methods if m != baseline and specs[m]["guide"] == "ctrlg"]
    intervals = {}
    if baseline in methods and compared and boot.resamples:
        names = [m for m in metrics.CORPUS_METRICS if m != "meteor" or with_meteor]
        session = metrics.MeteorSession() if with_meteor else None
        try:
            intervals = paired_intervals(records, refs, baseline, compared, names, boot, session)
        finally:
            if session is not None:
                session.close()
    return table, intervals


def format_intervals(intervals: dict, baseline: str, confidence: float) -> str:
    rows = []
    for method, per_metric in intervals.items():
        row = {"pair": f"{method} − {baseline}"}
        for metric, ci in per_metric.items():
            row[metric] = interval_cell(ci)
        rows.append(row)
    columns = ["pair", *METRIC_NAMES]
    headers = ["paired bootstrap", *(interval_header(m, confidence) for m in METRIC_NAMES)]
    return format_table(rows, columns, headers)


def coco_rouge_l(hypotheses: list[str], references: list[list[str]]) -> float:
    """ROUGE-L as the CommonGen evaluation computes it (pycocoevalcap's ``Rouge``: the LCS
    F-measure with β = 1.2 of the highest precision and the highest recall over the references, on
    the metrics' tokens, :func:`ctrlg.metrics.tokenize_for_eval`), × 100. ``ctrlg.metrics.rouge_l``
    is rouge-score's (best-reference F1); on CommonGen outputs the two agree to a few tenths."""
    from pycocoevalcap.rouge.rouge import Rouge  # optional metrics dependency, imported only when this metric runs

    if len(hypotheses) != len(references) or not hypotheses:
        raise metrics.MetricInputError(f"got {len(hypotheses)} hypotheses and {len(references)} "
                                       f"reference lists; need the same non-zero number")
    scorer = Rouge()
    total = sum(scorer.calc_score([metrics.tokenize_for_eval(h) or "<empty>"],
                                  [metrics.tokenize_for_eval(r) for r in refs])
                for h, refs in zip(hypotheses, references))
    return 100.0 * total / len(hypotheses)


def reference_words(records: list[dict]) -> float:
    """The mean over items of each item's mean number of words per reference."""
    return sum(sum(map(word_count, r["references"])) / max(len(r["references"]), 1)
               for r in records) / len(records)


def print_tables(table: dict, intervals: dict, methods: list[str], cfg: DictConfig,
                 ref_words: float) -> None:
    """The metric table, the references' mean words and the paired-bootstrap intervals."""
    print(format_table([{"method": m, **table[m]} for m in methods], TABLE_COLUMNS, TABLE_HEADERS))
    print(f"references: {ref_words:.2f} words on average")
    if intervals:
        print(format_intervals(intervals, cfg.bootstrap.baseline, float(cfg.bootstrap.confidence)))
