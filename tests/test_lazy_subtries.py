"""The trie walk's loop subtries (:func:`ctrlg.dfa.lazy._walk`): a child whose whole subtrie
spells bytes of its state's loop set is not descended, its tokens are taken as a pre-order range.

Checked by enumeration on random vocabularies and random byte automata: the subtrie arrays
(:func:`ctrlg.dfa.lazy._subtrees`) against an explicit depth-first search of the trie, and the
walk with the shortcut against the walk without it (``sub_end[n] = n + 1``) and against every
token run through the byte automaton byte by byte."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg.dfa.lazy import _subtrees, _trie_subtrees, _walk
from ctrlg.dfa.vocab_trie import VocabTrie

ALPHABET = b"abc "
vocabularies = st.lists(st.binary(min_size=1, max_size=5).map(
    lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b)), min_size=1, max_size=40)


def _explicit_subtrees(trie: VocabTrie):
    """Per node: the set of its subtrie's nodes and the bytes on the edges below it."""
    nodes, below = {}, {}

    def visit(n):
        mine, bytes_ = {n}, set()
        for e in range(trie.child_ptr[n], trie.child_ptr[n + 1]):
            c = int(trie.child_node[e])
            visit(c)
            mine |= nodes[c]
            bytes_ |= below[c] | {int(trie.child_byte[e])}
        nodes[n], below[n] = mine, bytes_

    visit(0)
    return nodes, below


@settings(deadline=None)
@given(vocabularies)
def test_subtrie_arrays_are_the_depth_first_subtries(tokens):
    trie = VocabTrie.from_token_bytes(tokens)
    sub_end, sub_bytes, preorder = _subtrees(trie.child_ptr, trie.child_byte.astype(np.int64),
                                             trie.child_node)
    assert preorder
    nodes, below = _explicit_subtrees(trie)
    for n in range(trie.num_nodes):
        assert nodes[n] == set(range(n, int(sub_end[n])))
        bits = {b for b in range(256) if (int(sub_bytes[n, b >> 6]) >> (b & 63)) & 1}
        assert bits == below[n]


def test_a_trie_not_in_preorder_never_skips():
    """Children numbered out of pre-order: the walk's subtrie ends fall back to ``n + 1``."""
    # root -> 2 (b"a"), root -> 1 (b"b"), 2 -> 3 (b"aa"): node 1's id comes before node 2's
    trie = VocabTrie((b"a", b"b", b"aa"), np.array([0, 2, 2, 3, 3]), np.array([97, 98, 97]),
                     np.array([2, 1, 3]), np.array([0, 0, 1, 2, 3]), np.array([1, 0, 2]))
    sub_end, _ = _trie_subtrees(trie)
    assert sub_end.tolist() == [1, 2, 3, 4]


def _walk_all(trie, table, start, sub_end, sub_bytes):
    Q = table.shape[0]
    out_tok = np.empty(trie.vocab_size + 1, np.int64)
    out_next = np.empty(trie.vocab_size + 1, np.int64)
    n, m = _walk(table, np.ones(Q, np.bool_), trie.child_ptr, trie.child_byte.astype(np.int64),
                 trie.child_node, trie.tok_ptr, trie.node_tokens, np.zeros(1, np.int64),
                 np.full(1, start, np.int64), True, out_tok, out_next, 0,
                 np.empty(8, np.int64), np.empty(8, np.int64),
                 np.zeros(trie.num_nodes, np.int32), -1, np.zeros(Q, np.int64), 1,
                 sub_end, sub_bytes, np.zeros((Q, 4), np.int64), np.zeros(Q, np.uint8))
    assert m == 0
    return sorted(zip(out_tok[:n].tolist(), out_next[:n].tolist()))


@settings(max_examples=150, deadline=None)
@given(tokens=vocabularies, data=st.data())
def test_walk_with_loop_subtries_is_the_walk_without_them(tokens, data):
    """Random byte automata over the alphabet, with loops likely (each state's row drawn from
    {dead, itself, another}); every state as the start."""
    trie = VocabTrie.from_token_bytes(tokens)
    Q = data.draw(st.integers(2, 5))
    table = np.zeros((Q, 256), np.int32)
    for q in range(1, Q):
        for b in ALPHABET:
            table[q, b] = data.draw(st.sampled_from([0, q, data.draw(st.integers(1, Q - 1))]))
    sub_end, sub_bytes = _trie_subtrees(trie)
    no_skip = np.arange(1, trie.num_nodes + 1, dtype=np.int64)
    for start in range(1, Q):
        expected = []
        for t, bs in enumerate(trie.token_bytes):
            q = start
            for b in bs:
                q = int(table[q, b])
                if q == 0:
                    break
            if q:
                expected.append((t, q))
        assert _walk_all(trie, table, start, sub_end, sub_bytes) == expected
        assert _walk_all(trie, table, start, no_skip, sub_bytes) == expected
