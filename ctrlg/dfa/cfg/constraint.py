"""A context-free grammar over a tokenizer's vocabulary, in the form the guide accepts.

A :class:`GrammarConstraint` accepts exactly the token sequences whose bytes, up to the first
EOS, form a sentence of the grammar (:mod:`ctrlg.dfa.cfg.grammar_ir`), optionally followed by EOS —
every encoding of a sentence, as ``dfa.regex(encodings="all")``:

    L_tok = { t_1..t_n (EOS)* : bytes(t_1)···bytes(t_n) ∈ L(G) }.

It carries the two halves every constraint has for the processor (:mod:`ctrlg.guide.masks`):

* ``dfa`` — the token DFA A of the regular superset ``R_d ⊇ L(G)``
  (:mod:`ctrlg.dfa.cfg.approximation`), over which Ctrl-G's HMM tables are built;
* ``recogniser`` and ``index`` — the Earley recogniser and the token tables from which
  :class:`ctrlg.guide.grammar_masks.GrammarFeasibility` computes the exact masks at decode time.

It is the same split as :class:`~ctrlg.dfa.canonical_filter.CanonicalDFA` (all-encodings DFA for
the tables, exact filter at decode time). Intersection, union and the other DFA operations do not
apply to a grammar (use the grammar's own rules instead).
"""

from __future__ import annotations

import weakref

from typing import Sequence

from ctrlg.dfa.cfg.approximation import check_grammar_size, regular_superset
from ctrlg.dfa.cfg.anchors import resolve_anchors
from ctrlg.dfa.cfg.earley import DEAD, Recogniser, forget_terminal_dfas
from ctrlg.dfa.cfg.grammar_ir import Grammar, reduce, with_ignored
from ctrlg.dfa.cfg.lark_syntax import forget_read_grammars
from ctrlg.dfa.cfg.token_index import Suffixes, TokenIndex
from ctrlg.dfa.core import TokenDFA, WrapsTokenDFA
from ctrlg.dfa.minimize import minimize
from ctrlg.dfa.regex_index import resolve_eos, resolve_vocab_size, token_dfa_from_bytes_dfa
from ctrlg.dfa.vocab_trie import VocabTrie
from ctrlg.errors import ConstraintError, GrammarError

__all__ = ["GrammarConstraint", "prepared_bnf", "vocabulary_suffixes", "clear_shared_caches"]

#: per vocabulary trie, its :class:`~ctrlg.dfa.cfg.token_index.Suffixes` by (size, EOS ids)
_SUFFIXES: "weakref.WeakKeyDictionary[VocabTrie, dict]" = weakref.WeakKeyDictionary()


def vocabulary_suffixes(trie: VocabTrie, size: int, eos_token_ids: tuple) -> Suffixes:
    """The token index's vocabulary arrays for ``trie`` padded to ``size`` tokens, the EOS ids
    without bytes: built once per (trie, size, EOS ids) and shared by every grammar over it
    (≈ 25 ms for 49,152 tokens)."""
    per_trie = _SUFFIXES.setdefault(trie, {})
    key = (int(size), tuple(eos_token_ids))
    got = per_trie.get(key)
    if got is None:
        token_bytes = list(trie.token_bytes) + [b""] * (size - trie.vocab_size)
        for e in eos_token_ids:
            token_bytes[e] = b""
        got = per_trie[key] = Suffixes.of(token_bytes)
    return got


def clear_shared_caches() -> None:
    """Empty what grammars share within a process: the terminal runs over every vocabulary
    (:meth:`~ctrlg.dfa.cfg.token_index.Suffixes.forget_runs`; the vocabulary arrays stay), the
    compiled terminal DFAs (:func:`ctrlg.dfa.cfg.earley.terminal_dfa`) and the grammars read from
    Lark text. Each is bounded on its own (``MAX_SHARED_RUN_BYTES``, ``MAX_TERMINAL_DFAS``,
    ``MAX_READ_GRAMMARS``); this is for a benchmark's cold start, or a server that wants the memory
    back. Constraints built before keep working: they hold their own references."""
    forget_terminal_dfas()
    forget_read_grammars()
    for per_size in list(_SUFFIXES.values()):
        for vocabulary in list(per_size.values()):
            vocabulary.forget_runs()


def prepared_bnf(grammar: Grammar, what: str = "grammar") -> Grammar:
    """``grammar`` as the constraint reads it: reduced (rules that derive no sentence or are
    unreachable removed), ignored terminals placed, its size checked, anchored terminals
    resolved. GrammarError when it generates no sentence."""
    bnf = with_ignored(reduce(grammar))
    check_grammar_size(bnf, f"the {what}")
    anchored = resolve_anchors(bnf)
    if anchored is not bnf:
        try:
            bnf = reduce(anchored)
        except GrammarError:
            raise GrammarError(
                f"the {what} generates no sentence once its anchored terminals are read as "
                f"Lark reads them ('^'/'\\A' only at the start of the input, '\\Z' only "
                f"at its end, '$' at its end or before a final newline)") from None
    return bnf


