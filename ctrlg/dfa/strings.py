"""String-level keyword constraints ("the text contains these strings"), built on the regex
compiler, e.g. for CommonGen-style concept constraints.

Two readings of "the generation contains keyword w":

* ``encodings="all"`` — the decoded text contains ``w`` as a substring, however the tokens
  split it (``w`` may start or end inside a token). Compiled from the regex
  ``[\\s\\S]*<escaped w>[\\s\\S]*`` over all encodings (:func:`ctrlg.dfa.regex`) and minimised,
  which makes the most common successor of each state its default, so the automaton stays
  small (about ``len(w)`` states).
* ``encodings="canonical"`` — the tokenizer's canonical encoding of ``w``
  (``tokenizer.encode(w, add_special_tokens=False)``) occurs as a contiguous token
  subsequence (the Ctrl-G/GeLaTo convention; a KMP automaton, :func:`ctrlg.dfa.phrase`).
  Every such sequence also satisfies the ``"all"`` reading, not conversely.

EOS is unconstrained (any token may follow), so intersect with ``ctrlg.dfa.eos`` or length
builders as needed.
"""

from __future__ import annotations

import re
from typing import Sequence

from ctrlg.dfa.builders import phrase
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.ops import intersect, union
from ctrlg.dfa.regex import regex
from ctrlg.dfa.size_bounds import MAX_STATES, check_estimate, substring_states
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.errors import ConstraintError
from ctrlg.vocab import tokenizer_of

__all__ = ["contains", "contains_all", "contains_any"]


def _check_keyword(keyword) -> str:
    if not isinstance(keyword, str) or keyword == "":
        raise ConstraintError(f"a keyword must be a non-empty string, got {keyword!r}")
    return keyword


def _vocab_size(tokenizer, vocab_size: int | None) -> int:
    return vocab_trie(tokenizer).vocab_size if vocab_size is None else int(vocab_size)


def contains(keyword: str, tokenizer, encodings: str = "all", *,
             vocab_size: int | None = None) -> TokenDFA:
    """Token sequences whose text contains ``keyword`` (module docstring for the two modes)."""
    keyword = _check_keyword(keyword)
    if encodings == "all":
        pattern = r"[\s\S]*" + re.escape(keyword) + r"[\s\S]*"
        return regex(pattern, tokenizer, "all", eos_token_id=None, vocab_size=vocab_size)
    if encodings == "canonical":
        ids = list(tokenizer_of(tokenizer, "contains").encode(keyword, add_special_tokens=False))
        return phrase(ids, vocab_size=_vocab_size(tokenizer, vocab_size))
    raise ConstraintError(f"encodings must be 'all' or 'canonical', got {encodings!r}")


def _keyword_dfas(keywords: Sequence[str], tokenizer, encodings: str, vocab_size: int | None,
                  what: str) -> list[TokenDFA]:
    if not keywords:
        raise ConstraintError(f"{what} needs at least one keyword")
    return [contains(k, tokenizer, encodings, vocab_size=vocab_size) for k in keywords]


def contains_all(keywords: Sequence[str], tokenizer, encodings: str = "all", *,
                 vocab_size: int | None = None, max_states: int = MAX_STATES) -> TokenDFA:
    """The text contains every keyword (in any order). The automaton remembers which keywords
    have occurred, about 2^k·(1 + Σ|wᵢ|/2) states (:func:`ctrlg.dfa.size_bounds.substring_states`;
    |wᵢ| in characters): an estimate above ``max_states`` is refused before anything is built."""
    if isinstance(keywords, str):
        raise ConstraintError(f"contains_all needs a list of keywords, got the string {keywords!r}")
    keywords = [_check_keyword(k) for k in keywords]
    check_estimate(f"contains_all with {len(keywords)} keywords",
                   substring_states([len(k) for k in keywords]), max_states,
                   "use fewer or shorter keywords")
    dfas = _keyword_dfas(keywords, tokenizer, encodings, vocab_size, "contains_all")
    return dfas[0] if len(dfas) == 1 else intersect(*dfas)


def contains_any(keywords: Sequence[str], tokenizer, encodings: str = "all", *,
                 vocab_size: int | None = None) -> TokenDFA:
    """The text contains at least one of the keywords."""
    dfas = _keyword_dfas(keywords, tokenizer, encodings, vocab_size, "contains_any")
    return dfas[0] if len(dfas) == 1 else union(*dfas)
