"""A byte trie over a tokenizer's vocabulary, built once per :class:`ctrlg.Vocabulary` (memoised on it).

Compiling a regex to a token DFA walks this trie from every state of the regex's byte DFA at once
(:func:`walk`): a level-synchronous, vectorised depth-first search over ``trie ∩ byte-DFA`` that
prunes a branch as soon as the byte DFA dies, so its cost is the number of (DFA state, trie node)
pairs that stay alive, not ``states × vocabulary × token length``.

Arrays (CSR): node ``n`` has children ``child_node[child_ptr[n]:child_ptr[n+1]]`` reached by
bytes ``child_byte[...]``, and the token ids whose bytes end exactly at ``n`` are
``node_tokens[tok_ptr[n]:tok_ptr[n+1]]`` (several ids can share bytes, e.g. ``A`` and the
byte-fallback ``<0x41>``). Tokens with no bytes (special tokens) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ctrlg.dfa.core import ragged_indices
from ctrlg.errors import VocabularyMismatchError
from ctrlg.vocab import Vocabulary, as_vocabulary

__all__ = ["VocabTrie", "vocab_trie", "vocabulary_index", "walk"]


@dataclass(frozen=True, eq=False)
class VocabTrie:
    token_bytes: tuple[bytes, ...]
    child_ptr: np.ndarray
    child_byte: np.ndarray
    child_node: np.ndarray
    tok_ptr: np.ndarray
    node_tokens: np.ndarray
    eos_token_id: int | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @property
    def num_nodes(self) -> int:
        return len(self.child_ptr) - 1

    @classmethod
    def from_token_bytes(cls, token_bytes: Sequence[bytes], eos_token_id: int | None = None
                         ) -> "VocabTrie":
        """Build the trie; ``token_bytes[i]`` are the bytes token id ``i`` decodes to."""
        tb = tuple(bytes(t) for t in token_bytes)
        if not tb:
            raise VocabularyMismatchError("the vocabulary is empty")
        order = sorted((t, i) for i, t in enumerate(tb) if t)
        # nodes are created in lexicographic (pre-)order of the sorted byte strings
        parent: list[int] = [-1]
        via: list[int] = [-1]
        depth_path: list[int] = [0]      # node ids along the current path
        prev = b""
        node_of: list[int] = []
        for t, _ in order:
            common = 0
            while common < min(len(prev), len(t)) and prev[common] == t[common]:
                common += 1
            del depth_path[common + 1:]
            for b in t[common:]:
                n = len(parent)
                parent.append(depth_path[-1])
                via.append(b)
                depth_path.append(n)
            node_of.append(depth_path[len(t)])
            prev = t
        num_nodes = len(parent)
        parent_arr = np.asarray(parent[1:], dtype=np.int64)
        child_nodes = np.arange(1, num_nodes, dtype=np.int64)
        # children of each node are contiguous and sorted by byte because of the pre-order
        order_idx = np.argsort(parent_arr, kind="stable")
        child_node = child_nodes[order_idx]
        child_byte = np.asarray(via[1:], dtype=np.int64)[order_idx]
        child_ptr = np.searchsorted(parent_arr[order_idx], np.arange(num_nodes + 1))
        tok_node = np.asarray(node_of, dtype=np.int64)
        tok_ids = np.asarray([i for _, i in order], dtype=np.int64)
        o = np.argsort(tok_node, kind="stable")
        node_tokens = tok_ids[o]
        tok_ptr = np.searchsorted(tok_node[o], np.arange(num_nodes + 1))
        return cls(tb, child_ptr.astype(np.int64), child_byte, child_node,
                   tok_ptr.astype(np.int64), node_tokens, eos_token_id)


def vocabulary_index(tokenizer) -> Vocabulary:
    """The :class:`ctrlg.Vocabulary` of a tokenizer (built once; a Vocabulary is returned as is);
    failures to decode the vocabulary raise VocabularyMismatchError."""
    return as_vocabulary(tokenizer)


def vocab_trie(tokenizer) -> VocabTrie:
    """The :class:`VocabTrie` of a :class:`ctrlg.Vocabulary` or a ``transformers`` tokenizer
    (memoised on the vocabulary), a :class:`VocabTrie` (returned as is) or a list of token byte
    strings (EOS unknown).

    Raises VocabularyMismatchError when the tokenizer's vocabulary cannot be decoded to bytes.
    """
    if isinstance(tokenizer, VocabTrie):
        return tokenizer
    if isinstance(tokenizer, (list, tuple)):
        if not all(isinstance(t, (bytes, bytearray)) for t in tokenizer):
            raise VocabularyMismatchError("a vocabulary given as a list must hold bytes objects")
        return VocabTrie.from_token_bytes(tokenizer)
    vocab = as_vocabulary(tokenizer)
    return vocab.memo("vocab_trie", lambda: VocabTrie.from_token_bytes(
        vocab.tokens, eos_token_id=vocab.eos_token_id))


def walk(trie: VocabTrie, table: np.ndarray, live: np.ndarray, sources: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (source state, token, end state) such that the token's bytes lead the byte DFA
    ``table`` [Q, 256] from ``source`` to a live state ``end`` without passing a dead state.

    Level-synchronous search over the trie for all sources at once; returns three int64 arrays
    sorted by (source, token).
    """
    table = np.ascontiguousarray(table, dtype=np.int32)
    flat = table.reshape(-1)
    live = np.asarray(live, dtype=bool)
    src = np.asarray(sources, dtype=np.int32)
    state = src.copy()
    node = np.zeros(len(src), dtype=np.int32)
    out_src, out_tok, out_end = [], [], []
    ptr = trie.child_ptr.astype(np.int32)
    nchild = np.diff(ptr)
    cbyte = trie.child_byte.astype(np.int32)
    cnode = trie.child_node.astype(np.int32)
    tptr = trie.tok_ptr.astype(np.int32)
    ntok = np.diff(tptr)
    node_tokens = trie.node_tokens.astype(np.int32)
    while len(src):
        counts = nchild[node]
        total = int(counts.sum())
        if not total:
            break
        rep = np.repeat(np.arange(len(src), dtype=np.int32), counts)
        edge = ragged_indices(ptr[node], counts, np.int32)
        new_state = flat[state[rep] * 256 + cbyte[edge]]
        keep = np.flatnonzero(live[new_state])
        rep = rep[keep]
        src, state, node = src[rep], new_state[keep], cnode[edge[keep]]
        # tokens ending at the new nodes
        tcounts = ntok[node]
        has = np.flatnonzero(tcounts)
        if len(has):
            tc = tcounts[has]
            trep = np.repeat(has, tc)
            tidx = ragged_indices(tptr[node[has]], tc, np.int32)
            out_src.append(src[trep])
            out_tok.append(node_tokens[tidx])
            out_end.append(state[trep])
    if not out_src:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    s = np.concatenate(out_src).astype(np.int64)
    t = np.concatenate(out_tok).astype(np.int64)
    e = np.concatenate(out_end).astype(np.int64)
    order = np.lexsort((t, s))
    return s[order], t[order], e[order]
