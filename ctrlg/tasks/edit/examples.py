"""Editing examples cut from real passages, in the shape of Ctrl-G's Table 3 (§5).

From each evaluation passage one span of whole sentences is cut
(:func:`ctrlg.data.story_prompts.choose_span`: 5–40 words, after a non-empty prefix, within a
paragraph). The passage gives one example per constraint kind (:data:`KINDS`), all with the same
span and operation, so kinds are compared on the same texts:

* operation (:data:`OPERATIONS`, alternating over passages): ``insert`` keeps the prefix and the
  suffix (the text after the span), ``continue`` keeps the prefix only;
* kind: ``none``; ``K`` — 1 to 3 of the span's content words as keyphrases (words of ≥ 3 letters
  outside the training split's :data:`FUNCTION_WORDS` most frequent words, drawn in their order
  of appearance); ``L`` — a word range around the span's length, [n − d, n + d] with
  d = max(2, round(n / 5)); ``K&L`` — both.

The cut span is the **reference**: it satisfies its own constraints, so every example has a
human text that a method could have written. Words are counted as the constraint counts them
(:func:`ctrlg.dfa.count_words`: runs of non-whitespace that hold a letter or digit). A passage without a
span to cut is skipped and counted (:func:`build_examples` returns the skipped indices).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from ctrlg.data.stories import Story, load_stories
from ctrlg.data.story_prompts import choose_span
from ctrlg.dfa.words import count_words

__all__ = ["OPERATIONS", "KINDS", "FUNCTION_WORDS", "EditExample", "content_words",
           "build_examples", "word_range"]

OPERATIONS = ("insert", "continue")
KINDS = ("none", "K", "L", "K&L")
FUNCTION_WORDS = 150              # the training split's most frequent words are not keyphrases

_LETTERS = re.compile(r"[A-Za-z][A-Za-z'’-]*[A-Za-z]")


@dataclass(frozen=True)
class EditExample:
    """One editing request with its human reference (texts exactly as in the passage: the
    reference starts with the whitespace that preceded it)."""

    passage: int
    operation: str
    kind: str
    prefix: str
    suffix: str
    reference: str
    keyphrases: tuple[str, ...] = field(default_factory=tuple)
    min_words: int | None = None
    max_words: int | None = None

    def record(self) -> dict:
        out = asdict(self)
        out["keyphrases"] = list(self.keyphrases)
        return out


def word_range(n: int) -> tuple[int, int]:
    d = max(2, round(n / 5))
    return max(1, n - d), n + d


@lru_cache(maxsize=4)
def _frequent_words(path) -> frozenset[str]:
    counts = Counter(w.lower() for s in load_stories("train", path)
                     for w in _LETTERS.findall(s.text))
    return frozenset(w for w, _ in counts.most_common(FUNCTION_WORDS))


def content_words(text: str, path=None) -> list[str]:
    """The distinct content words of ``text`` in order (module docstring)."""
    frequent = _frequent_words(path)
    out = []
    for word in _LETTERS.findall(text):
        if len(word) >= 3 and word.lower() not in frequent and word not in out:
            out.append(word)
    return out


def build_examples(stories: list[Story], seed: int = 0, kinds=KINDS,
                   operations=OPERATIONS) -> tuple[list[EditExample], list[int]]:
    """(examples, indices of the passages skipped because no span could be cut) — one example per
    kind per passage, operations alternating over passages (module docstring)."""
    examples, skipped = [], []
    for number, story in enumerate(stories):
        rng = np.random.default_rng([seed, story.index])
        span = choose_span(story.text, rng)
        if span is None:
            skipped.append(story.index)
            continue
        operation = operations[number % len(operations)]
        prefix = story.text[:span.start].rstrip()
        reference = story.text[len(prefix):span.end]
        suffix = story.text[span.end:] if operation == "insert" else ""
        if operation == "insert" and not suffix.strip():
            operation = "continue"                    # the span ends the passage
        words = content_words(reference)
        count = int(rng.integers(1, 4))
        picks = sorted(rng.choice(len(words), size=min(count, len(words)), replace=False).tolist()) \
            if words else []
        keys = tuple(words[i] for i in picks)
        n = count_words(reference)
        low, high = word_range(n)
        for kind in kinds:
            with_keys = "K" in kind and keys
            with_length = "L" in kind
            if "K" in kind and not keys:
                continue                              # no content word: no K example
            examples.append(EditExample(story.index, operation, kind, prefix, suffix, reference,
                                        keys if with_keys else (),
                                        low if with_length else None,
                                        high if with_length else None))
    return examples, skipped
