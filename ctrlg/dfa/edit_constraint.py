"""The editor's constraint: keyphrases ∧ no banned word ∧ a word range, as one token DFA.

For a request with keyphrases k_1..k_m, banned words b_1..b_r and a word range [lo, hi] the
generated middle y (the tokens between the prefix and the suffix, EOS included if it ends y) must
be accepted by

    keywords(k_1) ∧ … ∧ keywords(k_m) ∧ ¬contains(b_1 | … | b_r) ∧ lo ≤ words(y) ≤ hi
      ∧ valid UTF-8 ∧ no text-less token except EOS ∧ after EOS only EOS

* **keyphrases** — :func:`ctrlg.dfa.keywords` (Ctrl-G's convention): the tokenizer's own
  tokenization of the phrase (after a space, or at the very start; first letter also capitalised)
  occurs and ends a word;
* **banned words** — stronger than a token ban: the decoded text may not contain the word (its
  first letter in either case) as a whole word *however the tokens split it*. Compiled from the
  regex ``([\\s\\S]*[^0-9A-Za-z])?(b|B)([^0-9A-Za-z][\\s\\S]*)?`` over all encodings
  (:func:`ctrlg.dfa.regex`), then complemented; EOS is allowed after a match so that a
  generation cannot escape the ban by ending;
* **word range** — :func:`ctrlg.dfa.word_count` (words = runs of non-whitespace with a letter or
  digit);
* the text is valid UTF-8 (the banned-word regexes read characters; a stray partial byte would
  escape them), ending with a complete character;
* tokens that contribute no text (chat markers, padding ids) other than EOS are banned, so the
  text shown is exactly what the automaton judged; with ``allow_newlines=False`` so are the
  tokens that hold a line break (an insertion inside a paragraph).

Cost: the keyword automata are small (|phrase| states); the banned-word automaton is minimised
(about the length of the word); the intersection is the reachable product, at most
∏ |states|; the service bounds it before the guide's tables are built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from ctrlg.dfa.builders import banned_phrases, eos, universal
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.ops import complement, intersect
from ctrlg.dfa.regex import regex
from ctrlg.dfa.words import count_words, keywords, word_count
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError
from ctrlg.vocab import token_bytes

__all__ = ["EditConstraint", "build_constraint", "banned_word_pattern", "MAX_EDIT_STATES"]


@dataclass(frozen=True)
class EditConstraint:
    """What a request asks of the generated text (hashable: the memo key)."""

    keyphrases: tuple[str, ...] = ()
    banned: tuple[str, ...] = ()
    min_words: int | None = None
    max_words: int | None = None
    allow_newlines: bool = True

    @classmethod
    def from_lists(cls, keyphrases: Sequence[str], banned: Sequence[str], min_words, max_words,
                   allow_newlines: bool = True):
        """Normalise: strip whitespace, drop empty entries and duplicates (order kept)."""
        def clean(items, what):
            out = []
            for item in items:
                if not isinstance(item, str):
                    raise ConstraintError(f"{what} must be strings, got {item!r}")
                item = " ".join(item.split())
                if item and item not in out:
                    out.append(item)
            return tuple(out)

        return cls(clean(keyphrases, "keyphrases"), clean(banned, "banned words"),
                   min_words, max_words, bool(allow_newlines))

    def describe(self) -> str:
        parts = [f"keyphrases {list(self.keyphrases)}"] if self.keyphrases else []
        if self.banned:
            parts.append(f"banned {list(self.banned)}")
        if self.min_words is not None or self.max_words is not None:
            parts.append(f"words {self.min_words or 0}–{'∞' if self.max_words is None else self.max_words}")
        if not self.allow_newlines:
            parts.append("no line breaks")
        return ", ".join(parts) or "no constraint"


def banned_word_pattern(word: str) -> str:
    """Regex (full match) for texts containing ``word`` — with its first letter in either case —
    as a whole word: not preceded or followed by an ASCII letter or digit."""
    forms = dict.fromkeys([word, word[:1].upper() + word[1:], word[:1].lower() + word[1:]])
    alternatives = "|".join(re.escape(f) for f in forms)
    return rf"([\s\S]*[^0-9A-Za-z])?({alternatives})([^0-9A-Za-z][\s\S]*)?"


def _banned_tokens(tokenizer, vocab_size: int, eos_ids: Sequence[int],
                   allow_newlines: bool) -> list[int]:
    """Text-less tokens other than EOS, and (unless allowed) tokens holding a line break."""
    data = token_bytes(tokenizer)
    keep = set(eos_ids)
    breaks = re.compile(rb"[\n\r]")
    return [i for i in range(vocab_size) if i not in keep and (
        i >= len(data) or not data[i] or (not allow_newlines and breaks.search(data[i])))]


MAX_EDIT_STATES = 200_000     # the most states a product step of the editor's constraint may reach


def _parts(tokenizer, spec: EditConstraint, V: int, eos_ids: tuple[int, ...]):
    """The automata whose intersection is the constraint, as thunks, cheapest and most
    restrictive first (the word range and the keyphrases decide most unsatisfiable requests)."""
    eos_id = eos_ids[0] if eos_ids else None
    if spec.min_words is not None or spec.max_words is not None:
        yield lambda: word_count(spec.min_words or 0, spec.max_words, tokenizer, vocab_size=V)
    if spec.keyphrases:
        yield lambda: keywords([[k] for k in spec.keyphrases], tokenizer, vocab_size=V)
    banned_tokens = _banned_tokens(tokenizer, V, eos_ids, spec.allow_newlines)
    if banned_tokens:
        yield lambda: banned_phrases([[t] for t in banned_tokens], V)
    if eos_ids:
        yield lambda: eos(eos_ids[0], V)
    # valid UTF-8 text only: the banned-word automata judge characters, so a sequence with a
    # stray partial UTF-8 byte would otherwise escape them (and display as U+FFFD)
    yield lambda: regex(r"[\s\S]*", tokenizer, "all", eos_token_id=eos_id, vocab_size=V)
    for word in spec.banned:
        yield lambda word=word: complement(regex(banned_word_pattern(word), tokenizer, "all",
                                                 eos_token_id=eos_id, vocab_size=V))


def _check_lengths(spec: EditConstraint) -> None:
    """A keyphrase longer than the word range allows makes the request unsatisfiable: say so at
    once instead of after building its automata."""
    if spec.max_words is None:
        return
    for phrase in spec.keyphrases:
        if count_words(phrase) > spec.max_words:
            raise UnsatisfiableConstraintError(
                f"the keyphrase {phrase!r} has {count_words(phrase)} words but at most "
                f"{spec.max_words} words are allowed")


def build_constraint(tokenizer, spec: EditConstraint, vocab_size: int,
                     eos_ids: Sequence[int] = (), *, check: Callable[[], None] | None = None,
                     max_states: int = MAX_EDIT_STATES) -> TokenDFA:
    """The token DFA of ``spec`` over ``vocab_size`` ids (module docstring).

    The parts are built and intersected one at a time; ``check()`` (e.g. a request's deadline or
    cancel flag, which raises to stop) is called before each, and a product step that reaches
    more than ``max_states`` states raises :class:`ConstraintError`. Raises ConstraintError (a
    ValueError) for an inverted word range or a keyphrase the tokenizer cannot encode, and
    UnsatisfiableConstraintError when no text satisfies the request (found while the parts are
    intersected, or at once for a keyphrase longer than the word range)."""
    V, eos_ids = int(vocab_size), tuple(int(e) for e in eos_ids)
    tick = check or (lambda: None)
    _check_lengths(spec)
    result = None
    for make in _parts(tokenizer, spec, V, eos_ids):
        tick()
        part = make()
        tick()
        result = part if result is None else intersect(result, part, max_states=max_states)
    return universal(V) if result is None else result
