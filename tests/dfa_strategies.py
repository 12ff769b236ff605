"""Hypothesis strategies and brute-force helpers for token DFAs over tiny vocabularies.

Other test modules may import these::

    from dfa_strategies import token_dfas, phrases, all_sequences, language

(pytest puts tests/ on sys.path, since it has no __init__.py).

``language(dfa, max_len)`` is the acceptance of every token sequence of length ≤ ``max_len`` in
the order of ``all_sequences(V, max_len)``, computed from the dense table (independent of the
operations under test).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
from hypothesis import strategies as st

from ctrlg.dfa.core import TokenDFA


@st.composite
def token_dfas(draw, vocab_size: int | None = None, max_states: int = 5,
               min_vocab: int = 1, max_vocab: int = 4) -> TokenDFA:
    """A random complete DFA with 1..max_states states over V tokens (V drawn in
    [min_vocab, max_vocab] unless given). Transitions are biased towards a per-state default so
    the sparse representation has both defaults and exceptions."""
    V = vocab_size if vocab_size is not None else draw(st.integers(min_vocab, max_vocab))
    S = draw(st.integers(1, max_states))
    rows = []
    for _ in range(S):
        default = draw(st.integers(0, S - 1))
        row = draw(st.lists(st.one_of(st.just(default), st.integers(0, S - 1)),
                            min_size=V, max_size=V))
        rows.append(row)
    accepting = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    initial = draw(st.integers(0, S - 1))
    return TokenDFA.from_dense(np.array(rows, dtype=np.int64).reshape(S, V), accepting, initial)


def phrases(vocab_size: int, max_len: int = 3, max_count: int = 3):
    """A non-empty list of non-empty token phrases over ``range(vocab_size)``."""
    one = st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_len)
    return st.lists(one, min_size=1, max_size=max_count)


@lru_cache(maxsize=None)
def all_sequences(vocab_size: int, max_len: int) -> tuple[tuple[int, ...], ...]:
    """Every token sequence of length 0..max_len, shortest first, then lexicographic."""
    out: list[tuple[int, ...]] = []
    for n in range(max_len + 1):
        out.extend(itertools.product(range(vocab_size), repeat=n))
    return tuple(out)


def language(dfa: TokenDFA, max_len: int) -> np.ndarray:
    """Bool vector: acceptance of each sequence of ``all_sequences(V, max_len)``."""
    table = dfa.dense()
    V = dfa.vocab_size
    states = np.array([dfa.initial])
    out = [dfa.accepting[states]]
    for _ in range(max_len):
        states = table[states].ravel()  # children of each sequence, in lexicographic order
        out.append(dfa.accepting[states])
    return np.concatenate(out)


def minimal_state_count(dfa: TokenDFA) -> int:
    """Number of Myhill–Nerode classes among reachable states (table-filling algorithm on the
    dense table; an independent reference for ``minimize``)."""
    table = dfa.dense()
    reach = {dfa.initial}
    stack = [dfa.initial]
    while stack:
        s = stack.pop()
        for t in table[s].tolist():
            if t not in reach:
                reach.add(t)
                stack.append(t)
    states = sorted(reach)
    distinct = {(p, q) for p in states for q in states if dfa.accepting[p] != dfa.accepting[q]}
    changed = True
    while changed:
        changed = False
        for p in states:
            for q in states:
                if (p, q) in distinct:
                    continue
                if any((table[p, v], table[q, v]) in distinct for v in range(dfa.vocab_size)):
                    distinct.add((p, q))
                    changed = True
    classes = []
    for p in states:
        if not any((p, q) not in distinct for q in classes):
            classes.append(p)
    return len(classes)


@st.composite
def lettered_dfas(draw, vocab_size: int | None = None, max_states: int = 4,
                  max_vocab: int = 5) -> TokenDFA:
    """A random DFA stored over letters: a random DFA over A letters plus a random surjective
    map from V ≥ A tokens to letters."""
    V = vocab_size if vocab_size is not None else draw(st.integers(1, max_vocab))
    A = draw(st.integers(1, V))
    base = draw(token_dfas(vocab_size=A, max_states=max_states))
    letters = np.array(list(range(A)) + draw(st.lists(st.integers(0, A - 1), min_size=V - A,
                                                       max_size=V - A)), dtype=np.int64)
    letters = letters[np.array(draw(st.permutations(range(V))), dtype=np.int64)]
    return TokenDFA(V, base.initial, base.accepting, base.default, base.letter_ptr,
                    base.letter_exc, base.letter_next, letter_of_token=letters)
