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

Cost: n token lists of length L, and the n × m utilities at once (:func:`utility_matrix`), where
m ≤ n is the number of candidates whose weight reaches ``min_weight`` (the others add at most
n·min_weight to any expected utility). The clipped matches of every pair come from a few matrix
products: with c_i(g) the count of n-gram g in y_i, Σ_g min(c_i(g), c_j(g)) = Σ_{k ≥ 1}
Σ_g [c_i(g) ≥ k]·[c_j(g) ≥ k], one product of sparse 0/1 matrices per k up to the largest count (1–3 for
sentences), so 128 beams against 128 take milliseconds instead of 16,384 Python-level BLEU calls.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np
from sacrebleu.metrics.bleu import BLEU
from scipy import sparse

from ctrlg.errors import CtrlgError

__all__ = ["MBRInputError", "NgramStatistics", "sentence_bleu_plus_one", "utility_matrix",
           "expected_utilities", "mbr_pick"]

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


def _clipped_matches(hypotheses: Sequence[Counter], references: Sequence[Counter]) -> np.ndarray:
    """[n, m]: Σ_g min(h_i(g), r_j(g)) for every pair, as Σ_k [h ≥ k]·[r ≥ k]ᵀ (module docstring),
    over sparse 0/1 matrices (a sentence holds a dozen of the item's hundreds of n-grams)."""
    index: dict = {}
    for counts in (*hypotheses, *references):
        for gram in counts:
            index.setdefault(gram, len(index))
    total = np.zeros((len(hypotheses), len(references)))
    top = min(max((max(c.values(), default=0) for c in hypotheses), default=0),
              max((max(c.values(), default=0) for c in references), default=0))
    for k in range(1, top + 1):
        at_least = [_indicator(rows, index, k) for rows in (hypotheses, references)]
        total += (at_least[0] @ at_least[1].T).toarray()
    return total


def _indicator(rows: Sequence[Counter], index: dict, k: int) -> sparse.csr_matrix:
    """[len(rows), len(index)] 0/1: whether row i holds n-gram g at least k times."""
    cells = [(i, index[gram]) for i, counts in enumerate(rows) for gram, c in counts.items() if c >= k]
    data = np.ones(len(cells))
    row_ids = np.fromiter((i for i, _ in cells), dtype=np.int64, count=len(cells))
    col_ids = np.fromiter((g for _, g in cells), dtype=np.int64, count=len(cells))
    return sparse.csr_matrix((data, (row_ids, col_ids)), shape=(len(rows), max(len(index), 1)))


def utility_matrix(hypotheses: Sequence[NgramStatistics],
                   references: Sequence[NgramStatistics]) -> np.ndarray:
    """[n, m]: :func:`sentence_bleu_plus_one` of every hypothesis against every reference, computed
    at once (the same formula: p_1 = matches / guesses, p_k = (matches + 1) / (guesses + 1) for
    k > 1, geometric mean times the brevity penalty; 0 when no unigram matches or the hypothesis
    is empty)."""
    hyp_len = np.array([h.length for h in hypotheses], dtype=np.float64)[:, None]
    ref_len = np.array([r.length for r in references], dtype=np.float64)[None, :]
    log_precision = np.zeros((len(hypotheses), len(references)))
    unigram_matches = None
    for n in range(MAX_ORDER):
        matches = _clipped_matches([h.counts[n] for h in hypotheses], [r.counts[n] for r in references])
        guesses = np.maximum(hyp_len - n, 0.0)
        if n == 0:
            unigram_matches = matches
            log_precision += np.log(np.maximum(matches, 1.0) / np.maximum(guesses, 1.0))
        else:
            log_precision += np.log((matches + 1.0) / (guesses + 1.0))
    score = np.exp(log_precision / MAX_ORDER)
    with np.errstate(divide="ignore"):
        brevity = np.where(hyp_len < ref_len, np.exp(1.0 - ref_len / np.maximum(hyp_len, 1e-300)), 1.0)
    return np.where((unigram_matches > 0) & (hyp_len > 0), brevity * score, 0.0)


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
    utilities = utility_matrix(stats, [stats[j] for j in evidence])
    return (utilities @ np.array([weights[j] for j in evidence])).tolist()


def mbr_pick(tokens: Sequence[Sequence[str]], scores: Sequence[float], *, temperature: float = 1.0,
             min_weight: float = 1e-4) -> int:
    """The index of the candidate of highest :func:`expected_utilities` (ties: the higher score,
    then the first)."""
    utilities = expected_utilities(tokens, scores, temperature=temperature, min_weight=min_weight)
    return max(range(len(utilities)), key=lambda i: (utilities[i], scores[i], -i))
