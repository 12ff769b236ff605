"""Token-level constraint builders: phrases, phrase sets, length ranges, EOS discipline.

* :func:`phrase` — the Knuth–Morris–Pratt automaton: state j = length of the longest prefix of
  the pattern that is a suffix of the input; δ(j, p[j]) = j+1 and δ(j, a) = δ(fail(j), a)
  otherwise, so only the pattern's own tokens are exceptions (k+1 states for a k-token phrase).
* :func:`any_phrase` — the Aho–Corasick automaton of a phrase set: the trie with failure links,
  where a node is a match if it or any node on its failure chain ends a phrase (so a phrase
  contained in another one, e.g. ``[2, 3]`` inside ``[12, 3]`` or ``[2]`` inside ``[1, 2, 3]``,
  is still detected). Matching is absorbing: once a phrase occurred, the DFA accepts forever.
* :func:`length` — ``min_tokens ≤ n ≤ max_tokens``.
* :func:`eos` — after EOS only EOS (optionally: EOS required at the end).
* :func:`banned_phrases` — the complement of :func:`any_phrase`.
* :func:`starts_with`, :func:`exact`, :func:`universal` — anchored phrases, one exact sequence, Σ*.

:func:`any_phrase` and :func:`starts_with` take an optional ``boundary`` mask: an occurrence then
counts only if it ends the sequence or is followed by a boundary token (a "pending" state per
match node, built over three kinds of letters: phrase tokens, boundary tokens, the rest).

Every builder validates its input and raises :class:`~ctrlg.errors.ConstraintError` (a
``ValueError``) naming the offending phrase or token.
"""

from __future__ import annotations

import operator
from collections import deque
from typing import Iterable, Sequence

import numpy as np

from ctrlg.dfa.core import DFABuilder, TokenClasses, TokenDFA
from ctrlg.dfa.ops import complement, finish
from ctrlg.errors import ConstraintError

__all__ = ["phrase", "any_phrase", "length", "eos", "banned_phrases", "starts_with", "exact",
           "universal"]


def check_count_range(what: str, low_name: str, low, high_name: str, high) -> None:
    """Raise ConstraintError unless ``low`` is a non-negative int and ``high`` is None or an int
    with ``low ≤ high`` (shared by the token-length and word-count builders)."""
    for name, value in ((low_name, low), (high_name, high)):
        if value is None and name == high_name:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ConstraintError(f"{name} must be a non-negative int, got {value!r}")
    if high is not None and high < low:
        raise ConstraintError(f"{what} range is empty: {low_name}={low} > {high_name}={high}")


def _check_vocab_size(vocab_size) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
            or vocab_size <= 0:
        raise ConstraintError(f"vocab_size must be a positive int, got {vocab_size!r}")
    return int(vocab_size)


def _check_phrase(tokens, vocab_size: int, what: str = "phrase") -> list[int]:
    if isinstance(tokens, (str, bytes)):
        raise ConstraintError(f"{what} must be a sequence of token ids, got the string {tokens!r}"
                              " (encode it with the tokenizer first)")
    try:
        ids = [t for t in tokens]
    except TypeError:
        raise ConstraintError(f"{what} must be a sequence of token ids, got {tokens!r}") from None
    if not ids:
        raise ConstraintError(f"empty {what}: a {what} needs at least one token")
    out = []
    for t in ids:
        try:
            if isinstance(t, (bool, np.bool_)):
                raise TypeError
            t = operator.index(t)            # ints, numpy and torch integer scalars
        except TypeError:
            raise ConstraintError(f"{what} {ids!r} contains {t!r}, which is not a token id") \
                from None
        if not 0 <= t < vocab_size:
            raise ConstraintError(
                f"{what} {ids!r} contains token id {t} out of range [0, {vocab_size})")
        out.append(int(t))
    return out


def _check_phrases(phrases, vocab_size: int) -> list[list[int]]:
    if isinstance(phrases, (str, bytes)) or not isinstance(phrases, Iterable):
        raise ConstraintError(f"phrases must be a list of token-id lists, got {phrases!r}")
    checked = [_check_phrase(p, vocab_size) for p in phrases]
    if not checked:
        raise ConstraintError("phrases is empty: give at least one phrase")
    return checked


def universal(vocab_size: int) -> TokenDFA:
    """Σ*: accepts every token sequence (one accepting, absorbing state)."""
    builder = DFABuilder(_check_vocab_size(vocab_size))
    builder.add_state(accepting=True)
    return builder.build()


def phrase(tokens: Sequence[int], vocab_size: int) -> TokenDFA:
    """Accepts the token sequences that contain ``tokens`` as a contiguous subsequence
    (KMP automaton, ``len(tokens) + 1`` states, exceptions only on the phrase's tokens)."""
    V = _check_vocab_size(vocab_size)
    p = _check_phrase(tokens, V)
    k = len(p)
    builder = DFABuilder(V)
    for j in range(k + 1):
        builder.add_state(accepting=(j == k), default=0 if j < k else k)
    rows: list[dict[int, int]] = [{p[0]: 1}]
    restart = 0
    for j in range(1, k):
        row = dict(rows[restart])
        row[p[j]] = j + 1
        rows.append(row)
        restart = rows[restart].get(p[j], 0)
    for j, row in enumerate(rows):
        builder.set_transitions(j, 0, row)
    return builder.build()