class GrammarConstraint(WrapsTokenDFA):
    """The token sequences that spell a sentence of ``grammar`` (module docstring).

    Args:
        grammar: the BNF grammar (:class:`~ctrlg.dfa.cfg.grammar_ir.Grammar`).
        trie: the vocabulary (:class:`~ctrlg.dfa.vocab_trie.VocabTrie`).
        eos_token_id: EOS allowed after a sentence (``ctrlg.dfa.regex``'s rules).
        vocab_size: V (default the vocabulary's size).
        depth: nesting depth of the regular superset, or ``"auto"``
            (:func:`~ctrlg.dfa.cfg.approximation.regular_superset`).
        what: a description for messages.

    Attributes:
        dfa: the token DFA of the regular superset (A).
        depth: the depth used; ``exact``: whether A's language is the grammar's.
    """

    def __init__(self, grammar: Grammar, trie: VocabTrie, *, eos_token_id, vocab_size=None,
                 depth: int | str = "auto", what: str = "grammar"):
        bnf = prepared_bnf(grammar, what)
        self._build(grammar, bnf, regular_superset(bnf, depth), trie, eos_token_id=eos_token_id,
                    vocab_size=vocab_size, what=what, precompute=True)

    @classmethod
    def over_superset(cls, grammar: Grammar, bnf: Grammar, superset: tuple, trie: VocabTrie, *,
                      eos_token_id, vocab_size=None, what: str = "grammar") -> "GrammarConstraint":
        """The constraint over a superset already built: ``bnf`` is :func:`prepared_bnf` of
        ``grammar`` and ``superset`` = ``(byte DFA, depth, exact)`` of
        :func:`~ctrlg.dfa.cfg.approximation.regular_superset` for it. The token index computes
        its runs on first use (:class:`~ctrlg.dfa.cfg.token_index.TokenIndex`,
        ``precompute=False``): what ``dfa.lazy_grammar`` returns for a self-embedding grammar."""
        out = cls.__new__(cls)
        out._build(grammar, bnf, superset, trie, eos_token_id=eos_token_id,
                   vocab_size=vocab_size, what=what, precompute=False)
        return out

    def _build(self, grammar, bnf, superset, trie, *, eos_token_id, vocab_size, what,
               precompute: bool) -> None:
        self.grammar = grammar
        self.what = what
        self.bnf = bnf
        self.recogniser = Recogniser(self.bnf)
        bdfa, self.depth, self.exact = superset
        dfa = token_dfa_from_bytes_dfa(bdfa, trie, eos_token_id=eos_token_id,
                                       vocab_size=vocab_size, what=what)
        self.dfa: TokenDFA = minimize(dfa)
        eos = resolve_eos(trie, eos_token_id)
        self.eos_token_ids = () if eos is None else (int(eos),)
        size = resolve_vocab_size(trie, vocab_size, eos)
        vocabulary = vocabulary_suffixes(trie, size, self.eos_token_ids)
        self.token_bytes = vocabulary.token_bytes
        self.index = TokenIndex(self.recogniser, vocabulary, precompute=precompute)

    # -- membership -----------------------------------------------------------------------
    def text_bytes(self, tokens: Sequence[int]) -> bytes:
        """The bytes of ``tokens`` up to the first EOS."""
        out = []
        for t in tokens:
            if int(t) in self.eos_token_ids:
                break
            out.append(self.token_bytes[int(t)])
        return b"".join(out)

    def matches(self, text: str | bytes) -> bool:
        """Whether ``text`` is a sentence of the grammar."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return self.recogniser.accepts(data)

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` spell a sentence, optionally followed by EOS (module docstring)."""
        tokens = [int(t) for t in tokens]
        if any(not 0 <= t < self.vocab_size for t in tokens):
            raise ConstraintError(f"token ids must lie in [0, {self.vocab_size}), got {tokens}")
        return self.dfa.accepts(tokens) and self.matches(self.text_bytes(tokens))

    def prefix_viable(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (no EOS) can still be completed to a sentence, with no budget."""
        s = self.recogniser.feed(self.recogniser.start(), self.text_bytes(tokens))
        return s is not DEAD

    def __repr__(self) -> str:
        kind = "exact" if self.exact else f"depth {self.depth}"
        return (f"GrammarConstraint({self.what}; regular superset {kind}: {self.dfa.num_states} "
                f"states, V={self.vocab_size})")
