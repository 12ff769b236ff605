"""Infilling scores per granularity: where ctrlg, logical masking and the ILM-style model each win.

ILM's mask function masks whole units: words, n-grams, sentences, paragraphs or the whole
document. A passage is put in the group of its *coarsest* blank (document > paragraph > sentence >
n-gram > word: a passage with a sentence blank and two word blanks is a ``sentence`` passage), and
each group is scored as the benchmark is (:func:`ctrlg.tasks.infill.pipeline.score_rows`): corpus
BLEU-4 and ROUGE-L of the completed passages against the originals, ILM's as the mean over its
seeds, and the paired bootstrap of ctrlg − each baseline over the group's passages
(:func:`ctrlg.metrics.paired_bootstrap`; against ILM the mean over seeds inside each resample,
:func:`~ctrlg.tasks.infill.pipeline.method_scorer`). Scoring whole passages needs no alignment of
fills to blanks, which is ambiguous when a fragment's text also occurs inside a fill.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ctrlg import metrics
from ctrlg.tasks.infill.pipeline import METRICS, method_scorer

__all__ = ["GRANULARITY_ORDER", "coarsest_granularity", "granularity_rows"]

GRANULARITY_ORDER = ("word", "ngram", "sentence", "paragraph", "document")   # finest first


def coarsest_granularity(granularities: Sequence[str]) -> str:
    """The coarsest of a passage's blank granularities (:data:`GRANULARITY_ORDER`)."""
    return max(granularities, key=GRANULARITY_ORDER.index)


def granularity_rows(records: Sequence[dict], methods: Sequence[str],
                     ratios: Sequence[float] | None = None, resamples: int = 1000,
                     seed: int = 0) -> list[dict]:
    """One row per (coarsest granularity, method) over the records of ``ratios`` (all when
    None): passages, BLEU-4, ROUGE-L and, for the baselines, the paired bootstrap of ctrlg − it
    (``resamples`` = 0: none)."""
    selected = None if ratios is None else {float(x) for x in ratios}
    chosen = [r for r in records if "skipped" not in r
              and (selected is None or float(r["target_ratio"]) in selected)]
    rows = []
    for group in GRANULARITY_ORDER:
        done = [r for r in chosen if coarsest_granularity(r["granularities"]) == group]
        if not done:
            continue
        references = [[r["original"]] for r in done]
        scorers = {m: method_scorer(done, m, references) for m in methods}
        everything = np.arange(len(done))
        for method in methods:
            row = {"granularity": group, "method": method, "passages": len(done),
                   **scorers[method].score(everything)}
            if method != "ctrlg" and "ctrlg" in scorers and resamples and len(done) > 1:
                ci = metrics.paired_bootstrap(scorers["ctrlg"], scorers[method],
                                              num_resamples=int(resamples), seed=int(seed))
                row["ctrlg_minus"] = {m: ci[m] for m in METRICS}
            rows.append(row)
    return rows
