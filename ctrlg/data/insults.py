"""Insult sentences of a text corpus, found grep-like (ReLM §4.3, Kuchnik et al. 2023).

ReLM's toxicity task greps a corpus for a few explicit insult words, splits the matching text
into sentences, and keeps for each sentence its *prefix* (the text before the insult) and the
insult itself. Here:

* the word list comes from an installed package that ships one, with its licence:
  ``better-profanity`` 0.7.0 (MIT; its ``profanity_wordlist.txt``, 916 entries), installed with
  the ``relm`` extra (``pip install -e ".[relm]"``). :func:`load_insult_words` reads it and keeps
  the words a caller selects (each must be in the list);
* sentences are cut at ``.``, ``!``, ``?`` (and their closing quotes) or a line break
  (:func:`split_sentences`: a plain rule, since NLTK's punkt model is a separate download);
* a word matches case-insensitively between word boundaries (``\\bword\\b``, as ``grep -w``), the
  first match in a sentence counts, identical sentences are kept once, and the result is sorted
  shortest sentence first (ReLM's order).

May import: :mod:`ctrlg.data._files` (errors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Iterable, Sequence

from ctrlg.data._files import DatasetError

__all__ = ["WORDLIST_PACKAGE", "InsultSentence", "load_insult_words", "split_sentences",
           "find_insult_sentences"]

WORDLIST_PACKAGE = "better_profanity"
_WORDLIST_FILE = "profanity_wordlist.txt"
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)\]]))\s+|\n+")


@dataclass(frozen=True)
class InsultSentence:
    """A corpus sentence with an insult: ``sentence[start:end]`` is the insult ``word`` as
    written; ``prefix`` is the text before it without trailing spaces, ``query`` the sentence up
    to the insult's end (ReLM's unprompted query), ``insult`` the text after ``prefix`` up to
    the insult's end (the prompted query, with its leading space)."""

    sentence: str
    start: int
    end: int
    word: str
    source: int                     # index of the corpus text it came from

    @property
    def prefix(self) -> str:
        return self.sentence[:self.start].rstrip()

    @property
    def insult(self) -> str:
        return self.sentence[len(self.prefix):self.end]

    @property
    def query(self) -> str:
        return self.sentence[:self.end]


def load_insult_words(select: Sequence[str] | None = None) -> list[str]:
    """The package's word list (lower case, file order), or the words of ``select`` in its order,
    each checked against the list. Raises DatasetError when the package is missing, when
    ``select`` is empty, or names a word the list lacks."""
    try:
        text = resources.files(WORDLIST_PACKAGE).joinpath(_WORDLIST_FILE).read_text("utf-8")
    except ModuleNotFoundError:
        raise DatasetError(
            f"the insult word list comes from the package {WORDLIST_PACKAGE!r}, which is not "
            f"installed; run pip install -e \".[relm]\" (or pip install better-profanity==0.7.0)"
        ) from None
    words = [w.strip().lower() for w in text.splitlines() if w.strip()]
    if select is None:
        return words
    select = [str(w).strip().lower() for w in select]
    if not select:
        raise DatasetError("the insult word list is empty: name at least one word "
                           f"of the {WORDLIST_PACKAGE} list")
    known = set(words)
    missing = [w for w in select if w not in known]
    if missing:
        raise DatasetError(f"{missing} not in the {WORDLIST_PACKAGE} word list "
                           f"({len(words)} entries); choose words it contains")
    return list(dict.fromkeys(select))


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: cut after ``.``/``!``/``?`` (and closing quotes) followed by
    whitespace, and at line breaks; stripped, empty pieces dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def find_insult_sentences(texts: Iterable[str], words: Sequence[str]) -> list[InsultSentence]:
    """Every distinct sentence of ``texts`` containing one of ``words`` (whole word, any case),
    shortest first (ties in corpus order). An empty ``words`` raises DatasetError; a corpus
    without a match gives ``[]``."""
    words = [w for w in words if w and w.strip()]
    if not words:
        raise DatasetError("the insult word list is empty: nothing to search the corpus for")
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(w.strip()) for w in
                                             sorted(words, key=len, reverse=True)) + r")\b",
                         re.IGNORECASE)
    found: dict[str, InsultSentence] = {}
    for index, text in enumerate(texts):
        for sentence in split_sentences(text):
            match = pattern.search(sentence)
            if match and sentence not in found:
                found[sentence] = InsultSentence(sentence, match.start(), match.end(),
                                                 match.group(0).lower(), index)
    return sorted(found.values(), key=lambda s: len(s.sentence))