def _trie(phrases: list[list[int]]) -> tuple[list[dict[int, int]], list[bool]]:
    children: list[dict[int, int]] = [{}]
    terminal = [False]
    for p in phrases:
        node = 0
        for t in p:
            nxt = children[node].get(t)
            if nxt is None:
                nxt = len(children)
                children[node][t] = nxt
                children.append({})
                terminal.append(False)
            node = nxt
        terminal[node] = True
    return children, terminal


def _aho_corasick(phrases: list[list[int]]) -> tuple[list[dict[int, int]], list[bool]]:
    """Goto/failure automaton of the trie: ``delta[node]`` holds the transitions that do not go
    back to the root; ``match[node]`` is True iff some phrase ends at ``node`` or at a node on its
    failure chain (output propagation)."""
    children, terminal = _trie(phrases)
    n = len(children)
    fail = [0] * n
    match = list(terminal)
    delta: list[dict[int, int]] = [{} for _ in range(n)]
    delta[0] = dict(children[0])
    queue = deque(children[0].values())
    while queue:
        node = queue.popleft()
        match[node] = match[node] or match[fail[node]]
        row = dict(delta[fail[node]])
        row.update(children[node])
        delta[node] = row
        for t, child in children[node].items():
            fail[child] = delta[fail[node]].get(t, 0)
            queue.append(child)
    return delta, match


def _check_boundary(boundary, vocab_size: int) -> np.ndarray:
    mask = np.asarray(boundary)
    if mask.dtype != bool or mask.shape != (vocab_size,):
        raise ConstraintError(f"boundary must be a bool mask of shape ({vocab_size},), got "
                              f"dtype {mask.dtype} and shape {mask.shape}")
    return mask


def _with_boundary(rows: list[dict[int, int]], pending: list[bool], fallback: int,
                   boundary: np.ndarray, what: str) -> TokenDFA:
    """Class-level automaton for "a pending node followed by a boundary token (or the end)".

    ``rows[u]`` are node u's explicit transitions (all other tokens go to ``fallback``: the root
    for Aho–Corasick, the dead state for an anchored trie); a pending node accepts at the end of
    the input and moves to an absorbing accepting state on a boundary token."""
    tokens = sorted({t for row in rows for t in row})
    labels = np.where(boundary, 0, 1).astype(np.int64)
    labels[tokens] = 2 + np.arange(len(tokens))
    classes = TokenClasses.from_labels(labels)
    n = len(rows)
    accept = n
    table = np.full((n + 1, classes.num_classes), fallback, dtype=np.int64)
    for u, row in enumerate(rows):
        if row:
            table[u, classes.class_of_token[list(row)]] = list(row.values())
    boundary_classes = boundary[classes.representatives]
    for u in np.nonzero(pending)[0]:
        table[u, boundary_classes] = accept
    table[accept] = accept
    accepting = np.array(list(pending) + [True])
    return finish(table, accepting, 0, classes, False, what)


def any_phrase(phrases: Sequence[Sequence[int]], vocab_size: int,
               boundary=None) -> TokenDFA:
    """Accepts the token sequences that contain at least one of ``phrases`` (Aho–Corasick).

    Output propagation along failure links makes a phrase that occurs inside another one count
    (``any_phrase([[12, 3], [2, 3]])`` accepts both ``[12, 3]`` and ``[2, 3]``).

    ``boundary`` (optional bool mask [V]): an occurrence counts only if it ends the sequence or
    the next token is a boundary token (e.g. tokens that cannot continue a word).
    """
    V = _check_vocab_size(vocab_size)
    delta, match = _aho_corasick(_check_phrases(phrases, V))
    if boundary is not None:
        return _with_boundary(delta, match, 0, _check_boundary(boundary, V), "phrase constraint")
    # all matching nodes collapse into one absorbing accepting state
    ids: dict[int, int] = {}
    for node in range(len(delta)):
        if not match[node]:
            ids[node] = len(ids)
    accept = len(ids)
    builder = DFABuilder(V)
    for node in ids:
        builder.add_state(default=ids[0])
    builder.add_state(accepting=True)
    for node, s in ids.items():
        row = {t: ids.get(nxt, accept) for t, nxt in delta[node].items()}
        builder.set_transitions(s, ids[0], row)
    return builder.build(initial=ids[0] if 0 in ids else accept).trim()


