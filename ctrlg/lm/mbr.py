"""Minimum Bayes risk (MBR) selection among finished candidates (Kumar & Byrne 2004; for LM
decoding, Freitag et al. 2022).

Given candidates y_1 … y_n (the beams or samples of one input) with model scores s_i (e.g. the
LM log-likelihood log p_lm(y_i | prompt)), MBR keeps

    argmax_i  Σ_j w_j · u(y_i, y_j),        w = softmax(s / T),

the candidate of highest expected utility when the candidates themselves, weighted by the model,
stand in for the unknown reference. T = 1 weights them by the model's own posterior over the
candidate set; T → 0 gives back the plain rerank argmax_i s_i, and large T weighs the candidates
alike (consensus). The utility u here is sentence-level BLEU-4 with add-one smoothing of the 2-, 3-
and 4-gram precisions (Lin & Och 2004's BLEU+1; sacrebleu's ``add-k``, k = 1, effective order).
Its formula is sacrebleu's; this module only counts n-grams once per candidate so that the n²
comparisons are cheap.

Cost: n token lists of length L, n·m utility evaluations of O(L) each, where m ≤ n is the number
of candidates whose weight reaches ``min_weight`` (the others add at most n·min_weight to any
expected utility). At CommonGen's 128 beams and T = 1, m is typically a few dozen.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

from sacrebleu.metrics.bleu import BLEU

from ctrlg.errors import CtrlgError

__all__ = ["MBRInputError", "NgramStatistics", "sentence_bleu_plus_one", "expected_utilities",
           "mbr_pick"]

MAX_ORDER = 4


class MBRInputError(CtrlgError):
    """Candidates and scores that MBR cannot select among (none, mismatched lengths, a NaN score
    or a non-positive temperature)."""


class NgramStatistics:
    """One tokenised sentence: its length and its 1- to 4-gram counts."""

    __slots__ = ("length", "counts")

    def __init__(self, tokens: Sequence[str]):
        tokens = list(tokens)
        self.length = len(tokens)
        self.counts = [Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
                       for n in range(1, MAX_ORDER + 1)]


def sentence_bleu_plus_one(hypothesis: NgramStatistics, reference: NgramStatistics) -> float:
    """BLEU+1 of ``hypothesis`` against the single ``reference`` in [0, 1]: sacrebleu's
    ``BLEU.compute_bleu`` with ``add-k`` smoothing (k = 1, orders > 1) and effective order."""
    correct = [sum((h & r).values()) for h, r in zip(hypothesis.counts, reference.counts)]
    total = [max(hypothesis.length - n, 0) for n in range(MAX_ORDER)]
    if hypothesis.length == 0:
        return 0.0
    score = BLEU.compute_bleu(correct, total, hypothesis.length, reference.length,
                              smooth_method="add-k", smooth_value=1, effective_order=True)
    return score.score / 100.0


def _weights(scores: Sequence[float], temperature: float) -> list[float]:
    if not temperature > 0:
        raise MBRInputError(f"the MBR temperature must be > 0, got {temperature}")
    if any(math.isnan(s) for s in scores):
        raise MBRInputError("a candidate's score is NaN")
    top = max(scores)
    if top == -math.inf:
        return [1.0 / len(scores)] * len(scores)
    raw = [math.exp((s - top) / temperature) for s in scores]
    total = sum(raw)
    return [r / total for r in raw]


def expected_utilities(tokens: Sequence[Sequence[str]], scores: Sequence[float], *,
                       temperature: float = 1.0, min_weight: float = 1e-4) -> list[float]:
    """Σ_j w_j · u(y_i, y_j) for every candidate i (module docstring), counting only the
    candidates j with w_j ≥ ``min_weight`` as evidence (0: all of them)."""
    if len(tokens) != len(scores):
        raise MBRInputError(f"got {len(tokens)} candidates but {len(scores)} scores")
    if not tokens:
        raise MBRInputError("no candidates to select among")
    weights = _weights(scores, temperature)
    stats = [NgramStatistics(t) for t in tokens]
    evidence = [j for j, w in enumerate(weights) if w >= min_weight] or \
        [max(range(len(weights)), key=weights.__getitem__)]
    return [sum(weights[j] * sentence_bleu_plus_one(stats[i], stats[j]) for j in evidence)
            for i in range(len(stats))]


def mbr_pick(tokens: Sequence[Sequence[str]], scores: Sequence[float], *, temperature: float = 1.0,
             min_weight: float = 1e-4) -> int:
    """The index of the candidate of highest :func:`expected_utilities` (ties: the higher score,
    then the first)."""
    utilities = expected_utilities(tokens, scores, temperature=temperature, min_weight=min_weight)
    return max(range(len(utilities)), key=lambda i: (utilities[i], scores[i], -i))
