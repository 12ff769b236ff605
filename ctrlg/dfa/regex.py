"""Regex → token DFA over a tokenizer's vocabulary (the Outlines index, as a :class:`TokenDFA`).

``regex(pattern, tokenizer, encodings="all")`` accepts exactly the token sequences whose bytes,
concatenated, are the UTF-8 encoding of a string ``s`` with ``re.fullmatch(pattern, s)``,
optionally followed by EOS tokens:

    L_tok = { t_1..t_n (EOS)* : bytes(t_1)···bytes(t_n) = utf8(s), s ∈ L(pattern) }.

Construction. The pattern's minimal byte DFA ``(Q, δ, q0, F)`` (:mod:`ctrlg.dfa.bytes_dfa`)
gives the token DFA directly: its states are ``Q`` (0 = dead) plus one *ended* state, and

    δ_tok(q, t) = δ*(q, bytes(t))      if that byte path never dies,
    δ_tok(q, EOS) = ended              for q ∈ F,   δ_tok(ended, EOS) = ended,

every other token going to the dead state (the default successor). Tokens that act identically
on the byte DFA's live states (same transformation q ↦ δ*(q, bytes(t))) are one *letter*; the
transformations are computed once per distinct (prefix transformation, byte class) pair over a
byte trie of the vocabulary (:func:`vocab_trie.token_transformations`, in :mod:`ctrlg.dfa.regex_index`), so the cost does not grow
with the number of tokens a character class admits, and the DFA is stored over letters.
Byte-level BPE (``Ġ``), byte-fallback ``<0x..>`` tokens and tokens holding partial UTF-8
sequences need no special case: a token is just its bytes, and the byte DFA only accepts valid
UTF-8, so any accepted concatenation decodes to a matching string. Accepting states are ``F``
and *ended*: a sequence is accepted whether or not it ends with EOS.

``encodings="canonical"`` keeps only the tokenizer's own segmentation: as one token DFA (the
product of :mod:`ctrlg.dfa.canonical`) when the pattern's all-encodings DFA is small, otherwise
as a :class:`~ctrlg.dfa.canonical_filter.CanonicalDFA` (that DFA plus a decode-time canonicality
filter; same language), since canonical DFAs of loops over large token classes need millions of
transitions.
"""

from __future__ import annotations

from ctrlg.dfa.bytes_dfa import compile_bytes_dfa
from ctrlg.dfa.canonical import PairBudgetExceeded, canonical_token_dfa
from ctrlg.dfa.canonical_filter import CanonicalDFA
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.minimize import minimize as minimize_dfa
from ctrlg.dfa.regex_index import AUTO, resolve_eos, resolve_vocab_size, token_dfa_from_bytes_dfa
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.dfa.regex_syntax import parse, positions
from ctrlg.errors import ConstraintError, RegexError

__all__ = ["regex", "token_dfa_from_bytes_dfa", "resolve_eos", "resolve_vocab_size", "ENCODINGS"]

ENCODINGS = ("all", "canonical")
_AUTO = AUTO
# Canonical mode builds the product automaton when the all-encodings DFA has at most this many
# token-level transitions out of the dead state (the product's pair checks grow with them), and
# a CanonicalDFA otherwise. The benchmark's fixed-format patterns have ≤ 2,500, its patterns
# with large-class loops ≥ 93,000.
PRODUCT_MAX_EXCEPTIONS = 20_000
#: the default bound on a pattern's character positions (repetitions counted out): a literal of
#: 20,000 characters compiles in 5–20 s (linear in its length), ``(a{1000}){1000}`` (10^6) is
#: refused at once
MAX_POSITIONS = 20_000


