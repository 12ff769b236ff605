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

**Letters (token classes).** Some constraints touch *many* tokens in every state: a word counter
must separate the ~17k continuation pieces of SmolLM2 from the ~32k ``Ġword`` pieces in each of
its states. Such automata are stored over a small alphabet of **letters**: ``letter_of_token[v]``
maps each token to a letter, and the default-plus-exceptions arrays are over letters
(``letter_exc``/``letter_next``, CSR ``letter_ptr``). All tokens of a letter behave identically.
Then ``Σ_v B[:, v] W(δ(s, v)) = Σ_a B̄[:, a] W(δ(s, a))`` with ``B̄[:, a] = Σ_{v: letter(v)=a}
B[:, v]`` — the guide pays O(letters) instead of O(tokens) per state. The per-token view
(``exc_ptr``, ``exc_tokens``, ``exc_next``, :meth:`exceptions`) is still available and is
materialised lazily on first use (it can be large: prefer the letter arrays for big automata).
An automaton without letters (``letter_of_token is None``) is the special case letter = token.

Exceptions whose successor equals the default are never stored (the representation is canonical
given the transition function and the default), so equal automata compare equal array-wise.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping, Sequence

import numpy as np

from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError

__all__ = ["TokenDFA", "DFABuilder", "TokenClasses", "token_classes"]


def _as_index_array(values, name: str) -> np.ndarray:
    """A private int64 copy (the DFA marks its arrays read-only; callers' arrays stay writable)."""
    array = np.array(values, dtype=np.int64, copy=True)
    if array.ndim != 1:
        raise ConstraintError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


class WrapsTokenDFA:
    """Mixin of constraints built around a token DFA ``self.dfa`` (the canonical filter, a
    grammar): they answer the questions callers ask of a TokenDFA about it."""

    @property
    def vocab_size(self) -> int:
        return self.dfa.vocab_size

    @property
    def initial(self) -> int:
        return self.dfa.initial

    @property
    def num_states(self) -> int:
        """States of the wrapped automaton (what the constraint adds is built on demand)."""
        return self.dfa.num_states


