"""The token-level DFA type shared by every constraint in ctrlg.

A :class:`TokenDFA` is a *complete* deterministic automaton over token ids ``[0, V)``.
Each state ``s`` stores

* a **default successor** ``default[s]`` taken by every token that is not an exception, and
* a sorted, sparse list of **exception tokens** ``exc_tokens[exc_ptr[s]:exc_ptr[s+1]]`` with their
  successors ``exc_next[...]`` (CSR layout).

So ``δ(s, v) = exc_next[k]`` if ``v`` is the k-th exception of ``s``, else ``default[s]``.
Most constraints touch few tokens per state, so the automaton costs O(S + E) memory instead of the
O(S·V) of a dense table, and the Ctrl-G guide can use the identity (DESIGN.md)
``Σ_v B[:, v] W(δ(s, v)) = W(default(s)) + Σ_{v∈exc(s)} B[:, v] ⊙ (W(δ(s, v)) − W(default(s)))``.

Exceptions whose successor equals the default are never stored (the representation is canonical
given the transition function), so two automata with the same transition function compare equal
array-wise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError

__all__ = ["TokenDFA", "DFABuilder", "TokenClasses", "token_classes"]


def _as_index_array(values, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.int64)
    if array.ndim != 1:
        raise ConstraintError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


@dataclass(frozen=True, eq=False)
class TokenDFA:
    """A complete DFA over token ids in default-plus-exceptions (CSR) form.

    Attributes:
        vocab_size: V, the size of the token alphabet.
        initial: the start state.
        accepting: bool array [S].
        default: int64 array [S], the successor for every non-exception token.
        exc_ptr: int64 array [S + 1], CSR row pointers into the exception arrays.
        exc_tokens: int64 array [E], exception tokens, sorted within each state.
        exc_next: int64 array [E], the successor for each exception token.
    """

    vocab_size: int
    initial: int
    accepting: np.ndarray
    default: np.ndarray
    exc_ptr: np.ndarray
    exc_tokens: np.ndarray
    exc_next: np.ndarray

    # ------------------------------------------------------------------ construction
    def __post_init__(self) -> None:
        S = len(self.default)
        if self.vocab_size <= 0:
            raise ConstraintError(f"vocab_size must be positive, got {self.vocab_size}")
        if S == 0:
            raise ConstraintError("a DFA needs at least one state")
        if not 0 <= self.initial < S:
            raise ConstraintError(f"initial state {self.initial} out of range [0, {S})")
        if self.accepting.shape != (S,) or self.exc_ptr.shape != (S + 1,):
            raise ConstraintError("accepting/exc_ptr shapes do not match the number of states")
        if self.exc_tokens.shape != self.exc_next.shape:
            raise ConstraintError("exc_tokens and exc_next must have the same length")
        if self.exc_ptr[0] != 0 or self.exc_ptr[-1] != len(self.exc_tokens):
            raise ConstraintError("exc_ptr must start at 0 and end at the number of exceptions")
        if np.any(np.diff(self.exc_ptr) < 0):
            raise ConstraintError("exc_ptr must be non-decreasing")
        for name, arr, hi in (("default", self.default, S), ("exc_next", self.exc_next, S),
                              ("exc_tokens", self.exc_tokens, self.vocab_size)):
            if arr.size and (arr.min() < 0 or arr.max() >= hi):
                raise ConstraintError(f"{name} has entries outside [0, {hi})")
        if self.exc_tokens.size > 1:
            increasing = np.diff(self.exc_tokens) > 0
            # positions where a new state's exception list starts need not increase
            starts = self.exc_ptr[1:-1]
            starts = starts[(starts > 0) & (starts < self.exc_tokens.size)]
            increasing[starts - 1] = True
            if not increasing.all():
                raise ConstraintError("exception tokens must be sorted and unique within each state")
        if self.exc_tokens.size and np.any(self.exc_next == self.default[self.exception_states()]):
            raise ConstraintError("an exception's successor equals its state's default successor "
                                  "(use DFABuilder, which drops such exceptions)")
        for arr in (self.accepting, self.default, self.exc_ptr, self.exc_tokens, self.exc_next):
            arr.setflags(write=False)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "TokenDFA":
        """Rebuild from :meth:`to_arrays` output (e.g. loaded from safetensors or ``np.load``)."""
        try:
            meta = np.asarray(arrays["meta"], dtype=np.int64)
            return cls(
                vocab_size=int(meta[0]),
                initial=int(meta[1]),
                accepting=np.asarray(arrays["accepting"], dtype=bool).copy(),
                default=_as_index_array(arrays["default"], "default").copy(),
                exc_ptr=_as_index_array(arrays["exc_ptr"], "exc_ptr").copy(),
                exc_tokens=_as_index_array(arrays["exc_tokens"], "exc_tokens").copy(),
                exc_next=_as_index_array(arrays["exc_next"], "exc_next").copy(),
            )
        except KeyError as missing:
            raise ConstraintError(f"DFA arrays lack the field {missing}") from None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain numpy arrays (for caching with ``np.savez`` or safetensors)."""
        return {
            "meta": np.array([self.vocab_size, self.initial], dtype=np.int64),
            "accepting": self.accepting.astype(np.uint8),
            "default": self.default,
            "exc_ptr": self.exc_ptr,
            "exc_tokens": self.exc_tokens,
            "exc_next": self.exc_next,
        }

    @classmethod
    def from_dense(cls, table, accepting, initial: int = 0) -> "TokenDFA":
        """Build from a dense transition table ``[S, V]``; the default of each state is its most
        frequent successor (which minimises the number of stored exceptions)."""
        table = np.asarray(table, dtype=np.int64)
        if table.ndim != 2:
            raise ConstraintError(f"dense table must be [S, V], got shape {table.shape}")
        S, V = table.shape
        builder = DFABuilder(V)
        for _ in range(S):
            builder.add_state()
        for s in range(S):
            row = table[s]
            values, counts = np.unique(row, return_counts=True)
            default = int(values[np.argmax(counts)])
            tokens = np.nonzero(row != default)[0]
            builder.set_transitions(s, default, dict(zip(tokens.tolist(), row[tokens].tolist())))
        acc = np.asarray(accepting, dtype=bool)
        for s in np.nonzero(acc)[0]:
            builder.set_accepting(int(s))
        return builder.build(initial=initial)

    # ------------------------------------------------------------------ queries
    @property
    def num_states(self) -> int:
        return len(self.default)

    @property
    def num_exceptions(self) -> int:
        return len(self.exc_tokens)

    def is_accepting(self, state: int) -> bool:
        return bool(self.accepting[state])

    def exception_states(self) -> np.ndarray:
        """int64 [E]: the state each stored exception belongs to (aligned with ``exc_tokens``)."""
        return np.repeat(np.arange(self.num_states, dtype=np.int64), np.diff(self.exc_ptr))

    def exceptions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, successors) of the exception edges of ``state``."""
        lo, hi = self.exc_ptr[state], self.exc_ptr[state + 1]
        return self.exc_tokens[lo:hi], self.exc_next[lo:hi]

    def step(self, state: int, token: int) -> int:
        """δ(state, token)."""
        if not 0 <= state < self.num_states:
            raise ConstraintError(f"state {state} out of range [0, {self.num_states})")
        if not 0 <= token < self.vocab_size:
            raise ConstraintError(f"token id {token} out of range [0, {self.vocab_size})")
        lo, hi = int(self.exc_ptr[state]), int(self.exc_ptr[state + 1])
        k = lo + int(np.searchsorted(self.exc_tokens[lo:hi], token))
        if k < hi and self.exc_tokens[k] == token:
            return int(self.exc_next[k])
        return int(self.default[state])

    def run(self, tokens: Iterable[int], state: int | None = None) -> int:
        """The state reached from ``state`` (default: initial) after reading ``tokens``."""
        s = self.initial if state is None else state
        for token in tokens:
            s = self.step(s, int(token))
        return s

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Whether the whole token sequence is accepted."""
        return self.is_accepting(self.run(tokens))

    def successors(self, state: int) -> np.ndarray:
        """Dense successor row ``[V]`` of one state (O(V); for tests and small vocabularies)."""
        row = np.full(self.vocab_size, self.default[state], dtype=np.int64)
        tokens, nxt = self.exceptions(state)
        row[tokens] = nxt
        return row

    def dense(self) -> np.ndarray:
        """Dense transition table ``[S, V]`` (O(S·V) memory; for tests and small vocabularies)."""
        return np.stack([self.successors(s) for s in range(self.num_states)])

    def live_states(self) -> np.ndarray:
        """Bool [S]: states from which some accepting state is reachable (reverse BFS)."""
        src, dst = self._edge_list()
        return reachable_mask(np.nonzero(self.accepting)[0], dst, src, self.num_states)

    def reachable_states(self) -> np.ndarray:
        """Bool [S]: states reachable from the initial state (BFS)."""
        src, dst = self._edge_list()
        return reachable_mask(np.array([self.initial]), src, dst, self.num_states)

    def dead_states(self) -> np.ndarray:
        """Bool [S]: states from which acceptance is impossible."""
        return ~self.live_states()

    def is_empty(self) -> bool:
        """True iff the language is empty (no accepting state is reachable)."""
        return not bool(np.any(self.reachable_states() & self.accepting))

    def require_nonempty(self, what: str = "constraint") -> "TokenDFA":
        """Return self, or raise a ConstraintError if the language is empty."""
        if self.is_empty():
            raise UnsatisfiableConstraintError(
                f"the {what} is unsatisfiable: its automaton accepts no token sequence")
        return self

    def trim(self) -> "TokenDFA":
        """Equivalent DFA with only reachable states, where all states that cannot reach
        acceptance are merged into one dead state (absorbing, non-accepting).

        State ids are renumbered in BFS order from the initial state (successors visited in
        increasing state order), so the result is deterministic. The language is unchanged.
        Vectorised over the CSR arrays: O(S + E) numpy work.
        """
        S = self.num_states
        live = self.live_states()
        if not live[self.initial]:
            return _empty_dfa(self.vocab_size)
        src, dst = self._edge_list()
        keep = live[src] & live[dst]
        order = bfs_order(self.initial, src[keep], dst[keep], S)
        n = len(order)
        dead = n
        new_id = np.full(S, dead, dtype=np.int64)
        new_id[order] = np.arange(n, dtype=np.int64)
        default = new_id[self.default[order]]
        lengths = np.diff(self.exc_ptr)[order]
        idx = ragged_indices(self.exc_ptr[:-1][order], lengths)
        tokens = self.exc_tokens[idx]
        nxt = new_id[self.exc_next[idx]]
        owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
        kept = nxt != default[owner]
        tokens, nxt, owner = tokens[kept], nxt[kept], owner[kept]
        accepting = self.accepting[order]
        if np.any(default == dead) or np.any(nxt == dead):
            default = np.append(default, dead)
            accepting = np.append(accepting, False)
            n += 1
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
        return TokenDFA(self.vocab_size, 0, accepting, default, ptr, tokens, nxt)

    def _edge_list(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of all distinct transitions, default edges included."""
        S = self.num_states
        src = np.concatenate([np.arange(S, dtype=np.int64), self.exception_states()])
        dst = np.concatenate([self.default, self.exc_next])
        pairs = np.unique(src * S + dst)
        return pairs // S, pairs % S

    # ------------------------------------------------------------------ token classes
    def class_table(self, classes: "TokenClasses") -> np.ndarray:
        """Dense successor table ``[S, C]`` over token classes: ``table[s, c] = δ(s, v)`` for any
        token ``v`` of class ``c``. ``classes`` must refine this DFA's token behaviour (e.g.
        :func:`token_classes` computed with this DFA among its arguments)."""
        if classes.vocab_size != self.vocab_size:
            raise VocabularyMismatchError(
                f"token classes are over {classes.vocab_size} tokens, the DFA over {self.vocab_size}")
        dtype = np.int32 if self.num_states < 2**31 else np.int64
        table = np.repeat(self.default.astype(dtype)[:, None], classes.num_classes, axis=1)
        table[self.exception_states(), classes.class_of_token[self.exc_tokens]] = self.exc_next
        return table

    @classmethod
    def from_class_table(cls, table, accepting, classes: "TokenClasses",
                         initial: int = 0) -> "TokenDFA":
        """Expand a successor table over token classes ``[S, C]`` into the per-token
        default-plus-exceptions form. The default of each state is the successor shared by the
        most tokens (class sizes as weights), which minimises the stored exceptions."""
        table = np.asarray(table, dtype=np.int64)
        S, C = table.shape
        if C != classes.num_classes:
            raise ConstraintError(f"class table has {C} columns, expected {classes.num_classes}")
        V = classes.vocab_size
        sizes = classes.sizes
        # weighted mode of each row: group (state, successor) pairs and sum class sizes
        keys = (np.arange(S, dtype=np.int64)[:, None] * S + table).ravel()
        uniq, inverse = np.unique(keys, return_inverse=True)
        weight = np.bincount(inverse.ravel(), weights=np.tile(sizes, S), minlength=len(uniq))
        owner, succ = uniq // S, uniq % S
        best = np.lexsort((succ, -weight, owner))
        first = np.ones(len(best), dtype=bool)
        first[1:] = owner[best][1:] != owner[best][:-1]
        default = np.empty(S, dtype=np.int64)
        default[owner[best][first]] = succ[best][first]
        is_exc = table != default[:, None]                      # [S, C]
        counts = (is_exc * sizes[None, :]).sum(axis=1)          # exceptions per state
        ptr = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        exc_tokens = np.empty(ptr[-1], dtype=np.int64)
        exc_next = np.empty(ptr[-1], dtype=np.int64)
        big = counts * 16 > V       # many exceptions: a mask over the vocabulary is cheaper
        for s in np.nonzero(big)[0]:
            tokens = np.nonzero(is_exc[s][classes.class_of_token])[0]
            exc_tokens[ptr[s]:ptr[s + 1]] = tokens
            exc_next[ptr[s]:ptr[s + 1]] = table[s][classes.class_of_token[tokens]]
        small = ~big & (counts > 0)
        if small.any():
            st, cl = np.nonzero(is_exc & small[:, None])
            lengths = sizes[cl]
            idx = ragged_indices(classes.members_ptr[cl], lengths)
            tokens = classes.members[idx]
            owner_s = np.repeat(st, lengths)
            nxt = np.repeat(table[st, cl], lengths)
            order = np.lexsort((tokens, owner_s))
            tokens, owner_s, nxt = tokens[order], owner_s[order], nxt[order]
            small_counts = np.where(small, counts, 0)
            group_start = np.cumsum(small_counts) - small_counts
            pos = ptr[owner_s] + np.arange(len(tokens)) - group_start[owner_s]
            exc_tokens[pos] = tokens
            exc_next[pos] = nxt
        return cls(V, int(initial), np.asarray(accepting, dtype=bool).copy(), default, ptr,
                   exc_tokens, exc_next)

    def __repr__(self) -> str:
        return (f"TokenDFA(states={self.num_states}, exceptions={self.num_exceptions}, "
                f"vocab_size={self.vocab_size}, accepting={int(self.accepting.sum())})")


def _empty_dfa(vocab_size: int) -> TokenDFA:
    builder = DFABuilder(vocab_size)
    builder.add_state()
    return builder.build(initial=0)


class DFABuilder:
    """Incremental construction of a :class:`TokenDFA`.

    States are added with :meth:`add_state` (by default absorbing: their default successor is
    themselves); :meth:`set_transitions` gives a state its default successor and exceptions.
    Exceptions equal to the default are dropped, so the result is canonical.
    """

    def __init__(self, vocab_size: int):
        if int(vocab_size) <= 0:
            raise ConstraintError(f"vocab_size must be positive, got {vocab_size}")
        self.vocab_size = int(vocab_size)
        self._default: list[int] = []
        self._exceptions: list[dict[int, int]] = []
        self._accepting: list[bool] = []

    @property
    def num_states(self) -> int:
        return len(self._default)

    def add_state(self, accepting: bool = False, default: int | None = None) -> int:
        s = len(self._default)
        self._default.append(s if default is None else int(default))
        self._exceptions.append({})
        self._accepting.append(bool(accepting))
        return s

    def set_accepting(self, state: int, accepting: bool = True) -> None:
        self._accepting[state] = bool(accepting)

    def set_default(self, state: int, successor: int) -> None:
        self._default[state] = int(successor)

    def set_edge(self, state: int, token: int, successor: int) -> None:
        if not 0 <= token < self.vocab_size:
            raise ConstraintError(f"token id {token} out of range [0, {self.vocab_size})")
        self._exceptions[state][int(token)] = int(successor)

    def set_transitions(self, state: int, default: int, exceptions: Mapping[int, int]) -> None:
        self._default[state] = int(default)
        self._exceptions[state] = {int(k): int(v) for k, v in exceptions.items()}

    def build(self, initial: int = 0) -> TokenDFA:
        S = len(self._default)
        ptr = np.zeros(S + 1, dtype=np.int64)
        tokens: list[np.ndarray] = []
        nexts: list[np.ndarray] = []
        default = np.asarray(self._default, dtype=np.int64)
        for s, exc in enumerate(self._exceptions):
            if exc:
                tok = np.fromiter(exc.keys(), dtype=np.int64, count=len(exc))
                nxt = np.fromiter(exc.values(), dtype=np.int64, count=len(exc))
                keep = nxt != default[s]
                tok, nxt = tok[keep], nxt[keep]
                order = np.argsort(tok)
                tokens.append(tok[order])
                nexts.append(nxt[order])
                ptr[s + 1] = len(tok)
        np.cumsum(ptr, out=ptr)
        if tokens:
            exc_tokens = np.concatenate(tokens)
            exc_next = np.concatenate(nexts)
        else:
            exc_tokens = np.zeros(0, dtype=np.int64)
            exc_next = np.zeros(0, dtype=np.int64)
        if exc_tokens.size and (exc_tokens.min() < 0 or exc_tokens.max() >= self.vocab_size):
            raise ConstraintError(f"token id out of range [0, {self.vocab_size})")
        return TokenDFA(
            vocab_size=self.vocab_size,
            initial=int(initial),
            accepting=np.asarray(self._accepting, dtype=bool),
            default=default,
            exc_ptr=ptr,
            exc_tokens=exc_tokens,
            exc_next=exc_next,
        )


# ---------------------------------------------------------------------- token classes
@dataclass(frozen=True, eq=False)
class TokenClasses:
    """A partition of the vocabulary into classes of tokens that behave identically in a set of
    DFAs (same successor from every state). Tokens that are an exception nowhere form one class.

    Attributes:
        class_of_token: int64 [V], the class id of each token.
        members_ptr: int64 [C + 1], CSR pointers into ``members``.
        members: int64 [V], the tokens of each class, sorted within a class.
    """

    class_of_token: np.ndarray
    members_ptr: np.ndarray
    members: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.class_of_token)

    @property
    def num_classes(self) -> int:
        return len(self.members_ptr) - 1

    @property
    def sizes(self) -> np.ndarray:
        """int64 [C]: number of tokens in each class."""
        return np.diff(self.members_ptr)

    @property
    def representatives(self) -> np.ndarray:
        """int64 [C]: the smallest token of each class."""
        return self.members[self.members_ptr[:-1]]

    def tokens(self, c: int) -> np.ndarray:
        return self.members[self.members_ptr[c]:self.members_ptr[c + 1]]

    @classmethod
    def from_labels(cls, labels) -> "TokenClasses":
        """Classes from arbitrary per-token labels; class ids follow first occurrence."""
        labels = np.asarray(labels)
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        class_of_token = rank[inverse.ravel()]
        members = np.argsort(class_of_token, kind="stable").astype(np.int64)
        ptr = np.zeros(len(first) + 1, dtype=np.int64)
        np.cumsum(np.bincount(class_of_token, minlength=len(first)), out=ptr[1:])
        return cls(class_of_token, ptr, members)


def check_same_vocab(dfas: Sequence[TokenDFA]) -> int:
    """The common vocabulary size of ``dfas``; VocabularyMismatchError if they differ."""
    if not dfas:
        raise ConstraintError("at least one DFA is required")
    for d in dfas:
        if not isinstance(d, TokenDFA):
            raise ConstraintError(f"expected a TokenDFA, got {type(d).__name__}")
    sizes = sorted({d.vocab_size for d in dfas})
    if len(sizes) > 1:
        raise VocabularyMismatchError(
            f"DFAs have different vocabulary sizes {sizes}; operands must share one vocabulary")
    return sizes[0]


def token_classes(*dfas: TokenDFA) -> TokenClasses:
    """Partition ``[0, V)`` into classes of tokens with identical exception signatures across all
    states of all ``dfas`` (hence identical transitions everywhere). Exact, O(E log E + V)."""
    V = check_same_vocab(dfas)
    offsets = np.cumsum([0] + [d.num_states for d in dfas])
    state = np.concatenate([d.exception_states() + o for d, o in zip(dfas, offsets)])
    token = np.concatenate([d.exc_tokens for d in dfas])
    nxt = np.concatenate([d.exc_next for d in dfas])
    if token.size == 0:
        return TokenClasses.from_labels(np.zeros(V, dtype=np.int64))
    order = np.lexsort((state, token))
    token = token[order]
    pairs = np.ascontiguousarray(np.stack([state[order], nxt[order]], axis=1))
    bounds = np.searchsorted(token, np.arange(V + 1))
    signature_id: dict[bytes, int] = {b"": 0}
    labels = np.zeros(V, dtype=np.int64)
    for v in np.nonzero(bounds[1:] > bounds[:-1])[0].tolist():
        key = pairs[bounds[v]:bounds[v + 1]].tobytes()
        labels[v] = signature_id.setdefault(key, len(signature_id))
    return TokenClasses.from_labels(labels)


# ---------------------------------------------------------------------- array helpers
def ragged_indices(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[i], starts[i] + lengths[i])`` over i, vectorised."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


def bfs_order(source: int, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Nodes reachable from ``source`` along edges ``src → dst``, in breadth-first order
    (scipy.sparse.csgraph; deterministic)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order

    graph = csr_matrix((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(num_nodes, num_nodes))
    graph.sort_indices()
    return breadth_first_order(graph, int(source), directed=True, return_predecessors=False
                               ).astype(np.int64)


def reachable_mask(sources: np.ndarray, src: np.ndarray, dst: np.ndarray,
                   num_nodes: int) -> np.ndarray:
    """Bool [num_nodes]: nodes reachable from any of ``sources`` along edges ``src → dst``."""
    mask = np.zeros(num_nodes, dtype=bool)
    if len(sources) == 0:
        return mask
    hub = num_nodes  # a virtual node with an edge to every source
    order = bfs_order(hub, np.concatenate([src, np.full(len(sources), hub)]),
                      np.concatenate([dst, sources]), num_nodes + 1)
    mask[order[order < num_nodes]] = True
    return mask
