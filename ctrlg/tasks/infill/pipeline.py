"""Text infilling as Ctrl-G ran it (§4.2, Table 2): masks, methods, records and scores.

Items. Each evaluated passage is masked once per target ratio with ILM's hierarchical mask
function (:func:`ctrlg.data.mask_document`); the per-unit probability p of each ratio is the one
whose mean masked-*character* ratio over the evaluated passages equals the target
(:func:`calibrate`: bisection with common random numbers; a draw that masks nothing is redrawn
with the next seed, in calibration as in use). The mask function is part of the benchmark, not of
any method, so calibrating on the evaluated passages themselves is what makes the reached ratio
hold on any corpus. ILM's masks take whole units (a sentence, a paragraph), so the mean ratio of
a few passages moves in steps as p moves, and the closest p can still miss the target by
several points (15 passages: 35.8 % at 32 %). :func:`calibrate_masks` then redraws the
selection's masks, every passage with a new seed, and calibrates again, until the mean lies
within :data:`RATIO_TOLERANCE` of the target (rejection sampling: the masks are ILM's, conditioned
on their mean ratio; at most :data:`MAX_SELECTION_DRAWS` draws, then the closest). The first
draw is the plain calibration, so a selection that already reached its target keeps its masks.

Methods (:data:`METHODS`), all completing the same masked passages:

* ``ctrlg`` — the story LM (plain LM on passages, prompt = BOS) writes the whole passage under the
  infilling constraint (:mod:`ctrlg.tasks.infill.constraint`), guided by the HMM distilled from it;
  ``generation.num_samples`` samples drawn with :func:`ctrlg.fast_forward.sample_fast_forward`
  (forced fragment tokens fed in one LM pass), the one the LM finds most likely kept;
* ``logical`` — the same LM, constraint and sampling, with logical masking (no HMM);
* ``ilm`` — the ILM-style supervised model (:mod:`ctrlg.tasks.infill.ilm_decoding`),
  ``ilm.seeds`` independent samples (the paper's seeds; drawn as the rows of one batch; the
  record's ``ilm`` is the first, ``ilm_seeds`` holds all).

Scores: BLEU-4 and ROUGE-L (× 100, :mod:`ctrlg.metrics`) of the completed passage against the
original, per ratio; ILM's as mean ± sd over its seeds; paired bootstrap intervals of ctrlg −
baseline (against ILM: the mean over seeds of its corpus score in each resample, :class:`SeedMean`).
Success: the completion checked with Python's ``re`` (:func:`~ctrlg.tasks.infill.constraint.completion_ok`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ctrlg import metrics
from ctrlg.data.infill_mask import MaskedDocument, mask_document, mask_ratio
from ctrlg.errors import ExperimentConfigError
from ctrlg.fast_forward import build_guide, sample_fast_forward
from ctrlg.tasks.infill.constraint import build_constraint, completion_ok
from ctrlg.tasks.infill.ilm_decoding import ilm_fill
from ctrlg.data.story_prompts import bos_text

__all__ = ["METHODS", "METRICS", "RATIO_TOLERANCE", "MAX_SELECTION_DRAWS", "MaskCalibration",
           "mask_passage", "calibrate", "calibrate_masks",
           "check_passages", "guided_completion", "ilm_completions", "method_scorer", "score_rows", "SeedMean",
           "interval_rows"]

METHODS = ("logical", "ilm", "ctrlg")
METRICS = ("bleu4", "rouge_l")
MAX_REDRAWS = 64
#: how far the evaluated passages' mean masked-character ratio may lie from its target (one point)
RATIO_TOLERANCE = 0.01
#: draws of a selection's masks (each with new seeds) before :func:`calibrate_masks` keeps the closest
MAX_SELECTION_DRAWS = 32
#: how far apart the seeds of two draws of a selection start (a prime, far above any selection)
SELECTION_SEED_STRIDE = 104_729


def mask_passage(text: str, p: float, seed: int, max_ngram: int = 8) -> MaskedDocument:
    """ILM's mask of ``text`` with probability ``p`` and ``seed``; a draw that masks nothing is
    redrawn with the next seeds (at most :data:`MAX_REDRAWS` times, then the last draw)."""
    for attempt in range(MAX_REDRAWS):
        document = mask_document(text, p, seed + 7_919 * attempt, max_ngram)
        if document.spans:
            return document
    return document


def calibrate(texts: Sequence[str], target: float, seed: int, max_ngram: int = 8,
              iterations: int = 18) -> float:
    """The p whose mean masked-character ratio of :func:`mask_passage` over ``texts`` (passage i
    with seed ``seed + i``) is closest to ``target`` (bisection)."""
    if not 0 < target < 1:
        raise ExperimentConfigError(f"a mask ratio must lie in (0, 1), got {target}")

    low, high = 1e-4, 1.0
    for _ in range(iterations):
        middle = (low + high) / 2
        low, high = (middle, high) if _mean_ratio(_masks(texts, middle, seed, max_ngram)) < target else (low, middle)
    return (low + high) / 2


def _masks(texts: Sequence[str], p: float, seed: int, max_ngram: int) -> list[MaskedDocument]:
    """Passage i of ``texts`` masked by :func:`mask_passage` with ``p`` and seed ``seed + i``."""
    return [mask_passage(t, p, seed + i, max_ngram) for i, t in enumerate(texts)]


def _mean_ratio(documents: Sequence[MaskedDocument]) -> float:
    return float(np.mean([mask_ratio(d) for d in documents]))


@dataclass(frozen=True)
class MaskCalibration:
    """A selection's masks for one target: probability ``p``; ``documents``, passage i of the
    selection masked with seed ``seed + i``; ``reached`` their mean masked-character ratio;
    ``draws`` how many draws it took (1: the plain calibration)."""

    p: float
    seed: int
    reached: float
    draws: int
    documents: tuple[MaskedDocument, ...]


def calibrate_masks(texts: Sequence[str], target: float, seed: int, max_ngram: int = 8,
                    tolerance: float = RATIO_TOLERANCE, draws: int = MAX_SELECTION_DRAWS) -> MaskCalibration:
    """The masks of ``texts`` for ``target``: :func:`calibrate` with seeds ``seed + i``, and while
    the mean ratio misses the target by more than ``tolerance``, again with the seeds of the next
    draw (``seed + SELECTION_SEED_STRIDE · draw + i``); after ``draws`` draws the closest."""
    best = None
    for draw in range(max(1, draws)):
        draw_seed = seed + SELECTION_SEED_STRIDE * draw
        p = calibrate(texts, target, draw_seed, max_ngram)
        documents = tuple(_masks(texts, p, draw_seed, max_ngram))
        reached = _mean_ratio(documents)
        if best is None or abs(reached - target) < abs(best.reached - target):
            best = MaskCalibration(p, draw_seed, reached, draw + 1, documents)
        if abs(reached - target) <= tolerance:
            break
    return dataclasses.replace(best, draws=draw + 1)


def check_passages(texts: Sequence[str], indices: Sequence[int], source: str) -> None:
    """ExperimentConfigError naming a passage that cannot be masked: empty, not valid text (a lone
    surrogate), or without a word."""
    for index, text in zip(indices, texts):
        if not text.strip():
            raise ExperimentConfigError(f"{source}: passage {index} is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ExperimentConfigError(f"{source}: passage {index} is not valid UTF-8 text") from None
        if not any(ch.isalnum() for ch in text):
            raise ExperimentConfigError(f"{source}: passage {index} has no word to mask")


@dataclass
class Completion:
    """A completed passage. For the guided methods also: ``lm_calls`` summed over the samples,
    ``forwards`` the LM forwards of the batch (the most any sample took part in),
    ``free_tokens`` the mean tokens per sample that were a choice (not forced), and
    ``phase_seconds`` the seconds of building the constraint, the guide's tables and sampling."""

    text: str
    accepted: bool
    seconds: float
    samples: int = 1
    lm_calls: int = 0
    lm_log_likelihood: float = float("nan")
    forwards: int = 0
    free_tokens: float = float("nan")
    phase_seconds: dict = field(default_factory=dict)


