"""The infilling constraint (Ctrl-G §4.2): the unmasked fragments appear in order, each blank filled
with text of its granularity, then EOS.

A masked passage is a sequence of fragments f_0 … f_k and spans (blanks) s_1 … s_k
(:class:`ctrlg.data.MaskedDocument`). Spans are whole whitespace-separated words (ILM's mask
function), so each fragment after a span starts with whitespace. The whitespace *before* a span
belongs to the blank's text (byte-level BPE vocabularies attach a space to the next word), so each
fragment is written without its trailing whitespace and each blank as

    ws · P_g          ws = the whitespace that preceded the span (shown in the masked passage),

with P_g the span's granularity pattern (:data:`GAP_PATTERNS`): WORD one word (``\\S+``),
NGRAM exactly n words (n = the masked n-gram's length), SENTENCE one sentence (words of which only
the last may end with sentence-final punctuation), PARAGRAPH one line of words, DOCUMENT any text.
Consecutive blanks separated by whitespace only make one gap (their patterns joined by that
whitespace). The constraint is the token-level DFA of

    exact(f_0) · G_1 · exact(f_1) · … · G_k · exact(f_k) · EOS

where exact(f) accepts the tokenizer's own tokenization of f (:func:`ctrlg.dfa.exact`), G_i is the
gap's regex over *all* encodings (:func:`ctrlg.dfa.regex`) and · is :func:`ctrlg.dfa.concat`: the
DFA of Ctrl-G's Proposition 4.1 when a gap's accepting states lead only to dead states, otherwise
the subset construction (a sentence gap may still be open when the next fragment's first token
arrives). The same language is written as one Python ``re`` pattern (:func:`completion_pattern`)
so that every method's output is checked independently of the automata
(:func:`completion_ok`).

Token budget: the fragments' tokens + per gap :func:`gap_budget` of its granularity + 1 for EOS;
the guide forbids tokens that would leave too few for the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ctrlg import dfa
from ctrlg.data.infill_mask import Granularity, MaskedDocument
from ctrlg.errors import ConstraintError

__all__ = ["GAP_PATTERNS", "GAP_TOKENS", "gap_budget", "Piece", "constraint_pieces", "gap_pattern",
           "completion_pattern", "completion_ok", "InfillConstraint", "build_constraint"]

_NON_FINAL_WORD = r"""(?:\S*[^\s.!?"'”’)\]]|\S*[^\s.!?]["'”’)\]]+|["'”’)\]]+)"""
GAP_PATTERNS = {
    Granularity.WORD: r"\S+",
    Granularity.NGRAM: r"\S+(?:[ \t]+\S+){{{m}}}",        # {m} = n − 1 more words
    Granularity.SENTENCE: rf"(?:{_NON_FINAL_WORD}[ \t]+)*\S+",
    Granularity.PARAGRAPH: r"\S+(?:[ \t]+\S+)*",
    Granularity.DOCUMENT: r"\S(?:[\s\S]*\S)?",
}
# most tokens a gap of each granularity may take, its leading whitespace included (an n-gram of n
# words: 2n + 3): above the 99th percentile of the masked spans of 1,500 training passages at the
# four ratios (SmolLM2's tokenizer: word 5, n-gram 2.7 per word, sentence 37, paragraph 84,
# document 161 tokens); the sum over a passage's gaps and fragments is its budget
GAP_TOKENS = {Granularity.WORD: 6, Granularity.NGRAM: (2, 3), Granularity.SENTENCE: 40,
              Granularity.PARAGRAPH: 96, Granularity.DOCUMENT: 176}


def gap_budget(granularity: Granularity, words: int) -> int:
    """The most tokens one blank may take (:data:`GAP_TOKENS`)."""
    if granularity == Granularity.NGRAM:
        per_word, extra = GAP_TOKENS[granularity]
        return per_word * words + extra
    return GAP_TOKENS[granularity]


@dataclass(frozen=True)
class Piece:
    """A fragment (``kind="text"``, its exact text) or a gap (``kind="gap"``: ``pattern`` is its
    regex, whitespace included; ``budget`` its most tokens; ``blanks`` the span indices)."""

    kind: str
    text: str = ""
    pattern: str = ""
    budget: int = 0
    blanks: tuple[int, ...] = ()


def gap_pattern(granularity: Granularity, words: int) -> str:
    """The regex of one blank's text (no leading whitespace); ``words`` counts an n-gram's words."""
    if granularity == Granularity.NGRAM:
        if words < 2:
            raise ConstraintError(f"an n-gram blank needs at least 2 words, got {words}")
        return GAP_PATTERNS[granularity].format(m=words - 1)
    return GAP_PATTERNS[granularity]


def _span_words(document: MaskedDocument, index: int) -> int:
    span = document.spans[index]
    return len(document.text[span.start:span.end].split())


def constraint_pieces(document: MaskedDocument) -> list[Piece]:
    """The passage as alternating fragments and gaps (module docstring); empty fragments are
    dropped and the gaps around them joined."""
    fragments = document.fragments
    pieces: list[Piece] = []
    pending_ws = ""                       # whitespace between the last piece and the next gap
    for index, fragment in enumerate(fragments):
        if index > 0:
            span = document.spans[index - 1]
            words = _span_words(document, index - 1)
            budget = gap_budget(span.granularity, words)
            pattern = re.escape(pending_ws) + gap_pattern(span.granularity, words)
            if pieces and pieces[-1].kind == "gap":
                last = pieces.pop()
                pieces.append(Piece("gap", pattern=last.pattern + pattern,
                                    budget=last.budget + budget + len(pending_ws),
                                    blanks=last.blanks + (index - 1,)))
            else:
                pieces.append(Piece("gap", pattern=pattern, budget=budget + len(pending_ws),
                                    blanks=(index - 1,)))
        body = fragment.rstrip()
        pending_ws = fragment[len(body):]
        if body.strip():
            pieces.append(Piece("text", text=body))
            continue
        pending_ws = fragment                      # whitespace only: it joins two gaps
    if not any(p.kind == "gap" for p in pieces):
        raise ConstraintError("the passage has no masked span")
    return pieces


def completion_pattern(document: MaskedDocument) -> str:
    """One Python ``re`` pattern (full match) of every completed passage the constraint accepts."""
    return "".join(re.escape(p.text) if p.kind == "text" else f"(?:{p.pattern})"
                   for p in constraint_pieces(document))


def completion_ok(document: MaskedDocument, text: str) -> bool:
    """Whether ``text`` keeps every fragment in order and fills each blank with text of its
    granularity (checked with Python's ``re``, independently of the automata)."""
    return re.fullmatch(completion_pattern(document), text) is not None


@dataclass
class InfillConstraint:
    """A masked passage's token DFA, its token budget and the pieces it was built from."""

    dfa: object
    budget: int
    pieces: list


_GAP_CACHE: dict[int, tuple[object, dict]] = {}     # id(tokenizer) -> (tokenizer, {key: DFA})


def _gap_dfa(pattern: str, tokenizer, vocab_size: int):
    """The gap's DFA over all encodings, compiled once per (pattern, V) and tokenizer (the cache
    keeps the tokenizer alive, so its id is not reused)."""
    _, cache = _GAP_CACHE.setdefault(id(tokenizer), (tokenizer, {}))
    key = (pattern, vocab_size)
    if key not in cache:
        if len(cache) >= 512:
            cache.clear()
        cache[key] = dfa.regex(pattern, tokenizer, "all", eos_token_id=None, vocab_size=vocab_size)
    return cache[key]


def build_constraint(document: MaskedDocument, tokenizer, vocab_size: int,
                     eos_token_id: int) -> InfillConstraint:
    """The DFA and budget of ``document`` (module docstring). Gap automata are compiled once per
    distinct pattern and tokenizer."""
    pieces = constraint_pieces(document)
    automata, budget = [], 1
    for piece in pieces:
        if piece.kind == "text":
            ids = tokenizer(piece.text, add_special_tokens=False)["input_ids"]
            automata.append(dfa.exact(ids, vocab_size))
            budget += len(ids)
        else:
            automata.append(_gap_dfa(piece.pattern, tokenizer, vocab_size))
            budget += piece.budget
    automata.append(dfa.exact([int(eos_token_id)], vocab_size))
    return InfillConstraint(dfa.concat(*automata), budget, pieces)
