"""The all-encodings token automaton of a byte DFA (the index behind :func:`ctrlg.dfa.regex`).

``token_dfa_from_bytes_dfa(bdfa, trie)`` builds the token DFA described in :mod:`ctrlg.dfa.regex`
(states: the byte DFA's states plus one *ended* state; exceptions found by walking the vocabulary
trie). It lives apart from the regex front end so that both :mod:`ctrlg.dfa.regex` and
:mod:`ctrlg.dfa.canonical` import it without importing each other.
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.bytes_dfa import ByteDFA
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.vocab_trie import VocabTrie, walk
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError

__all__ = ["AUTO", "resolve_eos", "resolve_vocab_size", "token_dfa_from_bytes_dfa"]

#: Sentinel for "the vocabulary's EOS" (``eos_token_id`` not given).
AUTO = object()
_AUTO = AUTO


def resolve_eos(trie: VocabTrie, eos_token_id) -> int | None:
    return trie.eos_token_id if eos_token_id is _AUTO else eos_token_id


def resolve_vocab_size(trie: VocabTrie, vocab_size: int | None, eos: int | None) -> int:
    V = trie.vocab_size if vocab_size is None else int(vocab_size)
    if V < trie.vocab_size:
        raise ConstraintError(
            f"vocab_size={vocab_size} is smaller than the tokenizer's {trie.vocab_size} tokens")
    if eos is not None and not 0 <= eos < V:
        raise ConstraintError(f"eos_token_id {eos} out of range [0, {V})")
    return V


def token_dfa_from_bytes_dfa(bdfa: ByteDFA, trie: VocabTrie, *, eos_token_id=_AUTO,
                             vocab_size: int | None = None, what: str = "pattern") -> TokenDFA:
    """The all-encodings token DFA of a byte DFA (module docstring). States: byte-DFA states
    (0 dead) plus ``ended`` = Q."""
    eos = resolve_eos(trie, eos_token_id)
    V = resolve_vocab_size(trie, vocab_size, eos)
    live = bdfa.live()
    if not live[bdfa.initial]:
        raise UnsatisfiableConstraintError(f"the {what} matches no string")
    Q = bdfa.num_states
    sources = np.nonzero(live)[0]
    src, tok, end = walk(trie, bdfa.table, live, sources)
    ended = Q
    if eos is not None:
        acc = np.nonzero(bdfa.accepting & live)[0]
        src = np.concatenate([src, acc, [ended]])
        tok = np.concatenate([tok, np.full(len(acc) + 1, eos)])
        end = np.concatenate([end, np.full(len(acc) + 1, ended)])
        # an EOS with bytes (rare) must not also be a byte edge
        order = np.lexsort((tok, src))
        src, tok, end = src[order], tok[order], end[order]
        keep = np.ones(len(src), dtype=bool)
        dup = (src[1:] == src[:-1]) & (tok[1:] == tok[:-1])
        keep[:-1][dup] = False   # keep the EOS edge (appended last, so sorted last by stability)
        src, tok, end = src[keep], tok[keep], end[keep]
    S = Q + 1
    exc_ptr = np.searchsorted(src, np.arange(S + 1)).astype(np.int64)
    accepting = np.zeros(S, dtype=bool)
    accepting[:Q] = bdfa.accepting & live
    accepting[ended] = eos is not None
    dfa = TokenDFA(vocab_size=V, initial=int(bdfa.initial), accepting=accepting,
                   default=np.zeros(S, dtype=np.int64), exc_ptr=exc_ptr,
                   exc_tokens=tok.astype(np.int64), exc_next=end.astype(np.int64))
    if not _reaches_acceptance(dfa):
        raise UnsatisfiableConstraintError(
            f"the {what} matches strings, but no token sequence of this vocabulary spells one")
    return dfa


def _reaches_acceptance(dfa: TokenDFA) -> bool:
    return not dfa.is_empty()