class TokenDFA:
    """A complete DFA over token ids in default-plus-exceptions (CSR) form, optionally over
    letters (token classes).

    Constructor arguments (all stored read-only):
        vocab_size: V, the size of the token alphabet.
        initial: the start state.
        accepting: bool array [S].
        default: int64 array [S], the successor for every non-exception token.
        exc_ptr: int64 array [S + 1], CSR row pointers into the exception arrays.
        exc_tokens: int64 array [E], exception tokens (letters if ``letter_of_token`` is given),
            sorted within each state.
        exc_next: int64 array [E], the successor for each exception.
        letter_of_token: optional int64 array [V] mapping each token to its letter in [0, A).
    """

    def __init__(self, vocab_size: int, initial: int, accepting, default, exc_ptr, exc_tokens,
                 exc_next, letter_of_token=None):
        self.vocab_size = int(vocab_size)
        self.initial = int(initial)
        self.accepting = np.array(accepting, dtype=bool, copy=True)
        self.default = _as_index_array(default, "default")
        self.letter_ptr = _as_index_array(exc_ptr, "exc_ptr")
        self.letter_exc = _as_index_array(exc_tokens, "exc_tokens")
        self.letter_next = _as_index_array(exc_next, "exc_next")
        self.letter_of_token = (None if letter_of_token is None
                                else _as_index_array(letter_of_token, "letter_of_token"))
        self._validate()

    def _validate(self) -> None:
        S = len(self.default)
        if self.vocab_size <= 0:
            raise ConstraintError(f"vocab_size must be positive, got {self.vocab_size}")
        if S == 0:
            raise ConstraintError("a DFA needs at least one state")
        if not 0 <= self.initial < S:
            raise ConstraintError(f"initial state {self.initial} out of range [0, {S})")
        if self.accepting.shape != (S,) or self.letter_ptr.shape != (S + 1,):
            raise ConstraintError("accepting/exc_ptr shapes do not match the number of states")
        if self.letter_exc.shape != self.letter_next.shape:
            raise ConstraintError("exc_tokens and exc_next must have the same length")
        if self.letter_ptr[0] != 0 or self.letter_ptr[-1] != len(self.letter_exc):
            raise ConstraintError("exc_ptr must start at 0 and end at the number of exceptions")
        if np.any(np.diff(self.letter_ptr) < 0):
            raise ConstraintError("exc_ptr must be non-decreasing")
        alphabet = self.vocab_size
        if self.letter_of_token is not None:
            if self.letter_of_token.shape != (self.vocab_size,):
                raise ConstraintError(f"letter_of_token must have one entry per token "
                                      f"({self.vocab_size}), got shape {self.letter_of_token.shape}")
            if self.letter_of_token.size and self.letter_of_token.min() < 0:
                raise ConstraintError("letter_of_token has negative entries")
            alphabet = int(self.letter_of_token.max()) + 1
        name = "exc_tokens" if self.letter_of_token is None else "exception letters"
        for what, arr, hi in (("default", self.default, S), ("exc_next", self.letter_next, S),
                              (name, self.letter_exc, alphabet)):
            if arr.size and (arr.min() < 0 or arr.max() >= hi):
                raise ConstraintError(f"{what} has entries outside [0, {hi})")
        if self.letter_exc.size > 1:
            increasing = np.diff(self.letter_exc) > 0
            # positions where a new state's exception list starts need not increase
            starts = self.letter_ptr[1:-1]
            starts = starts[(starts > 0) & (starts < self.letter_exc.size)]
            increasing[starts - 1] = True
            if not increasing.all():
                raise ConstraintError("exception tokens must be sorted and unique within each state")
        if self.letter_exc.size and np.any(self.letter_next == self.default[self._letter_states]):
            raise ConstraintError("an exception's successor equals its state's default successor "
                                  "(use DFABuilder, which drops such exceptions)")
        for arr in (self.accepting, self.default, self.letter_ptr, self.letter_exc,
                    self.letter_next, self.letter_of_token):
            if arr is not None:
                arr.setflags(write=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "TokenDFA":
        """Rebuild from :meth:`to_arrays` output (e.g. loaded from safetensors or ``np.load``)."""
        try:
            meta = np.asarray(arrays["meta"], dtype=np.int64)
            letters = arrays["letter_of_token"] if "letter_of_token" in arrays else None
            return cls(
                vocab_size=int(meta[0]),
                initial=int(meta[1]),
                accepting=np.asarray(arrays["accepting"], dtype=bool).copy(),
                default=_as_index_array(arrays["default"], "default").copy(),
                exc_ptr=_as_index_array(arrays["exc_ptr"], "exc_ptr").copy(),
                exc_tokens=_as_index_array(arrays["exc_tokens"], "exc_tokens").copy(),
                exc_next=_as_index_array(arrays["exc_next"], "exc_next").copy(),
                letter_of_token=None if letters is None else np.asarray(letters).copy(),
            )
        except KeyError as missing:
            raise ConstraintError(f"DFA arrays lack the field {missing}") from None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain numpy arrays (for caching with ``np.savez`` or safetensors); the stored
        (letter-level) exceptions, plus ``letter_of_token`` when the DFA has letters."""
        out = {
            "meta": np.array([self.vocab_size, self.initial], dtype=np.int64),
            "accepting": self.accepting.astype(np.uint8),
            "default": self.default,
            "exc_ptr": self.letter_ptr,
            "exc_tokens": self.letter_exc,
            "exc_next": self.letter_next,
        }
        if self.letter_of_token is not None:
            out["letter_of_token"] = self.letter_of_token
        return out

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

    # ------------------------------------------------------------------ letters
    @property
    def has_letters(self) -> bool:
        """Whether exceptions are stored over letters (token classes) rather than tokens."""
        return self.letter_of_token is not None

    @property
    def num_letters(self) -> int:
        """Size of the stored alphabet (V when the DFA has no letters)."""
        if self.letter_of_token is None:
            return self.vocab_size
        return int(self.letter_of_token.max()) + 1

    @cached_property
    def letter_members(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr [A + 1], tokens [V])``: the tokens of each letter, sorted (CSR)."""
        if self.letter_of_token is None:
            return (np.arange(self.vocab_size + 1, dtype=np.int64),
                    np.arange(self.vocab_size, dtype=np.int64))
        A = self.num_letters
        tokens = np.argsort(self.letter_of_token, kind="stable").astype(np.int64)
        ptr = np.zeros(A + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.letter_of_token, minlength=A), out=ptr[1:])
        return ptr, tokens

    @cached_property
    def _letter_states(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_states, dtype=np.int64), np.diff(self.letter_ptr))

    # ------------------------------------------------------------------ per-token view
    @cached_property
    def _token_exceptions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.letter_of_token is None:
            return self.letter_ptr, self.letter_exc, self.letter_next
        ptr, tokens, nxt = expand_letters(self.letter_ptr, self.letter_exc, self.letter_next,
                                          *self.letter_members, self.letter_of_token)
        for arr in (ptr, tokens, nxt):
            arr.setflags(write=False)
        return ptr, tokens, nxt

    @property
    def exc_ptr(self) -> np.ndarray:
        """int64 [S + 1]: CSR pointers of the per-token exceptions."""
        return self._token_exceptions[0]

    @property
    def exc_tokens(self) -> np.ndarray:
        """int64 [E]: per-token exceptions, sorted within each state (materialised lazily for a
        DFA with letters)."""
        return self._token_exceptions[1]

    @property
    def exc_next(self) -> np.ndarray:
        """int64 [E]: successor of each per-token exception."""
        return self._token_exceptions[2]

    # ------------------------------------------------------------------ queries
    @property
    def num_states(self) -> int:
        return len(self.default)

    @property
    def num_exceptions(self) -> int:
        """Number of (state, token) exceptions in the per-token view."""
        if self.letter_of_token is None:
            return len(self.letter_exc)
        sizes = np.diff(self.letter_members[0])
        return int(sizes[self.letter_exc].sum())

    @property
    def num_stored_exceptions(self) -> int:
        """Number of stored exceptions (over letters when the DFA has them)."""
        return len(self.letter_exc)

    def is_accepting(self, state: int) -> bool:
        if not 0 <= state < self.num_states:
            raise ConstraintError(f"state {state} out of range [0, {self.num_states})")
        return bool(self.accepting[state])

    def exception_states(self) -> np.ndarray:
        """int64 [E]: the state each per-token exception belongs to (aligned with ``exc_tokens``)."""
        if self.letter_of_token is None:
            return self._letter_states
        return np.repeat(np.arange(self.num_states, dtype=np.int64), np.diff(self.exc_ptr))

    def exceptions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, successors) of the exception edges of ``state``."""
        lo, hi = self.letter_ptr[state], self.letter_ptr[state + 1]
        letters, nxt = self.letter_exc[lo:hi], self.letter_next[lo:hi]
        if self.letter_of_token is None:
            return letters, nxt
        mptr, members = self.letter_members
        sizes = mptr[letters + 1] - mptr[letters]
        tokens = members[ragged_indices(mptr[letters], sizes)]
        succ = np.repeat(nxt, sizes)
        order = np.argsort(tokens, kind="stable")
        return tokens[order], succ[order]

    def letter_exception_states(self) -> np.ndarray:
        """int64 [E_letters]: the state each stored exception belongs to (aligned with
        ``letter_exc``)."""
        return self._letter_states

    def letter_exceptions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(letters, successors) of the stored exceptions of ``state``."""
        lo, hi = self.letter_ptr[state], self.letter_ptr[state + 1]
        return self.letter_exc[lo:hi], self.letter_next[lo:hi]

    def step(self, state: int, token: int) -> int:
        """δ(state, token)."""
        if not 0 <= state < self.num_states:
            raise ConstraintError(f"state {state} out of range [0, {self.num_states})")
        if not 0 <= token < self.vocab_size:
            raise ConstraintError(f"token id {token} out of range [0, {self.vocab_size})")
        key = token if self.letter_of_token is None else int(self.letter_of_token[token])
        lo, hi = int(self.letter_ptr[state]), int(self.letter_ptr[state + 1])
        k = lo + int(np.searchsorted(self.letter_exc[lo:hi], key))
        if k < hi and self.letter_exc[k] == key:
            return int(self.letter_next[k])
        return int(self.default[state])

    @cached_property
    def _letter_keys(self) -> np.ndarray:
        """int64 [E_letters]: ``state · A + letter`` of every stored exception (sorted, as the CSR
        order keeps states ascending and letters sorted within a state)."""
        return self._letter_states * self.num_letters + self.letter_exc

    def step_many(self, states, tokens) -> np.ndarray:
        """δ(states[i], tokens[i]) for arrays of states and tokens (broadcast), vectorised:
        one binary search over the stored exceptions, O(R · log E)."""
        states, tokens = np.broadcast_arrays(np.asarray(states, dtype=np.int64),
                                             np.asarray(tokens, dtype=np.int64))
        if states.size and (states.min() < 0 or states.max() >= self.num_states):
            raise ConstraintError(f"a state is out of range [0, {self.num_states})")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ConstraintError(f"a token id is out of range [0, {self.vocab_size})")
        letters = tokens if self.letter_of_token is None else self.letter_of_token[tokens]
        keys = self._letter_keys
        out = self.default[states].copy()
        if len(keys):
            query = states * self.num_letters + letters
            idx = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
            found = keys[idx] == query
            out[found] = self.letter_next[idx[found]]
        return out

    def run(self, tokens: Iterable[int], state: int | None = None) -> int:
        """The state reached from ``state`` (default: initial) after reading ``tokens``."""
        if isinstance(tokens, (str, bytes)):
            raise ConstraintError(f"tokens must be a sequence of token ids, got the string "
                                  f"{tokens!r} (encode it with the tokenizer first)")
        s = self.initial if state is None else state
        for token in tokens:
            try:
                if isinstance(token, (bool, float, np.bool_)):
                    raise TypeError
                token = operator.index(token)          # ints, numpy and torch integer scalars
            except TypeError:
                raise ConstraintError(f"{token!r} is not a token id (an int)") from None
            s = self.step(s, token)
        return s

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Whether the whole token sequence is accepted."""
        return self.is_accepting(self.run(tokens))

    def successors(self, state: int) -> np.ndarray:
        """Dense successor row ``[V]`` of one state (O(V); for tests and small vocabularies)."""
        letters, nxt = self.letter_exceptions(state)
        row = np.full(self.num_letters, self.default[state], dtype=np.int64)
        row[letters] = nxt
        return row if self.letter_of_token is None else row[self.letter_of_token]

    def dense(self) -> np.ndarray:
        """Dense transition table ``[S, V]`` (O(S·V) memory; for tests and small vocabularies)."""
        return np.stack([self.successors(s) for s in range(self.num_states)])

    def letter_table(self) -> np.ndarray:
        """Dense successor table over letters ``[S, A]`` (A = V without letters)."""
        table = np.repeat(self.default[:, None], self.num_letters, axis=1)
        table[self._letter_states, self.letter_exc] = self.letter_next
        return table

    def _edge_list(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of all distinct transitions, default edges included."""
        S = self.num_states
        src = np.concatenate([np.arange(S, dtype=np.int64), self._letter_states])
        dst = np.concatenate([self.default, self.letter_next])
        pairs = np.unique(src * S + dst)
        return pairs // S, pairs % S

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
        """Return self, or raise UnsatisfiableConstraintError if the language is empty."""
        if self.is_empty():
            raise UnsatisfiableConstraintError(
                f"the {what} is unsatisfiable: its automaton accepts no token sequence")
        return self

    def trim(self) -> "TokenDFA":
        """Equivalent DFA with only reachable states, where all states that cannot reach
        acceptance are merged into one dead state (absorbing, non-accepting).

        State ids are renumbered in BFS order from the initial state (successors visited in
        increasing state order), so the result is deterministic. The language is unchanged.
        Vectorised over the CSR arrays: O(S + E) numpy work; letters are kept.
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
        lengths = np.diff(self.letter_ptr)[order]
        idx = ragged_indices(self.letter_ptr[:-1][order], lengths)
        tokens = self.letter_exc[idx]
        nxt = new_id[self.letter_next[idx]]
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
        return TokenDFA(self.vocab_size, 0, accepting, default, ptr, tokens, nxt,
                        self.letter_of_token)

    # ------------------------------------------------------------------ token classes
    def behaviour_labels(self) -> np.ndarray:
        """int64 [V]: equal labels ⇔ the tokens have the same successor in every state
        (label 0 for tokens that are an exception nowhere, if any)."""
        A = self.num_letters
        state, letter, nxt = self._letter_states, self.letter_exc, self.letter_next
        labels = np.zeros(A, dtype=np.int64)
        if letter.size:
            order = np.lexsort((state, letter))
            letter = letter[order]
            pairs = np.ascontiguousarray(np.stack([state[order], nxt[order]], axis=1))
            bounds = np.searchsorted(letter, np.arange(A + 1))
            signature_id: dict[bytes, int] = {b"": 0}
            for a in np.nonzero(bounds[1:] > bounds[:-1])[0].tolist():
                key = pairs[bounds[a]:bounds[a + 1]].tobytes()
                labels[a] = signature_id.setdefault(key, len(signature_id))
        return labels if self.letter_of_token is None else labels[self.letter_of_token]

    def class_table(self, classes: "TokenClasses") -> np.ndarray:
        """Dense successor table ``[S, C]`` over token classes: ``table[s, c] = δ(s, v)`` for any
        token ``v`` of class ``c``. ``classes`` must refine this DFA's token behaviour (e.g.
        :func:`token_classes` computed with this DFA among its arguments)."""
        if classes.vocab_size != self.vocab_size:
            raise VocabularyMismatchError(
                f"token classes are over {classes.vocab_size} tokens, the DFA over {self.vocab_size}")
        if self.letter_of_token is not None:
            return self.letter_table()[:, self.letter_of_token[classes.representatives]]
        table = np.repeat(self.default[:, None], classes.num_classes, axis=1)
        table[self._letter_states, classes.class_of_token[self.letter_exc]] = self.letter_next
        return table

    @classmethod
    def from_class_table(cls, table, accepting, classes: "TokenClasses",
                         initial: int = 0) -> "TokenDFA":
        """A DFA with letters = ``classes`` from a successor table over classes ``[S, C]``. The
        default of each state is the successor shared by the most tokens (class sizes as
        weights), which minimises the per-token exceptions. Nothing is expanded per token."""
        table = np.asarray(table, dtype=np.int64)
        S, C = table.shape
        if C != classes.num_classes:
            raise ConstraintError(f"class table has {C} columns, expected {classes.num_classes}")
        default = _heaviest_successor(table, classes.sizes)
        state, letter = np.nonzero(table != default[:, None])
        ptr = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(np.bincount(state, minlength=S), out=ptr[1:])
        return cls(classes.vocab_size, int(initial), np.asarray(accepting, dtype=bool).copy(),
                   default, ptr, letter.astype(np.int64), table[state, letter],
                   classes.class_of_token)

    def without_letters(self) -> "TokenDFA":
        """The same automaton with per-token exceptions stored directly."""
        if self.letter_of_token is None:
            return self
        return TokenDFA(self.vocab_size, self.initial, self.accepting.copy(), self.default.copy(),
                        self.exc_ptr.copy(), self.exc_tokens.copy(), self.exc_next.copy())

    def __repr__(self) -> str:
        letters = f", letters={self.num_letters}" if self.letter_of_token is not None else ""
        return (f"TokenDFA(states={self.num_states}, exceptions={self.num_exceptions}"
                f"{letters}, vocab_size={self.vocab_size}, "
                f"accepting={int(self.accepting.sum())})")


def _heaviest_successor(table: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """int64 [S]: for each row of ``table`` [S, C], the successor with the largest total column
    weight (ties: the smallest successor). Rows are sorted on their own and their runs of equal
    successors summed, O(S·C·log C); O(S) when one column weighs more than all others together
    (its successor is then the heaviest in every row)."""
    S, C = table.shape
    weights = np.asarray(weights)
    heaviest = int(np.argmax(weights)) if C else 0
    if C and 2 * int(weights[heaviest]) > int(weights.sum()):
        return table[:, heaviest].astype(np.int64)
    order = np.argsort(table, axis=1, kind="stable")
    succ = np.take_along_axis(table, order, axis=1).ravel()
    run_start = np.ones(S * C, dtype=bool)
    run_start.reshape(S, C)[:, 1:] = succ.reshape(S, C)[:, 1:] != succ.reshape(S, C)[:, :-1]
    starts = np.flatnonzero(run_start)
    run_weight = np.add.reduceat(np.asarray(weights)[order].ravel(), starts)
    run_owner, run_succ = starts // C, succ[starts]
    best = np.lexsort((run_succ, -run_weight, run_owner))
    first = np.ones(len(best), dtype=bool)
    first[1:] = run_owner[best][1:] != run_owner[best][:-1]
    default = np.empty(S, dtype=np.int64)
    default[run_owner[best][first]] = run_succ[best][first]
    return default


def _empty_dfa(vocab_size: int) -> TokenDFA:
    builder = DFABuilder(vocab_size)
    builder.add_state()
    return builder.build(initial=0)


def expand_letters(ptr, letters, nxt, members_ptr, members, letter_of_token):
    """Per-token CSR exceptions ``(ptr, tokens, next)`` from letter-level ones."""
    S = len(ptr) - 1
    V = len(letter_of_token)
    sizes = members_ptr[1:] - members_ptr[:-1]
    state = np.repeat(np.arange(S, dtype=np.int64), np.diff(ptr))
    counts = np.bincount(state, weights=sizes[letters], minlength=S).astype(np.int64)
    out_ptr = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(counts, out=out_ptr[1:])
    out_tokens = np.empty(out_ptr[-1], dtype=np.int64)
    out_next = np.empty(out_ptr[-1], dtype=np.int64)
    big = counts * 16 > V       # many exceptions: a mask over the vocabulary is cheaper
    A = len(sizes)
    for s in np.nonzero(big)[0]:
        lo, hi = ptr[s], ptr[s + 1]
        row = np.full(A, -1, dtype=np.int64)
        row[letters[lo:hi]] = nxt[lo:hi]
        per_token = row[letter_of_token]
        tokens = np.nonzero(per_token >= 0)[0]
        out_tokens[out_ptr[s]:out_ptr[s + 1]] = tokens
        out_next[out_ptr[s]:out_ptr[s + 1]] = per_token[tokens]
    small = ~big[state]
    if small.any():
        st, lt, nx = state[small], letters[small], nxt[small]
        lengths = sizes[lt]
        tokens = members[ragged_indices(members_ptr[lt], lengths)]
        owner = np.repeat(st, lengths)
        succ = np.repeat(nx, lengths)
        order = np.lexsort((tokens, owner))
        tokens, owner, succ = tokens[order], owner[order], succ[order]
        small_counts = np.where(big, 0, counts)
        group_start = np.cumsum(small_counts) - small_counts
        pos = out_ptr[owner] + np.arange(len(tokens)) - group_start[owner]
        out_tokens[pos] = tokens
        out_next[pos] = succ
    return out_ptr, out_tokens, out_next


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
    """Partition ``[0, V)`` into the coarsest classes of tokens that behave identically in every
    state of every one of ``dfas``: each DFA labels tokens by their exception signature
    (:meth:`TokenDFA.behaviour_labels`, O(E log E) over its stored exceptions), and the classes are
    the distinct label tuples."""
    check_same_vocab(dfas)
    labels = [d.behaviour_labels() for d in dfas]
    if len(labels) == 1:
        return TokenClasses.from_labels(labels[0])
    return TokenClasses.from_labels(combine_labels(labels))


def combine_labels(labels: Sequence[np.ndarray]) -> np.ndarray:
    """Dense ids of the distinct tuples ``(labels[0][i], labels[1][i], ...)`` of non-negative
    int labels."""
    joint = _dense_ids(np.asarray(labels[0], dtype=np.int64))
    for lab in labels[1:]:
        lab = _dense_ids(np.asarray(lab, dtype=np.int64))
        joint = _dense_ids(joint * (int(lab.max()) + 1) + lab)
    return joint


def _dense_ids(keys: np.ndarray) -> np.ndarray:
    """Map non-negative int keys to 0..K-1 preserving order (a lookup table when the key range
    is small, else a sort)."""
    top = int(keys.max()) + 1 if keys.size else 0
    if top <= 4 * max(keys.size, 1):
        present = np.zeros(top, dtype=np.int64)
        present[keys] = 1
        return (np.cumsum(present) - 1)[keys]
    return np.unique(keys, return_inverse=True)[1].ravel()


# ---------------------------------------------------------------------- array helpers
def ragged_indices(starts: np.ndarray, lengths: np.ndarray, dtype=np.int64) -> np.ndarray:
    """Concatenation of ``arange(starts[i], starts[i] + lengths[i])`` over i, vectorised
    (``dtype``: of the result; int32 halves the memory traffic of hot loops)."""
    starts = np.asarray(starts, dtype=dtype)
    lengths = np.asarray(lengths)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=dtype)
    offsets = (np.cumsum(lengths, dtype=np.int64) - lengths).astype(dtype)
    return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=dtype)


def bfs_order(source: int, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Nodes reachable from ``source`` along edges ``src → dst``, in breadth-first order
    (children of earlier nodes first, each node's children by increasing id). Vectorised one
    BFS level at a time; graphs with more than :data:`_SCIPY_BFS_EDGES` edges are searched in C
    (``scipy.sparse.csgraph.breadth_first_order`` over the adjacency with sorted columns: the
    same order)."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if not _sorted_pairs(src, dst):
        order = np.lexsort((dst, src))
        src, dst = src[order], dst[order]
    if len(src) > _SCIPY_BFS_EDGES:
        return _scipy_bfs_order(source, src, dst, num_nodes)
    ptr = np.searchsorted(src, np.arange(num_nodes + 1))
    seen = np.zeros(num_nodes, dtype=bool)
    seen[source] = True
    levels = [np.array([source], dtype=np.int64)]
    frontier = levels[0]
    while frontier.size:
        children = dst[ragged_indices(ptr[frontier], ptr[frontier + 1] - ptr[frontier])]
        children = children[~seen[children]]
        if not children.size:
            break
        _, first = np.unique(children, return_index=True)
        frontier = children[np.sort(first)]
        seen[frontier] = True
        levels.append(frontier)
    return np.concatenate(levels)


def distinct_edges(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)``: the distinct transitions of a successor table ``[S, C]``, sorted by
    (src, dst). Each row is sorted on its own (O(S·C·log C), no hashing of the S·C pairs)."""
    table = np.asarray(table, dtype=np.int64)
    succ = np.sort(table, axis=1)
    first = np.ones(succ.shape, dtype=bool)
    first[:, 1:] = succ[:, 1:] != succ[:, :-1]
    src, col = np.nonzero(first)
    return src.astype(np.int64), succ[src, col]


# edge counts above which a breadth-first search runs in scipy's C code (imported only then)
_SCIPY_BFS_EDGES = 200_000


def _sorted_pairs(src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether the edges are already sorted by (src, dst)."""
    if len(src) < 2:
        return True
    step = src[1:] - src[:-1]
    return bool(np.all((step > 0) | ((step == 0) & (dst[1:] >= dst[:-1]))))


def _scipy_bfs_order(source: int, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """:func:`bfs_order` for edges sorted by (src, dst), by scipy's FIFO breadth-first search
    (duplicate edges removed first: scipy would sum them)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order

    keep = np.ones(len(src), dtype=bool)
    keep[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    src, dst = src[keep], dst[keep]
    ptr = np.searchsorted(src, np.arange(num_nodes + 1))
    graph = csr_matrix((np.ones(len(dst), dtype=np.int8), dst, ptr), shape=(num_nodes,) * 2)
    return breadth_first_order(graph, source, directed=True,
                               return_predecessors=False).astype(np.int64)


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
