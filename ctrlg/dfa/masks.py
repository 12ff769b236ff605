"""Allowed-token masks of a :class:`~ctrlg.dfa.core.TokenDFA`'s states, built once per state.

Logical masking (Outlines-style decoding) needs, at every step, the boolean mask

    mask_s[v] = [δ(s, v) is live]            (v ∈ [0, V))

of the current state ``s``. Built from the default-plus-exceptions arrays, a mask costs
O(V + |exc(s)|) per step: a fill of V entries and a scatter of the state's exceptions, which for
permissive regexes (``[a-zA-Z0-9._%+-]+``: ~17k exception tokens per state) is ~20 µs. A DFA
over letters gives it over letters instead, ``mask_s = row_s[letter_of_token]`` with
``row_s[a] = [δ(s, a) live]`` of size A (the number of letters), which is one gather of V
(~35 µs for V = 49,152).

:class:`TokenMasks` precomputes the masks like outlines-core's index precomputes its per-state
allowed-token lists: when the table fits ``max_table_bytes`` (S · V bytes), all states at once
with one vectorised gather ``live_table[:, letter_of_token]`` (``live_table[s, a] = [δ(s, a)
live]``), so a decoding step costs one row view (< 1 µs); otherwise each state's mask is built
on its first visit and memoised (at most ``max_cached_states`` of them).
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.core import TokenDFA
from ctrlg.errors import ConstraintError

__all__ = ["TokenMasks"]


class TokenMasks:
    """``masks(state)`` → read-only bool array [V]: the tokens whose successor is live.

    Args:
        dfa: the automaton.
        max_table_bytes: precompute every state's mask when S · V is at most this.
        max_cached_states: otherwise at most this many states keep their mask (V bytes each).
    """

    def __init__(self, dfa: TokenDFA, *, max_table_bytes: int = 64 << 20,
                 max_cached_states: int = 4096):
        self.dfa = dfa
        self.live = dfa.live_states()
        self.max_cached_states = int(max_cached_states)
        self._cache: dict[int, np.ndarray] = {}
        self._letter_of_token = (None if dfa.letter_of_token is None
                                 else dfa.letter_of_token.astype(np.intp))
        self.table: np.ndarray | None = None
        if dfa.num_states * dfa.vocab_size <= max_table_bytes:
            live_table = self.live[dfa.letter_table()]
            table = (live_table if self._letter_of_token is None
                     else live_table[:, self._letter_of_token])
            table.setflags(write=False)
            self.table = table

    def __call__(self, state: int) -> np.ndarray:
        if self.table is not None:
            return self.table[state]
        mask = self._cache.get(state)
        if mask is None:
            mask = self.build(state)
            if len(self._cache) < self.max_cached_states:
                self._cache[state] = mask
        return mask

    def build(self, state: int) -> np.ndarray:
        """The mask of ``state``, computed afresh: O(A + V) over letters, O(V + |exc(s)|)
        over tokens."""
        dfa = self.dfa
        if not 0 <= state < dfa.num_states:
            raise ConstraintError(f"state {state} out of range [0, {dfa.num_states})")
        letters, nxt = dfa.letter_exceptions(state)
        width = dfa.vocab_size if self._letter_of_token is None else dfa.num_letters
        row = np.full(width, self.live[dfa.default[state]])
        row[letters] = self.live[nxt]
        mask = row if self._letter_of_token is None else row[self._letter_of_token]
        mask.setflags(write=False)
        return mask