def starts_with(phrases: Sequence[Sequence[int]], vocab_size: int,
                boundary=None) -> TokenDFA:
    """Accepts the token sequences that begin with at least one of ``phrases`` (a trie whose
    terminal nodes are absorbing accepting states; every other token leads to a dead state).
    ``boundary`` as in :func:`any_phrase`: the phrase must end the sequence or be followed by a
    boundary token."""
    V = _check_vocab_size(vocab_size)
    children, terminal = _trie(_check_phrases(phrases, V))
    dead = len(children)
    if boundary is not None:
        rows = [dict(c) for c in children] + [{}]
        return _with_boundary(rows, terminal + [False], dead, _check_boundary(boundary, V),
                              "phrase constraint")
    builder = DFABuilder(V)
    for node in range(len(children)):
        if terminal[node]:
            builder.add_state(accepting=True)           # absorbing
        else:
            builder.add_state(default=dead)
            builder.set_transitions(node, dead, children[node])
    builder.add_state()                                   # dead, absorbing
    return builder.build().trim()


def exact(tokens: Sequence[int], vocab_size: int) -> TokenDFA:
    """Accepts exactly one token sequence."""
    V = _check_vocab_size(vocab_size)
    p = _check_phrase(tokens, V, "sequence")
    k = len(p)
    builder = DFABuilder(V)
    dead = k + 1
    for j in range(k + 1):
        builder.add_state(accepting=(j == k), default=dead)
        if j < k:
            builder.set_edge(j, p[j], j + 1)
    builder.add_state()
    return builder.build()


# Largest token bound accepted by :func:`length`: one state per count (0.5 s and ~50 MB at this
# bound); no LM context comes near it.
MAX_TOKEN_BOUND = 1 << 20


def length(min_tokens: int = 0, max_tokens: int | None = None,
           vocab_size: int | None = None) -> TokenDFA:
    """Accepts the sequences of ``min_tokens ≤ n ≤ max_tokens`` tokens (no upper bound when
    ``max_tokens`` is None). Every token, EOS included, counts. ``vocab_size`` is required.
    Both bounds must be ≤ :data:`MAX_TOKEN_BOUND` (the automaton has a state per count)."""
    V = _check_vocab_size(vocab_size)
    check_count_range("length", "min_tokens", min_tokens, "max_tokens", max_tokens)
    for name, value in (("min_tokens", min_tokens), ("max_tokens", max_tokens)):
        if value is not None and value > MAX_TOKEN_BOUND:
            raise ConstraintError(
                f"{name}={value} is above the supported token bound {MAX_TOKEN_BOUND:,}: the "
                f"automaton needs a state for every count up to it, and no LM context is that "
                f"long; use max_tokens=None for no upper bound")
    builder = DFABuilder(V)
    if max_tokens is None:
        for i in range(min_tokens + 1):
            builder.add_state(accepting=(i == min_tokens), default=min(i + 1, min_tokens))
    else:
        for i in range(max_tokens + 2):
            builder.add_state(accepting=(min_tokens <= i <= max_tokens),
                              default=min(i + 1, max_tokens + 1))
    return builder.build()


def eos(eos_token_id: int, vocab_size: int, required: bool = False) -> TokenDFA:
    """EOS discipline: once ``eos_token_id`` occurred, only EOS may follow.

    With ``required=True`` the sequence must also end with EOS (so it contains at least one).
    Intersect with another constraint to make the EOS-terminated generation satisfy it; EOS is
    an ordinary token for the other automata (it is in none of their phrases and counts for
    :func:`length`).
    """
    V = _check_vocab_size(vocab_size)
    if isinstance(eos_token_id, bool) or not isinstance(eos_token_id, (int, np.integer)) \
            or not 0 <= eos_token_id < V:
        raise ConstraintError(f"eos_token_id {eos_token_id!r} out of range [0, {V})")
    builder = DFABuilder(V)
    before = builder.add_state(accepting=not required)
    after = builder.add_state(accepting=True)
    dead = builder.add_state()
    builder.set_transitions(before, before, {int(eos_token_id): after})
    builder.set_transitions(after, dead, {int(eos_token_id): after})
    return builder.build(initial=before)


def banned_tokens(token_ids: Sequence[int], vocab_size: int) -> TokenDFA:
    """Accepts the token sequences in which none of ``token_ids`` occurs: two states, the
    accepting one looping on every other token (its default successor) and a dead sink."""
    V = _check_vocab_size(vocab_size)
    banned = sorted({int(i) for i in token_ids})
    for token in banned:
        if not 0 <= token < V:
            raise ConstraintError(f"banned token id {token} out of range [0, {V})")
    builder = DFABuilder(V)
    allowed = builder.add_state(accepting=True)
    dead = builder.add_state()
    builder.set_transitions(allowed, allowed, {token: dead for token in banned})
    builder.set_transitions(dead, dead, {})
    return builder.build(initial=allowed)


def banned_phrases(phrases: Sequence[Sequence[int]], vocab_size: int) -> TokenDFA:
    """Accepts the token sequences that contain none of ``phrases``."""
    return complement(any_phrase(phrases, vocab_size))