def guided_completion(model, tokenizer, document: MaskedDocument, *, hmm, eos_token_id: int,
                      num_samples: int, seed: int, temperature: float = 1.0, strength: float = 1.0,
                      precision: str = "float32", bos_token: str | None = "<|endoftext|>",
                      vocab_size: int | None = None) -> Completion:
    """``num_samples`` samples of the whole passage under its constraint (``hmm=None``: logical
    masking), the one with the highest log p_lm kept."""
    start = time.perf_counter()
    V = vocab_size or len(tokenizer)
    constraint = build_constraint(document, tokenizer, V, eos_token_id)
    prompt = tokenizer(bos_text(tokenizer, bos_token), add_special_tokens=False)["input_ids"]
    built = time.perf_counter()
    table = build_guide(constraint.dfa, constraint.budget, hmm=hmm, eos_token_id=eos_token_id,
                        precision=precision)
    tabled = time.perf_counter()
    samples = sample_fast_forward(model, prompt, constraint.dfa, hmm=hmm,
                                  num_samples=num_samples, max_new_tokens=constraint.budget,
                                  eos_token_id=eos_token_id, strength=strength,
                                  temperature=temperature, seed=seed, table=table)
    sampled = time.perf_counter()
    best = max(samples, key=lambda s: s.lm_log_likelihood)
    ids = best.token_ids[:-1] if best.token_ids and best.token_ids[-1] == eos_token_id else best.token_ids
    text = tokenizer.decode(ids)
    ok = best.accepted and completion_ok(document, text)
    return Completion(text, ok, time.perf_counter() - start, num_samples,
                      sum(s.lm_calls for s in samples), best.lm_log_likelihood,
                      forwards=max(s.lm_calls for s in samples),
                      free_tokens=float(np.mean([len(s.token_ids) - s.forced for s in samples])),
                      phase_seconds={"constraint": built - start, "tables": tabled - built,
                                     "sampling": sampled - tabled})


