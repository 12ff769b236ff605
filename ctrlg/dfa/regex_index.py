"""The all-encodings token automaton of a byte DFA (the index behind :func:`ctrlg.dfa.regex`).

``token_dfa_from_bytes_dfa(bdfa, trie)`` builds the token DFA described in :mod:`ctrlg.dfa.regex`
(states: the byte DFA's states plus one *ended* state; exceptions stored over *letters*, the
classes of tokens with the same transformation of the byte DFA's live states). It lives apart from the regex front end so that both :mod:`ctrlg.dfa.regex` and
:mod:`ctrlg.dfa.canonical` import it without importing each other.
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.bytes_dfa import ByteDFA
from ctrlg.dfa.core import TokenDFA
from ctrlg.dfa.regex_syntax import surrogate_hint
from ctrlg.dfa.vocab_trie import VocabTrie, token_transformations, walk_with_loops
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError

__all__ = ["AUTO", "byte_classes", "resolve_eos", "resolve_vocab_size", "token_dfa_from_bytes_dfa"]

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


def byte_classes(table: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, int | None]:
    """``(byte_class [256], dead_class)``: bytes with equal columns in the byte DFA (restricted
    to live states) share a class; ``dead_class`` is the class that kills every live state
    (``None`` if there is none)."""
    cols = np.where(live[table], table, 0)[live].T     # [256, live states]
    cols = np.ascontiguousarray(cols)
    keys = cols.view(np.dtype((np.void, cols.dtype.itemsize * max(cols.shape[1], 1)))).ravel()
    _, byte_class = np.unique(keys, return_inverse=True)
    byte_class = byte_class.ravel().astype(np.int64)
    dead = np.flatnonzero(~cols.any(axis=1))
    return byte_class, (int(byte_class[dead[0]]) if len(dead) else None)


def token_dfa_from_bytes_dfa(bdfa: ByteDFA, trie: VocabTrie, *, eos_token_id=_AUTO,
                             vocab_size: int | None = None, what: str = "pattern",
                             max_transformation_entries: int = 64_000_000) -> TokenDFA:
    """The all-encodings token DFA of a byte DFA (module docstring), over letters.

    States: byte-DFA states (0 dead) plus ``ended`` = Q. Bytes with equal columns form classes
    (:func:`byte_classes`); each token's transformation of the live states,
    ``q ↦ δ*(q, bytes(t))``, is computed once per distinct (prefix transformation, class) pair
    over the vocabulary trie (:func:`vocab_trie.token_transformations`). Tokens with the same
    transformation are one *letter*; the DFA stores its exceptions over letters (plus one
    letter for EOS, and one for tokens that are never an exception: no bytes, or dead from every
    state). Cost: O(trie nodes) vectorised for the keys, O(distinct pairs × live states) for the
    transformations, O(letters × live states) for the edges. When the transformations would need
    more than ``max_transformation_entries`` entries (their tokens mostly act differently; the
    attempt stops as soon as they would), the DFA is built per token instead, by a walk of the
    trie that keeps only live (state, node) pairs and skips the loop tokens of free-text states
    (:func:`vocab_trie.walk_with_loops`); states where most tokens go to one successor store it
    as their default (:func:`_majority_defaults`)."""
    eos = resolve_eos(trie, eos_token_id)
    V = resolve_vocab_size(trie, vocab_size, eos)
    live = bdfa.live()
    if not live[bdfa.initial]:
        raise UnsatisfiableConstraintError(f"the {what} matches no string{surrogate_hint(what)}")
    Q = bdfa.num_states
    byte_class, _ = byte_classes(bdfa.table, live)
    C = int(byte_class.max()) + 1
    first_byte = np.zeros(C, dtype=np.int64)
    first_byte[byte_class[::-1]] = np.arange(255, -1, -1)
    class_table = np.where(live[bdfa.table], bdfa.table, 0)[:, first_byte]
    sources = np.nonzero(live)[0]
    found = token_transformations(trie, class_table, sources, byte_class,
                                  max_entries=max_transformation_entries)
    if found is None:    # too many distinct transformations × states: one edge per token
        src, let, end, loops = walk_with_loops(trie, bdfa.table, live, sources,
                                               min_loop_tokens=V // 2 + 1)
        letter_of_token = None
        if eos is not None:
            keep = let != eos          # an EOS with bytes keeps only its EOS edges
            src, let, end = src[keep], let[keep], end[keep]
        eos_symbol = eos
        default, src, let, end = _majority_defaults(src, let, end, Q + 1, V, eos,
                                                    bdfa.accepting & live, loops)
    else:
        src, let, end, letter_of_token, eos_symbol = _letter_edges(*found, sources, V, eos)
        default = np.zeros(Q + 1, dtype=np.int64)
    ended = Q
    if eos is not None:
        acc = np.nonzero(bdfa.accepting & live)[0]
        src = np.concatenate([src, acc, [ended]])
        let = np.concatenate([let, np.full(len(acc) + 1, eos_symbol)])
        end = np.concatenate([end, np.full(len(acc) + 1, ended)])
    order = np.lexsort((let, src))
    src, let, end = src[order], let[order], end[order]
    S = Q + 1
    exc_ptr = np.searchsorted(src, np.arange(S + 1)).astype(np.int64)
    accepting = np.zeros(S, dtype=bool)
    accepting[:Q] = bdfa.accepting & live
    accepting[ended] = eos is not None
    dfa = TokenDFA(vocab_size=V, initial=int(bdfa.initial), accepting=accepting,
                   default=default, exc_ptr=exc_ptr,
                   exc_tokens=let, exc_next=end, letter_of_token=letter_of_token)
    if not _reaches_acceptance(dfa):
        raise UnsatisfiableConstraintError(
            f"the {what} matches strings, but no token sequence of this vocabulary spells one")
    return dfa


def _majority_defaults(src: np.ndarray, tok: np.ndarray, end: np.ndarray, S: int, V: int,
                       eos: int | None, accepting: np.ndarray, loops=(), chunk: int = 256):
    """Defaults for per-token edges ``(src, tok, end)`` sorted by (src, tok): a state whose most
    common successor is shared by more tokens than are dead from it (free text inside a JSON
    string: most tokens loop) gets that successor as its default, and its exceptions become the
    tokens that go elsewhere plus the dead ones (successor 0; EOS only where the state does not
    accept: accepting states get their EOS edge afterwards).

    ``loops`` (from :func:`vocab_trie.walk_with_loops`) lists states whose more than ``V/2`` loop
    tokens were left out of the edges: their default is themselves. Of the other states only
    those with more than ``V/2`` edges can qualify; their candidate is the most common successor
    among 33 evenly spaced edges, then counted exactly (any default is correct; a poor candidate
    only stores more exceptions). Returns ``(default [S], src, tok, end)``."""
    default = np.zeros(S, dtype=np.int64)
    ptr = np.searchsorted(src, np.arange(S + 1))
    counts = np.diff(ptr)
    looped = np.zeros(S, dtype=bool)
    loop_tokens = {}
    for states, tokens in loops:
        looped[states] = True
        default[states] = states
        for q in states.tolist():
            loop_tokens[q] = tokens
    owner = np.repeat(np.arange(S), counts)
    heavy = np.flatnonzero((counts * 2 > V) & ~looped)
    if len(heavy):
        picks = ptr[heavy][:, None] + (counts[heavy][:, None] * np.arange(1, 34)) // 34
        sample = np.sort(end[picks], axis=1)
        run_start = np.concatenate([np.ones((len(heavy), 1), bool),
                                    sample[:, 1:] != sample[:, :-1]], axis=1)
        run_id = np.cumsum(run_start, axis=1)
        best = np.zeros(len(heavy), dtype=np.int64)
        best_count = np.zeros(len(heavy), dtype=np.int64)
        for r in range(1, 34):
            n = (run_id == r).sum(axis=1)
            better = n > best_count
            best[better] = sample[better, np.argmax(run_id == r, axis=1)[better]]
            best_count[better] = n[better]
        candidate = np.zeros(S, dtype=np.int64)
        candidate[heavy] = best
        hits = np.bincount(owner[end == candidate[owner]], minlength=S)
        chosen = heavy[hits[heavy] > V - counts[heavy]]
        default[chosen] = candidate[chosen]
    chosen = np.flatnonzero(default)
    if not len(chosen):
        return default, src, tok, end
    keep = end != default[owner]
    extra_src, extra_tok = [], []
    for k in range(0, len(chosen), chunk):
        states = chosen[k:k + chunk]
        covered = np.zeros((len(states), V), dtype=bool)
        for row, q in enumerate(states.tolist()):
            covered[row, tok[ptr[q]:ptr[q + 1]]] = True
            if q in loop_tokens:
                covered[row, loop_tokens[q]] = True
        if eos is not None:
            covered[:, eos] = accepting[states]     # accepting states get their EOS edge later
        row, dead_tok = np.nonzero(~covered)
        extra_src.append(states[row])
        extra_tok.append(dead_tok)
    extra_src = np.concatenate(extra_src).astype(np.int64)
    extra_tok = np.concatenate(extra_tok).astype(np.int64)
    src = np.concatenate([src[keep], extra_src])
    tok = np.concatenate([tok[keep], extra_tok])
    end = np.concatenate([end[keep], np.zeros(len(extra_src), dtype=np.int64)])
    return default, src, tok, end


def _letter_edges(tok_fid: np.ndarray, F: np.ndarray, sources: np.ndarray, V: int,
                  eos: int | None):
    """Edges over letters from the token transformations: ``(src, letter, end,
    letter_of_token, eos_letter)``. Letters 0..A-2 are the transformations used by some token,
    A-1 the tokens that are never an exception, and A the EOS token (``eos_letter``; None
    without EOS)."""
    used = np.unique(tok_fid[tok_fid >= 0])
    A = len(used) + 1
    letter_of_fid = np.full(len(F), A - 1, dtype=np.int64)
    letter_of_fid[used] = np.arange(len(used))
    letter_of_token = np.full(V, A - 1, dtype=np.int64)
    letter_of_token[:len(tok_fid)] = np.where(tok_fid >= 0, letter_of_fid[tok_fid], A - 1)
    let, i = np.nonzero(F[used])
    src, end = sources[i], F[used][let, i].astype(np.int64)
    if eos is not None:
        letter_of_token[eos] = A
    return src, let, end, letter_of_token, (A if eos is not None else None)


def _reaches_acceptance(dfa: TokenDFA) -> bool:
    return not dfa.is_empty()
