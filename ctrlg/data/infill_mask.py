"""Hierarchical span masking for text infilling, reimplemented after ILM (Donahue et al., ACL 2020,
"Enabling Language Models to Fill in the Blanks", §4.1 "mask function").

A document is parsed into a hierarchy document → paragraphs → sentences → words (character
offsets; paragraphs are separated by blank lines or newlines, sentences end in ``.``, ``!``, ``?``
optionally followed by closing quotes/brackets, words are runs of non-space characters). Then,
top-down, each unit is masked with probability ``p``; a unit that is not masked is recursed into.
At the word level, each word starts a masked n-gram with probability ``p``; the n-gram length is
uniform in ``[1, max_ngram]`` (clipped at the sentence end); a length-1 n-gram is a WORD span,
longer ones are NGRAM spans, and the walk continues after the n-gram. The result is a sorted list
of non-overlapping :class:`MaskedSpan` objects, each tagged with its granularity.

The mask ratio (:func:`mask_ratio`) is the fraction of the document's characters inside masked
spans (Ctrl-G's and ILM's definition; ``unit="words"``: of its whitespace-separated words);
:func:`calibrate_mask_probability` finds the ``p`` that gives a target average ratio on a corpus
(bisection with common random numbers, so the result is deterministic per seed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ctrlg.data._files import DatasetError

__all__ = [
    "Granularity",
    "MaskedSpan",
    "MaskedDocument",
    "parse_hierarchy",
    "mask_hierarchical",
    "mask_document",
    "mask_ratio",
    "calibrate_mask_probability",
]


class Granularity(str, Enum):
    DOCUMENT = "document"
    PARAGRAPH = "paragraph"
    SENTENCE = "sentence"
    NGRAM = "ngram"
    WORD = "word"


@dataclass(frozen=True)
class MaskedSpan:
    """Characters ``text[start:end]`` are masked; ``granularity`` says what unit they were."""

    granularity: Granularity
    start: int
    end: int


@dataclass(frozen=True)
class MaskedDocument:
    """A document with its masked spans.

    ``fragments`` are the unmasked pieces around the spans, so that
    ``fragments[0] + answers[0] + fragments[1] + ... + answers[-1] + fragments[-1] == text``
    (``len(fragments) == len(spans) + 1``; fragments may be empty strings).
    """

    text: str
    spans: tuple[MaskedSpan, ...]

    @property
    def fragments(self) -> list[str]:
        pieces, cursor = [], 0
        for span in self.spans:
            pieces.append(self.text[cursor:span.start])
            cursor = span.end
        pieces.append(self.text[cursor:])
        return pieces

    @property
    def answers(self) -> list[str]:
        return [self.text[span.start:span.end] for span in self.spans]

    @property
    def granularities(self) -> list[Granularity]:
        return [span.granularity for span in self.spans]

    def with_blanks(self, blank: str = "___") -> str:
        """The text with each masked span replaced by ``blank``."""
        return blank.join(self.fragments)


_PARAGRAPH_BREAK = re.compile(r"\n\s*")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)")
_WORD = re.compile(r"\S+")


def _trimmed(text: str, start: int, end: int) -> tuple[int, int] | None:
    piece = text[start:end]
    stripped = piece.strip()
    if not stripped:
        return None
    left = start + (len(piece) - len(piece.lstrip()))
    return left, left + len(stripped)


def _split(text: str, start: int, end: int, pattern: re.Pattern, keep_match: bool):
    """Split text[start:end] at each match of pattern; the match stays with the left piece
    when keep_match, else it is dropped. Returns trimmed (start, end) pieces."""
    pieces, cursor = [], start
    for match in pattern.finditer(text, start, end):
        cut = match.end() if keep_match else match.start()
        piece = _trimmed(text, cursor, cut)
        if piece:
            pieces.append(piece)
        cursor = match.end()
    piece = _trimmed(text, cursor, end)
    if piece:
        pieces.append(piece)
    return pieces


def parse_hierarchy(text: str):
    """Offsets ``[(paragraph, [(sentence, [word, ...]), ...]), ...]``, each unit a (start, end)."""
    hierarchy = []
    for paragraph in _split(text, 0, len(text), _PARAGRAPH_BREAK, keep_match=False):
        sentences = []
        for sentence in _split(text, *paragraph, _SENTENCE_END, keep_match=True):
            words = [(m.start(), m.end()) for m in _WORD.finditer(text, *sentence)]
            sentences.append((sentence, words))
        hierarchy.append((paragraph, sentences))
    return hierarchy


def mask_hierarchical(text: str, p: float, rng: np.random.Generator,
                      max_ngram: int = 8) -> list[MaskedSpan]:
    """ILM-style hierarchical masking of ``text`` with per-unit probability ``p`` (see module
    docstring). ``rng`` is a numpy Generator (pass ``np.random.default_rng(seed)``)."""
    if not 0.0 <= p <= 1.0:
        raise DatasetError(f"mask probability p must be in [0, 1], got {p}")
    if max_ngram < 1:
        raise DatasetError(f"max_ngram must be >= 1, got {max_ngram}")
    whole = _trimmed(text, 0, len(text))
    if whole is None:
        raise DatasetError("cannot mask an empty or blank document")
    if rng.random() < p:
        return [MaskedSpan(Granularity.DOCUMENT, *whole)]
    spans: list[MaskedSpan] = []
    for paragraph, sentences in parse_hierarchy(text):
        if rng.random() < p:
            spans.append(MaskedSpan(Granularity.PARAGRAPH, *paragraph))
            continue
        for sentence, words in sentences:
            if rng.random() < p:
                spans.append(MaskedSpan(Granularity.SENTENCE, *sentence))
                continue
            index = 0
            while index < len(words):
                if rng.random() < p:
                    length = min(int(rng.integers(1, max_ngram + 1)), len(words) - index)
                    kind = Granularity.WORD if length == 1 else Granularity.NGRAM
                    spans.append(MaskedSpan(kind, words[index][0], words[index + length - 1][1]))
                    index += length
                else:
                    index += 1
    return spans


def mask_document(text: str, p: float, seed: int, max_ngram: int = 8) -> MaskedDocument:
    """:func:`mask_hierarchical` with a fresh generator seeded by ``seed``."""
    return MaskedDocument(text, tuple(mask_hierarchical(text, p, np.random.default_rng(seed),
                                                        max_ngram)))


def mask_ratio(document: MaskedDocument, unit: str = "chars") -> float:
    """Fraction of the document's characters (``unit="chars"``: masked span characters over the
    stripped document's length) or whitespace-separated words (``"words"``) inside masked spans."""
    if unit == "chars":
        length = len(document.text.strip())
        return sum(s.end - s.start for s in document.spans) / length if length else 0.0
    if unit != "words":
        raise DatasetError(f"unit must be 'chars' or 'words', got {unit!r}")
    words = [(m.start(), m.end()) for m in _WORD.finditer(document.text)]
    if not words:
        return 0.0
    masked = sum(any(s.start <= a and b <= s.end for s in document.spans) for a, b in words)
    return masked / len(words)


def calibrate_mask_probability(texts: list[str], target_ratio: float, seed: int = 0,
                               max_ngram: int = 8, iterations: int = 30,
                               unit: str = "chars") -> float:
    """The ``p`` whose average :func:`mask_ratio` over ``texts`` is closest to ``target_ratio``.

    Bisection on p in [0, 1]; document i always uses seed ``seed + i`` (common random numbers),
    which makes the average ratio non-decreasing in p for practical purposes and the answer
    deterministic.
    """
    if not 0.0 < target_ratio < 1.0:
        raise DatasetError(f"target_ratio must be in (0, 1), got {target_ratio}")
    if not texts:
        raise DatasetError("calibrate_mask_probability needs at least one text")

    def average(p: float) -> float:
        return float(np.mean([mask_ratio(mask_document(t, p, seed + i, max_ngram), unit)
                              for i, t in enumerate(texts)]))

    low, high = 0.0, 1.0
    for _ in range(iterations):
        middle = (low + high) / 2
        if average(middle) < target_ratio:
            low = middle
        else:
            high = middle
    return (low + high) / 2