def ilm_completions(model, tokenizer, document: MaskedDocument, *, samples: int, seed: int,
                    max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                    eos_ids=()) -> list[Completion]:
    """``samples`` independent ILM samples, drawn in one batch (the rows of one ``generate`` call
    are independent draws: the paper's "5 seeds" are 5 such samples); each row's seconds are the
    batch's divided by ``samples``."""
    start = time.perf_counter()
    fills = ilm_fill(model, tokenizer, document, max_new_tokens=max_new_tokens, seed=seed,
                     num_samples=samples, temperature=temperature, top_p=top_p, eos_ids=eos_ids)
    seconds = (time.perf_counter() - start) / samples
    return [Completion(fill.text, fill.accepted, seconds) for fill in fills]


class SeedMean:
    """A :class:`ctrlg.metrics.CorpusScorer`-like object scoring the mean over several seeds'
    corpus scores of the same items (ILM's mean over seeds, inside each bootstrap resample)."""

    def __init__(self, scorers: Sequence[metrics.CorpusScorer]):
        self.scorers = list(scorers)
        self.size = self.scorers[0].size
        self.metrics = self.scorers[0].metrics

    def score(self, indices) -> dict[str, float]:
        scores = [s.score(indices) for s in self.scorers]
        return {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}


def _texts(records: Sequence[dict], method: str, seed: int | None = None) -> list[str]:
    if seed is None:
        return [r[method]["text"] for r in records]
    return [r[f"{method}_seeds"][seed]["text"] for r in records]


def method_scorer(records: Sequence[dict], method: str, references):
    """The corpus scorer of ``method``'s completions of ``records``: a :class:`SeedMean` over the
    seeds of a method that keeps several (ILM's ``ilm_seeds``), else one
    :class:`~ctrlg.metrics.CorpusScorer`."""
    seeds = f"{method}_seeds"
    if seeds in records[0]:
        return SeedMean([metrics.CorpusScorer(_texts(records, method, k), references, METRICS)
                         for k in range(len(records[0][seeds]))])
    return metrics.CorpusScorer(_texts(records, method), references, METRICS)


def score_rows(records: Sequence[dict], ratios: Sequence[float], methods: Sequence[str]) -> list[dict]:
    """One row per (ratio, method): BLEU-4 / ROUGE-L (ILM: mean and sd over seeds), success %,
    seconds per passage, the reached mask ratio."""
    rows = []
    for target in ratios:
        done = [r for r in records if r["target_ratio"] == float(target) and "skipped" not in r]
        if not done:
            continue
        references = [[r["original"]] for r in done]
        reached = 100 * float(np.mean([r["mask_ratio"] for r in done]))
        for method in methods:
            if method == "ilm":
                seeds = len(done[0]["ilm_seeds"])
                per_seed = [metrics.CorpusScorer(_texts(done, "ilm", k), references, METRICS)
                            .score(range(len(done))) for k in range(seeds)]
                row = {m: float(np.mean([s[m] for s in per_seed])) for m in METRICS}
                row.update({f"{m}_sd": float(np.std([s[m] for s in per_seed], ddof=1))
                            if seeds > 1 else 0.0 for m in METRICS})
                ok = [c["accepted"] for r in done for c in r["ilm_seeds"]]
            else:
                row = metrics.CorpusScorer(_texts(done, method), references, METRICS).score(
                    range(len(done)))
                ok = [r[method]["accepted"] for r in done]
            rows.append({"target_ratio": float(target), "mask_ratio": reached,
                         "passages": len(done), "method": method, **row,
                         "success": 100 * float(np.mean(ok)),
                         "seconds": float(np.mean([r["seconds"][method] for r in done]))})
    return rows


def interval_rows(records: Sequence[dict], ratios: Sequence[float], methods: Sequence[str],
                  baselines: Sequence[str], resamples: int, seed: int = 0,
                  confidence: float = 0.95) -> list[dict]:
    """Paired bootstrap intervals of ctrlg − each baseline per ratio (module docstring)."""
    if "ctrlg" not in methods or not resamples:
        return []
    rows = []
    for target in ratios:
        done = [r for r in records if r["target_ratio"] == float(target) and "skipped" not in r]
        if not done:
            continue
        references = [[r["original"]] for r in done]
        ctrlg_scorer = method_scorer(done, "ctrlg", references)
        for baseline in baselines:
            if baseline not in methods or baseline == "ctrlg":
                continue
            base = method_scorer(done, baseline, references)
            ci = metrics.paired_bootstrap(ctrlg_scorer, base, num_resamples=int(resamples),
                                          seed=int(seed), confidence=float(confidence))
            rows.append({"target_ratio": float(target), "passages": len(done),
                         "pair": f"ctrlg − {baseline}", **ci})
    return rows


def finite_or_none(value: float):
    return value if math.isfinite(value) else None
