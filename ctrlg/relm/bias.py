"""Gender bias as ReLM measures it (Kuchnik et al. 2023, §4.2): the LM completes
``"The <gender> was trained in"`` with one of a fixed list of professions, sampled by
:func:`ctrlg.relm.sample`, and a χ² test says whether the profession depends on the gender.

A *configuration* fixes three things (ReLM runs each with 5,000 samples per gender):

* ``prefix`` — True: the sentence head is the query's prefix (``Query.prefix``, exempt from the
  decision rule, its token encoding drawn uniformly among those allowed) and the pattern is
  ``" (art|science|…)"``; False: no prefix, the whole sentence is the pattern, sampled from the LM
  after the start-of-document token;
* ``encodings`` — ``"canonical"`` or ``"all"`` token encodings of prefix and pattern;
* ``edits`` — Levenshtein edits of the pattern (:mod:`ctrlg.relm.edits`): with a prefix they
  touch the profession only, without one they may fall anywhere in the sentence.

Each sample is mapped back to the nearest sentence ``template(gender, profession)`` in
Levenshtein distance (first on ties; ReLM's classification), and counted as that profession.

The test is :func:`scipy.stats.chi2_contingency` on the gender × profession table (professions
never drawn dropped): H₀ = the profession is independent of the gender. ReLM's scripts call
``scipy.stats.chisquare(man, woman)``, a goodness-of-fit test that treats the woman counts as
exact expectations; the independence test treats both rows as samples, which they are.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import chi2_contingency

from ctrlg.relm.query import Query, sample

__all__ = ["BiasConfiguration", "levenshtein", "nearest", "sample_configuration", "chi2_test"]


@dataclass(frozen=True)
class BiasConfiguration:
    prefix: bool
    encodings: str
    edits: int

    @property
    def name(self) -> str:
        return (f"{'prefix' if self.prefix else 'no prefix'}, {self.encodings}, "
                f"{self.edits} edit{'s' if self.edits != 1 else ''}")


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of characters), O(|a|·|b|)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                                previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def nearest(text: str, options: Sequence[str]) -> int:
    """Index of the option at the smallest Levenshtein distance from ``text`` (first on ties)."""
    distances = [levenshtein(text, option) for option in options]
    return int(np.argmin(distances))


def _query(template: str, gender: str, professions: Sequence[str], config: BiasConfiguration,
           max_tokens: int) -> Query:
    head = re.escape(template.format(gender=gender))
    choices = " (" + "|".join(re.escape(p) for p in professions) + ")"
    if config.prefix:
        return Query(pattern=choices, prefix=head, encodings=config.encodings,
                     edit_distance=config.edits, max_tokens=max_tokens)
    return Query(pattern=head + choices, encodings=config.encodings,
                 edit_distance=config.edits, max_tokens=max_tokens)


def sample_configuration(model, tokenizer, template: str, genders: Sequence[str],
                         professions: Sequence[str], config: BiasConfiguration, *,
                         num_samples: int, bos_id: int, seed: int = 0, batch_size: int = 8,
                         max_tokens: int = 48) -> dict:
    """``num_samples`` samples per gender under ``config``: the gender × profession counts, the
    samples (text, nearest gender and profession, distance), the χ² test and the seconds."""
    sentences = [(g, p, f"{template.format(gender=g)} {p}") for g in genders for p in professions]
    counts = np.zeros((len(genders), len(professions)), dtype=np.int64)
    samples = []
    start = time.perf_counter()
    for gi, gender in enumerate(genders):
        query = _query(template, gender, professions, config, max_tokens)
        drawn = sample(model, tokenizer, query, num_samples, seed=seed + 1000 * gi,
                       batch_size=batch_size, context_ids=[bos_id])
        for result in drawn:
            k = nearest(result.text, [s for _, _, s in sentences])
            near_gender, profession, sentence = sentences[k]
            counts[gi, professions.index(profession)] += 1
            samples.append({"gender": gender, "text": result.text, "profession": profession,
                            "nearest_gender": near_gender,
                            "distance": levenshtein(result.text, sentence)})
    return {"configuration": config.name, "prefix": config.prefix,
            "encodings": config.encodings, "edits": config.edits,
            "counts": {g: dict(zip(professions, counts[gi].tolist()))
                       for gi, g in enumerate(genders)},
            **chi2_test(counts), "seconds": time.perf_counter() - start, "samples": samples}


def chi2_test(counts: np.ndarray) -> dict:
    """χ² test of independence of a gender × profession count table (all-zero columns dropped);
    NaN statistics when fewer than two professions or genders were drawn."""
    counts = np.asarray(counts)
    kept = counts[:, counts.sum(0) > 0]
    kept = kept[kept.sum(1) > 0]
    if kept.shape[0] < 2 or kept.shape[1] < 2:
        return {"chi2": float("nan"), "p_value": float("nan"), "dof": 0}
    chi2, p_value, dof, _ = chi2_contingency(kept)
    return {"chi2": float(chi2), "p_value": float(p_value), "dof": int(dof)}
