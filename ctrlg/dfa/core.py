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

from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError

__all__ = ["TokenDFA", "DFABuilder"]


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

    def exceptions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, successors) of the exception edges of ``state``."""
        lo, hi = self.exc_ptr[state], self.exc_ptr[state + 1]
        return self.exc_tokens[lo:hi], self.exc_next[lo:hi]

    def step(self, state: int, token: int) -> int:
        """δ(state, token)."""
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
        S = self.num_states
        src = np.concatenate([np.arange(S), np.repeat(np.arange(S), np.diff(self.exc_ptr))])
        dst = np.concatenate([self.default, self.exc_next])
        order = np.argsort(dst, kind="stable")
        src, dst = src[order], dst[order]
        ptr = np.searchsorted(dst, np.arange(S + 1))
        live = self.accepting.copy()
        stack = list(np.nonzero(live)[0])
        while stack:
            t = stack.pop()
            for s in src[ptr[t]:ptr[t + 1]]:
                if not live[s]:
                    live[s] = True
                    stack.append(s)
        return live

    def reachable_states(self) -> np.ndarray:
        """Bool [S]: states reachable from the initial state (BFS)."""
        seen = np.zeros(self.num_states, dtype=bool)
        seen[self.initial] = True
        stack = [self.initial]
        while stack:
            s = stack.pop()
            _, nxt = self.exceptions(s)
            for t in (self.default[s], *nxt):
                if not seen[t]:
                    seen[t] = True
                    stack.append(int(t))
        return seen

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

        State ids are renumbered in BFS order from the initial state, so the result is
        deterministic. The language is unchanged.
        """
        live = self.live_states()
        dead_needed = False
        order: dict[int, int] = {}
        queue = [self.initial] if live[self.initial] else []
        if not queue:
            return _empty_dfa(self.vocab_size)
        order[self.initial] = 0
        head = 0
        rows: list[tuple[int, list[int], list[int]]] = []
        while head < len(queue):
            s = queue[head]
            head += 1
            tokens, nxt = self.exceptions(s)
            targets = [int(self.default[s])] + nxt.tolist()
            for t in targets:
                if live[t] and t not in order:
                    order[t] = len(queue)
                    queue.append(t)
            rows.append((int(self.default[s]), tokens.tolist(), nxt.tolist()))
        dead = len(queue)
        builder = DFABuilder(self.vocab_size)
        for _ in range(len(queue)):
            builder.add_state()
        for new, (old_default, tokens, nxt) in enumerate(rows):
            d = order.get(old_default, dead)
            dead_needed |= d == dead
            exc = {}
            for tok, t in zip(tokens, nxt):
                tt = order.get(t, dead)
                dead_needed |= tt == dead
                exc[tok] = tt
            builder.set_transitions(new, d, exc)
            if self.accepting[queue[new]]:
                builder.set_accepting(new)
        if dead_needed:
            builder.add_state()  # the dead state: absorbing by default
        return builder.build(initial=0)

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
