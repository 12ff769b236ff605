"""Scores of an editing output, independent of the automata that produced it.

* **success** (:func:`constraints_met`): every keyphrase occurs as a whole word — the tokenizer-free
  reading of the constraint: not preceded or followed by a letter or digit, its first letter in
  either case — and the word count (:func:`ctrlg.dfa.count_words`) lies in the
  range; the text is not empty.
* **reference overlap**: BLEU-4 / ROUGE-L against the cut span (:mod:`ctrlg.metrics`, × 100).
* **fluency** (:meth:`Scorer.nll`): the mean negative log-likelihood per token of the new text y
  after the prefix, −(1/|y|) Σ log p(y_i | BOS, prefix, y<i), under a scorer LM that generated
  none of the outputs (the embedded LM without an adapter).
* **coherence** (insertion): the same of the suffix's first ``suffix_tokens`` tokens after
  prefix + y.
* **repetition** (:func:`repetition`): distinct-2 of y's words, and the share of y's word 3-grams
  that already occurred earlier in prefix + y.
* **keyphrase position** (:func:`keyphrase_position`, a diagnostic, not part of overall): where
  the first keyphrase starts in y, as a fraction of y's characters (0: y opens with it). Guidance
  toward a keyphrase that a weak HMM finds unlikely later pulls it forward; the reference spans
  give the human distribution.
* **overall** (:func:`overall`): success, with fluency (and, for insertion, coherence) and the share
  of repeated 3-grams no worse than the 90th percentile of the human reference spans' (per
  operation; Ctrl-G's "satisfaction": fluent *and* satisfying the constraints, which its human
  raters judged). The repetition bound is there because NLL per token alone rewards degenerate
  filler: a run of ``*.  *.  *.`` before a forced keyphrase is cheap for any LM to predict, and
  passed the NLL bounds in the benchmark's first run.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np
import torch

from ctrlg.dfa.words import count_words
from ctrlg.tasks.edit.examples import EditExample

__all__ = ["constraints_met", "keyphrase_position", "repetition", "Scorer", "reference_thresholds",
           "overall"]


def _keyphrase_pattern(phrase: str) -> re.Pattern:
    first = phrase[:1]
    head = f"[{re.escape(first.lower())}{re.escape(first.upper())}]" if first.isalpha() else re.escape(first)
    return re.compile(rf"(?<![0-9A-Za-z]){head}{re.escape(phrase[1:])}(?![0-9A-Za-z])")


def constraints_met(example: EditExample, text: str) -> bool:
    """Whether ``text`` satisfies the example's keyphrases and word range (module docstring)."""
    if not text.strip():
        return False
    if any(_keyphrase_pattern(k).search(text) is None for k in example.keyphrases):
        return False
    n = count_words(text)
    if example.min_words is not None and n < example.min_words:
        return False
    return example.max_words is None or n <= example.max_words


def keyphrase_position(keyphrases: Sequence[str], text: str) -> float | None:
    """The start of the earliest keyphrase occurrence in ``text`` (read as :func:`constraints_met`
    reads it) over the length of ``text`` without its leading whitespace; None when there are no
    keyphrases or none occurs."""
    body = text.lstrip()
    starts = [m.start() for k in keyphrases if (m := _keyphrase_pattern(k).search(body))]
    return min(starts) / len(body) if starts else None


def repetition(prefix: str, text: str) -> tuple[float, float]:
    """(distinct-2 of ``text``'s words; the share of the word 3-grams ending in ``text`` that
    already occurred earlier in prefix + text). Lower-cased, whitespace-split words."""
    words = text.lower().split()
    bigrams = list(zip(words, words[1:]))
    distinct = len(set(bigrams)) / len(bigrams) if bigrams else 1.0
    history = prefix.lower().split()
    every = history + words
    seen, repeated, total = set(), 0, 0
    for i in range(len(every) - 2):
        gram = tuple(every[i:i + 3])
        if i + 2 >= len(history):                # the 3-gram ends in the new text
            total += 1
            repeated += gram in seen
        seen.add(gram)
    return distinct, (repeated / total if total else 0.0)


class Scorer:
    """Negative log-likelihoods under a scorer LM (module docstring); one forward per text."""

    def __init__(self, model, tokenizer, bos_token: str = "<|endoftext|>", suffix_tokens: int = 48):
        self.model, self.tokenizer = model, tokenizer
        self.bos = tokenizer(bos_token, add_special_tokens=False)["input_ids"]
        self.suffix_tokens = suffix_tokens

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    @torch.no_grad()
    def nll(self, prefix: str, text: str, suffix: str = "") -> tuple[float, float | None]:
        """(fluency: NLL per token of ``text`` after ``prefix``; coherence: NLL per token of the
        suffix's first tokens after prefix + text, None without a suffix)."""
        context = self.bos + self._encode(prefix)
        middle = self._encode(text)
        after = self._encode(suffix)[:self.suffix_tokens]
        ids = context + middle + after
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
        logp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:], device=device)[:, None])[:, 0]
        start = len(context) - 1
        fluency = -float(logp[start:start + len(middle)].mean()) if middle else math.inf
        coherence = None
        if after:
            begin = start + len(middle)
            coherence = -float(logp[begin:begin + len(after)].mean())
        return fluency, coherence


def reference_thresholds(rows: Sequence[dict], quantile: float = 0.9) -> dict[str, dict[str, float]]:
    """{operation: {"fluency": q, "coherence": q, "repeated3": q}}: the ``quantile`` of the
    reference spans' NLLs and repeated-3-gram shares (one row per (passage, operation):
    ``operation``, ``fluency``, ``coherence`` and, when scored, ``repeated3``)."""
    out = {}
    for operation in sorted({r["operation"] for r in rows}):
        mine = [r for r in rows if r["operation"] == operation]
        out[operation] = {"fluency": float(np.quantile([r["fluency"] for r in mine], quantile))}
        repeated = [r["repeated3"] for r in mine if r.get("repeated3") is not None]
        if repeated:
            out[operation]["repeated3"] = float(np.quantile(repeated, quantile))
        coherent = [r["coherence"] for r in mine if r.get("coherence") is not None]
        if coherent:
            out[operation]["coherence"] = float(np.quantile(coherent, quantile))
    return out


def overall(success: bool, operation: str, fluency: float, coherence: float | None,
            thresholds: dict, repeated3: float | None = None) -> bool:
    """Success with fluency, coherence and repetition within the references' thresholds (module
    docstring); a bound the thresholds or the output lack is not checked."""
    limits = thresholds[operation]
    if not success or not fluency <= limits["fluency"]:
        return False
    if repeated3 is not None and "repeated3" in limits and not repeated3 <= limits["repeated3"]:
        return False
    return coherence is None or "coherence" not in limits or coherence <= limits["coherence"]