def regex(pattern: str, tokenizer, encodings: str = "all", *, eos_token_id=_AUTO,
          vocab_size: int | None = None, max_pair_checks: int = 5_000_000,
          minimize: bool = True, canonical_form: str = "auto",
          max_positions: int | None = MAX_POSITIONS) -> TokenDFA | CanonicalDFA:
    """Compile ``pattern`` (full-match semantics) into a :class:`TokenDFA` over the vocabulary.

    Args:
        pattern: a regular expression in the syntax of :mod:`ctrlg.dfa.regex_syntax`.
        tokenizer: a ``transformers`` tokenizer, a :class:`VocabTrie`, or a list of token bytes.
        encodings: ``"all"`` — every token sequence that decodes to a matching string;
            ``"canonical"`` — only ``tokenizer.encode(s, add_special_tokens=False)`` for matching
            strings ``s`` (needs a ``transformers`` tokenizer).
        eos_token_id: the EOS token allowed (repeatedly) after a full match; default the
            tokenizer's ``eos_token_id``; ``None`` disables EOS edges.
        vocab_size: V of the DFA (default: the tokenizer's vocabulary size); may exceed it when
            the LM's embedding matrix is padded.
        max_pair_checks: canonical mode only; the product automaton gives way to a
            :class:`CanonicalDFA` instead of checking more token pairs.
        canonical_form: canonical mode only: ``"auto"`` (the product automaton when the
            all-encodings DFA has at most :data:`PRODUCT_MAX_EXCEPTIONS` token transitions and
            the product needs at most ``max_pair_checks`` pair checks, else a
            :class:`CanonicalDFA`), ``"product"`` (always the product; ConstraintError beyond
            ``max_pair_checks``) or ``"filter"`` (always a :class:`CanonicalDFA`).
        max_positions: the most character positions the pattern may expand to, counted
            repetitions written out (:func:`~ctrlg.dfa.regex_syntax.positions`; a literal of n
            characters has n, ``(a{100}){100}`` 10,000), checked before any automaton is built
            (RegexError naming the bound); ``None``: no bound.
        minimize: return the minimal DFA (:func:`ctrlg.dfa.minimize`), whose default successors
            are the most common ones: far fewer stored exceptions for permissive regexes such as
            ``[^\n]*`` (what the Ctrl-G guide pays for); ``False`` keeps the raw index, whose
            default is the dead state.

    Raises:
        RegexError / UnsupportedRegexError: empty, invalid or non-regular pattern.
        VocabularyMismatchError: the vocabulary cannot be decoded to bytes.
        UnsatisfiableConstraintError: no token sequence spells a matching string.
        ConstraintError: bad ``encodings`` or ``vocab_size``.
    """
    if encodings not in ENCODINGS:
        raise ConstraintError(f"encodings must be one of {ENCODINGS}, got {encodings!r}")
    if canonical_form not in CANONICAL_FORMS:
        raise ConstraintError(f"canonical_form must be one of {CANONICAL_FORMS}, got "
                              f"{canonical_form!r}")
    if max_positions is not None:
        size = positions(parse(pattern))
        if size > max_positions:
            raise RegexError(f"regex {pattern[:80]!r}{'...' if len(pattern) > 80 else ''} expands "
                             f"to {size:,} character positions (repetitions counted out), more "
                             f"than max_positions={max_positions:,}: its automaton would take "
                             f"minutes to build; use smaller counts, an unbounded repetition, "
                             f"or raise max_positions")
    bdfa = compile_bytes_dfa(pattern)
    what = f"regex {pattern!r}"
    trie = vocab_trie(tokenizer)
    dfa = token_dfa_from_bytes_dfa(bdfa, trie, eos_token_id=eos_token_id,
                                   vocab_size=vocab_size, what=what)
    if encodings == "canonical":
        return _canonical(bdfa, dfa, tokenizer, resolve_eos(trie, eos_token_id), canonical_form,
                          max_pair_checks, what, vocab_size=vocab_size)
    if minimize:
        dfa = minimize_dfa(dfa)
    return dfa


CANONICAL_FORMS = ("auto", "product", "filter")


def _canonical(bdfa, all_dfa: TokenDFA, tokenizer, eos: int | None, form: str,
               max_pair_checks: int, what: str, vocab_size: int | None) -> TokenDFA | CanonicalDFA:
    """Canonical mode: the product automaton or a CanonicalDFA over ``all_dfa`` (``form``)."""
    if form == "product" or (form == "auto" and all_dfa.num_exceptions <= PRODUCT_MAX_EXCEPTIONS):
        try:
            return canonical_token_dfa(bdfa, tokenizer, eos_token_id=eos, vocab_size=vocab_size,
                                       max_pair_checks=max_pair_checks, what=what,
                                       all_dfa=all_dfa)
        except PairBudgetExceeded:
            if form == "product":
                raise
    return CanonicalDFA(minimize_dfa(all_dfa), tokenizer,
                        eos_token_ids=() if eos is None else (eos,), what=what)
