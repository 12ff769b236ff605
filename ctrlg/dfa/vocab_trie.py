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
from functools import cached_property
from typing import Sequence

import numpy as np

from ctrlg.dfa.core import ragged_indices
from ctrlg.errors import VocabularyMismatchError
from ctrlg.vocab import Vocabulary, as_vocabulary

__all__ = ["VocabTrie", "token_transformations", "vocab_trie", "vocabulary_index", "walk",
           "walk_with_loops"]


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

    @cached_property
    def levels(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
        """Breadth-first levels of the trie: per depth d ≥ 1, ``(nodes, parent, byte)`` int64
        arrays of the nodes at depth d (sorted by parent, then byte). Built once per trie."""
        out = []
        frontier = np.zeros(1, dtype=np.int64)
        nchild = np.diff(self.child_ptr)
        while True:
            counts = nchild[frontier]
            if not counts.sum():
                return tuple(out)
            edge = ragged_indices(self.child_ptr[frontier], counts)
            parent = np.repeat(frontier, counts)
            nodes = self.child_node[edge]
            out.append((nodes, parent, self.child_byte[edge]))
            frontier = nodes

    @cached_property
    def node_of_token(self) -> np.ndarray:
        """int64 [V]: the trie node where each token's bytes end (0, the root, for tokens
        without bytes)."""
        out = np.zeros(self.vocab_size, dtype=np.int64)
        out[self.node_tokens] = np.repeat(np.arange(self.num_nodes), np.diff(self.tok_ptr))
        return out

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


def token_transformations(trie: VocabTrie, table: np.ndarray, sources: np.ndarray,
                          byte_class: np.ndarray, max_entries: int | None = None
                          ) -> tuple[np.ndarray, np.ndarray] | None:
    """What each token does to the DFA: ``(fid [V], F [K, len(sources)])`` with
    ``F[fid[t], i] = δ*(sources[i], bytes(t))`` (0 = dead), and ``fid[t] = -1`` for tokens
    without bytes or that kill every source. Tokens with equal ``fid`` behave identically from
    every state: they form one *letter*.

    Level by level over the trie (``VocabTrie.levels``): a node's transformation is its parent's
    composed with its byte's class, ``F_child = table[F_parent, class]``. The pair
    (parent transformation id, class) is deduplicated first (a dense table of size K × C), each
    new pair's row is computed once (memoised across levels), and rows are deduplicated by value
    (a dict over their bytes), so the cost is O(trie nodes) for the keys plus O(distinct pairs ×
    sources) for the rows — independent of how many tokens share a behaviour. ``table`` must
    map dead states to 0 and have 0 as an absorbing state; ``table`` is over byte classes.
    Returns ``None`` as soon as the rows would hold more than ``max_entries`` entries.
    """
    table = np.ascontiguousarray(table, dtype=np.int32)
    C = table.shape[1]
    byte_class = np.asarray(byte_class, dtype=np.int64)
    rows: list[np.ndarray] = [np.asarray(sources, dtype=np.int32)]   # fid 0: identity (root)
    row_id: dict[bytes, int] = {rows[0].tobytes(): 0}
    memo = np.full(C, -2, dtype=np.int64)       # (fid, class) -> fid; -2 unknown, -1 dead
    fid = np.full(trie.num_nodes, -1, dtype=np.int64)
    fid[0] = 0
    for nodes, parent, byte in trie.levels:
        pf = fid[parent]
        keep = pf >= 0
        if not keep.any():
            break
        nodes, pf, cls = nodes[keep], pf[keep], byte_class[byte[keep]]
        if len(memo) < len(rows) * C:
            memo = np.concatenate([memo, np.full(len(rows) * C - len(memo) + C * 64, -2,
                                                 dtype=np.int64)])
        key = pf * C + cls
        todo = np.unique(key[memo[key] == -2])
        if len(todo):
            new_rows = table[np.stack([rows[f] for f in (todo // C).tolist()]), (todo % C)[:, None]]
            for k, row in zip(todo.tolist(), new_rows):
                if not row.any():
                    memo[k] = -1
                    continue
                b = row.tobytes()
                f = row_id.get(b)
                if f is None:
                    f = row_id[b] = len(rows)
                    rows.append(row)
                    if max_entries is not None and len(rows) * len(row) > max_entries:
                        return None
                memo[k] = f
            if len(memo) < len(rows) * C:
                memo = np.concatenate([memo, np.full(len(rows) * C - len(memo) + C * 64, -2,
                                                     dtype=np.int64)])
        fid[nodes] = memo[key]
    tok_fid = fid[trie.node_of_token]
    has_bytes = np.zeros(trie.vocab_size, dtype=bool)
    has_bytes[trie.node_tokens] = True
    tok_fid[~has_bytes] = -1
    return tok_fid, np.stack(rows)


def walk(trie, table: np.ndarray, live: np.ndarray, sources: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (source state, token, end state) such that the token's bytes lead the byte DFA
    ``table`` [Q, 256] from ``source`` to a live state ``end`` without passing a dead state

    Level-synchronous search over the trie for all sources at once; returns three int64 arrays
    sorted by (source, token).
    """
    src = np.asarray(sources, dtype=np.int32)
    return _walk_from(trie, table, live, src, src.copy(), np.zeros(len(src), dtype=np.int32),
                      record_start=False)


def walk_with_loops(trie, table: np.ndarray, live: np.ndarray, sources: np.ndarray,
                    min_loop_tokens: int):
    """:func:`walk`, except that a source ``q`` whose *loop tokens* (tokens whose every byte
    keeps ``q`` in ``q``: free text inside a JSON string) number at least ``min_loop_tokens``
    gets no edges for them: they are returned once per loop byte set instead.

    For a loop byte set ``L`` the trie nodes spelled by bytes of ``L`` alone are found once; a
    source with that set is then walked only from the *exits* of that subtrie (a child reached
    by a byte outside ``L``), so its cost is the number of exit pairs instead of the vocabulary.
    Returns ``(src, tok, end, loops)`` with the edges sorted by (source, token) and ``loops`` a
    list of ``(states, loop_tokens)`` int64 array pairs."""
    table = np.ascontiguousarray(table, dtype=np.int32)
    live = np.asarray(live, dtype=bool)
    sources = np.asarray(sources, dtype=np.int32)
    loop_bytes = table[sources] == sources[:, None]                 # [n, 256]
    plain = np.ones(len(sources), dtype=bool)
    seeds_src, seeds_state, seeds_node, loops = [], [], [], []
    candidates = np.flatnonzero(loop_bytes.sum(axis=1) >= 2)
    if len(candidates):
        keys = np.packbits(loop_bytes[candidates], axis=1)
        _, group = np.unique(keys, axis=0, return_inverse=True)
        group = group.reshape(-1)
        for g in range(int(group.max()) + 1 if len(group) else 0):
            members = candidates[group == g]
            in_loop = loop_bytes[members[0]]
            nodes, exit_edges = _subtrie(trie, in_loop)
            tokens = trie.node_tokens[ragged_indices(trie.tok_ptr[nodes[1:]],
                                                     np.diff(trie.tok_ptr)[nodes[1:]])]
            if len(tokens) < min_loop_tokens:
                continue
            plain[members] = False
            states = sources[members]
            loops.append((states.astype(np.int64), np.sort(tokens).astype(np.int64)))
            if not len(exit_edges):
                continue
            # every (source, exit edge): the byte leaves L, the node is the exit child
            byte = trie.child_byte[exit_edges].astype(np.int64)
            nxt = table[states[:, None], byte[None, :]]               # [members, exits]
            row, col = np.nonzero(live[nxt])
            seeds_src.append(states[row])
            seeds_state.append(nxt[row, col])
            seeds_node.append(trie.child_node[exit_edges][col].astype(np.int32))
    parts = []
    src = sources[plain]
    parts.append(_walk_from(trie, table, live, src, src.copy(),
                            np.zeros(len(src), dtype=np.int32), record_start=False))
    if seeds_src:
        parts.append(_walk_from(trie, table, live, np.concatenate(seeds_src).astype(np.int32),
                                np.concatenate(seeds_state).astype(np.int32),
                                np.concatenate(seeds_node).astype(np.int32), record_start=True))
    s = np.concatenate([p[0] for p in parts])
    t = np.concatenate([p[1] for p in parts])
    e = np.concatenate([p[2] for p in parts])
    order = np.lexsort((t, s))
    return s[order], t[order], e[order], loops


def _subtrie(trie, in_loop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(nodes, exit_edges)``: the trie nodes spelled by bytes with ``in_loop[byte]`` only
    (the root first), and the child edges that leave them by any other byte."""
    ptr = trie.child_ptr
    nchild = np.diff(ptr)
    frontier = np.zeros(1, dtype=np.int64)
    nodes, exits = [frontier], []
    while len(frontier):
        edges = ragged_indices(ptr[frontier], nchild[frontier])
        inside = in_loop[trie.child_byte[edges]]
        exits.append(edges[~inside])
        frontier = trie.child_node[edges[inside]].astype(np.int64)
        nodes.append(frontier)
    return np.concatenate(nodes), np.concatenate(exits)


def _walk_from(trie, table: np.ndarray, live: np.ndarray, src: np.ndarray, state: np.ndarray,
               node: np.ndarray, *, record_start: bool):
    """The walk of :func:`walk` from arbitrary ``(source, state, trie node)`` triples (tokens
    ending at the starting nodes count too when ``record_start``)."""
    table = np.ascontiguousarray(table, dtype=np.int32)
    width = table.shape[1]
    flat = table.reshape(-1)
    live = np.asarray(live, dtype=bool)
    out_src, out_tok, out_end = [], [], []
    ptr = trie.child_ptr.astype(np.int32)
    nchild = np.diff(ptr)
    cbyte = trie.child_byte.astype(np.int32)
    cnode = trie.child_node.astype(np.int32)
    tptr = trie.tok_ptr.astype(np.int32)
    ntok = np.diff(tptr)
    node_tokens = trie.node_tokens.astype(np.int32)

    def record(src, state, node):
        tcounts = ntok[node]
        has = np.flatnonzero(tcounts)
        if len(has):
            tc = tcounts[has]
            trep = np.repeat(has, tc)
            tidx = ragged_indices(tptr[node[has]], tc, np.int32)
            out_src.append(src[trep])
            out_tok.append(node_tokens[tidx])
            out_end.append(state[trep])

    if record_start:
        record(src, state, node)
    while len(src):
        counts = nchild[node]
        total = int(counts.sum())
        if not total:
            break
        rep = np.repeat(np.arange(len(src), dtype=np.int32), counts)
        edge = ragged_indices(ptr[node], counts, np.int32)
        new_state = flat[state[rep] * width + cbyte[edge]]
        keep = np.flatnonzero(live[new_state])
        rep = rep[keep]
        src, state, node = src[rep], new_state[keep], cnode[edge[keep]]
        record(src, state, node)
    if not out_src:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    s = np.concatenate(out_src).astype(np.int64)
    t = np.concatenate(out_tok).astype(np.int64)
    e = np.concatenate(out_end).astype(np.int64)
    order = np.lexsort((t, s))
    return s[order], t[order], e[order]
