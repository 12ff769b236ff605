"""Exact feasibility of a token DFA under a length budget: all that logical guidance needs.

Notation as in :mod:`ctrlg.guide.tables`: budget ``n = max_new_tokens``; a generation is a token sequence that
ends at an EOS token (inclusive) or after n tokens; EOS is terminal (emitting EOS from state s
is accepted iff δ(s, EOS) is accepting) and allowed only once ``min_new_tokens`` tokens exist.

F_r(s) = "some token sequence of ≤ r tokens from s is accepted" is computed from the DFA alone
(booleans, no floats)::

    F_0 = accepting,
    F_r(s) = [some non-exception token exists ∧ F_{r-1}(default(s))]
             ∨ ∃ v ∈ exc(s): F_{r-1}(δ(s, v)) ∨ [EOS allowed ∧ ∃ e: δ(s, e) accepting].

Cost O(n·(S + E)) to build (E stored exceptions, over letters when the DFA has them); per query
row O(V + |exc(s)|) for the token mask. Tokens into states with ¬F_{r-1} are exactly infeasible.
Logical guidance (Outlines / guidance style) is 0 on feasible tokens and −inf on the others;
:class:`ctrlg.guide.tables.GuideTables` adds the HMM's backward tables on top of this class.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ctrlg.dfa.core import TokenDFA, ragged_indices
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError

__all__ = ["Feasibility", "as_token_list", "renamed_budget"]


def renamed_budget(max_new_tokens, min_new_tokens, old_names: dict) -> tuple[int, int]:
    """Accept the old keywords ``max_tokens`` / ``min_tokens`` (DeprecationWarning)."""
    unknown = set(old_names) - {"max_tokens", "min_tokens"}
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}")
    for old, new in (("max_tokens", "max_new_tokens"), ("min_tokens", "min_new_tokens")):
        if old in old_names:
            warnings.warn(f"{old}= is deprecated; use {new}=", DeprecationWarning, stacklevel=3)
    return (old_names.get("max_tokens", max_new_tokens), old_names.get("min_tokens", min_new_tokens))


def as_token_list(values, name: str, vocab_size: int) -> list[int]:
    """``None`` / an id / ids → a list of ids checked to lie in [0, vocab_size)."""
    if values is None:
        return []
    if isinstance(values, (int, np.integer)):
        values = [int(values)]
    out = [int(v) for v in values]
    for v in out:
        if not 0 <= v < vocab_size:
            raise ConstraintError(f"{name} contains token id {v}, outside [0, {vocab_size})")
    return out


@dataclass
class _Exceptions:
    """Regular exception edges (over letters; letter = token for DFAs without letters), CSR order.
    Letters made only of EOS tokens are dropped (EOS is handled by the terminal term)."""

    ptr: np.ndarray   # [S + 1]
    src: np.ndarray   # [E]
    tok: np.ndarray   # [E] letter ids
    dst: np.ndarray   # [E]


class Feasibility:
    """Exact feasibility F_r (r = 0..n) of one DFA under a budget of n tokens (module docstring).

    Args:
        dfa: the constraint.
        max_new_tokens: the budget n (old name ``max_tokens``, deprecated).
        min_new_tokens: EOS is forbidden before this many tokens (old name ``min_tokens``).
        eos_token_id: id or ids of the (terminal) EOS tokens; None: generations are n tokens long.

    Attributes:
        feasible: bool numpy [n + 1, S], F_r(s).
        exc: the DFA's regular exception edges (EOS-only letters dropped), CSR order.
    """

    def __init__(self, dfa: TokenDFA, max_new_tokens: int = 32, *, min_new_tokens: int = 0,
                 eos_token_id=None, **old_names):
        max_new_tokens, min_new_tokens = renamed_budget(max_new_tokens, min_new_tokens, old_names)
        if not isinstance(dfa, TokenDFA):
            raise ConstraintError(f"expected a TokenDFA, got {type(dfa).__name__}")
        if int(max_new_tokens) < 1:
            raise ConstraintError(f"max_new_tokens (max_tokens) must be ≥ 1, got {max_new_tokens}")
        if not 0 <= int(min_new_tokens) <= int(max_new_tokens):
            raise ConstraintError(f"min_new_tokens (min_tokens) must lie in [0, max_new_tokens="
                                  f"{max_new_tokens}], got {min_new_tokens}")
        self.dfa = dfa
        self.max_new_tokens, self.min_new_tokens = int(max_new_tokens), int(min_new_tokens)
        self.eos_ids = list(dict.fromkeys(as_token_list(eos_token_id, "eos_token_id", dfa.vocab_size)))
        self.vocab_size = dfa.vocab_size
        self.device = torch.device("cpu")
        self._prepare_dfa()
        self._build_feasibility()

    # ------------------------------------------------------------------ structure
    def _prepare_dfa(self) -> None:
        dfa, S, V = self.dfa, self.dfa.num_states, self.dfa.vocab_size
        self.members_ptr, self.members = dfa.letter_members
        eos = np.asarray(self.eos_ids, dtype=np.int64)
        letter_of = dfa.letter_of_token
        size = np.diff(self.members_ptr).astype(np.int64)
        if len(eos):  # tokens of each letter that are not EOS
            np.subtract.at(size, eos if letter_of is None else letter_of[eos], 1)
        self.letter_size = size
        src = np.repeat(np.arange(S, dtype=np.int64), np.diff(dfa.letter_ptr))
        keep = size[dfa.letter_exc] > 0
        src, tok, dst = src[keep], dfa.letter_exc[keep], dfa.letter_next[keep]
        ptr = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=S), out=ptr[1:])
        self.exc = _Exceptions(ptr=ptr, src=src, tok=tok, dst=dst)
        n_eos = len(self.eos_ids)
        all_states = np.arange(S, dtype=np.int64)
        self.eos_next = np.stack([dfa.step_many(all_states, e) for e in self.eos_ids], axis=1) \
            if n_eos else np.zeros((S, 0), dtype=np.int64)
        self.eos_accept = dfa.accepting[self.eos_next] if n_eos else np.zeros((S, 0), dtype=bool)
        covered = np.bincount(src, weights=size[tok], minlength=S) if len(src) else np.zeros(S)
        self.has_default = (V - covered - n_eos) > 0

    def eos_allowed(self, remaining: int) -> bool:
        """Whether EOS may be the next token when ``remaining`` tokens are left (including it)."""
        return bool(self.eos_ids) and self.max_new_tokens - int(remaining) >= self.min_new_tokens

    def _build_feasibility(self) -> None:
        n, S = self.max_new_tokens, self.dfa.num_states
        exc = self.exc
        eos_any = self.eos_accept.any(axis=1)
        F = np.zeros((n + 1, S), dtype=bool)
        F[0] = self.dfa.accepting
        for r in range(1, n + 1):
            prev = F[r - 1]
            f = self.has_default & prev[self.dfa.default]
            if len(exc.src):
                f |= np.bincount(exc.src, weights=prev[exc.dst], minlength=S) > 0
            if self.eos_allowed(r):
                f |= eos_any
            F[r] = f
        self.feasible = F

    def check_satisfiable(self, state: int | None = None) -> None:
        """Raise UnsatisfiableConstraintError unless acceptance is possible within n tokens."""
        s = self.dfa.initial if state is None else int(state)
        if not self.feasible[self.max_new_tokens, s]:
            raise UnsatisfiableConstraintError(
                f"the constraint {self.dfa!r} cannot be satisfied within max_new_tokens="
                f"{self.max_new_tokens} tokens" + (f" (min_new_tokens={self.min_new_tokens})" if self.min_new_tokens else ""))

    # ------------------------------------------------------------------ per-token queries
    def _row_exceptions(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row index, exception index) pairs for the regular exceptions of each row's state."""
        lo, hi = self.exc.ptr[states], self.exc.ptr[states + 1]
        counts = hi - lo
        return np.repeat(np.arange(len(states)), counts), ragged_indices(lo, counts)

    def _expand(self, rows: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-token view of letter exceptions: (row, token, exception index) for every token of
        each exception's letter (EOS tokens included; callers override EOS columns last)."""
        letters = self.exc.tok[k]
        starts = self.members_ptr[letters]
        sizes = self.members_ptr[letters + 1] - starts
        idx = ragged_indices(starts, sizes)
        return np.repeat(rows, sizes), self.members[idx], np.repeat(k, sizes)

    def _check_remaining(self, states, remaining) -> tuple[np.ndarray, np.ndarray]:
        states = np.asarray(states, dtype=np.int64).reshape(-1)
        remaining = np.broadcast_to(np.asarray(remaining, dtype=np.int64), states.shape)
        if np.any(remaining < 1) or np.any(remaining > self.max_new_tokens):
            raise ConstraintError(f"remaining must lie in [1, {self.max_new_tokens}], got {remaining.tolist()}")
        return states, remaining

    def token_feasible(self, states, remaining) -> torch.Tensor:
        """Exact bool mask [R, V]: token v keeps acceptance possible (r tokens left incl. v)."""
        states, remaining = self._check_remaining(states, remaining)
        F = self.feasible
        mask = np.repeat(F[remaining - 1, self.dfa.default[states]][:, None], self.vocab_size, axis=1)
        rows, k = self._row_exceptions(states)
        trows, tokens, tk = self._expand(rows, k)
        mask[trows, tokens] = F[remaining[trows] - 1, self.exc.dst[tk]]
        allowed = np.array([self.eos_allowed(r) for r in remaining], dtype=bool)
        for j, e in enumerate(self.eos_ids):
            mask[:, e] = allowed & self.eos_accept[states, j]
        return torch.as_tensor(mask, device=self.device)

    @property
    def max_tokens(self) -> int:
        """Old name of ``max_new_tokens``."""
        return self.max_new_tokens

    @property
    def min_tokens(self) -> int:
        """Old name of ``min_new_tokens``."""
        return self.min_new_tokens

    def feasible_counts(self, states, remaining) -> np.ndarray:
        """int64 [R]: the number of tokens :meth:`token_feasible` marks, without building the
        mask: [F_{r-1}(default)] · (non-exception tokens) + Σ_exceptions |letter| · F_{r-1}(δ) +
        the allowed accepting EOS tokens. O(R + exceptions of the rows' states)."""
        states, remaining = self._check_remaining(states, remaining)
        F = self.feasible
        rows, k = self._row_exceptions(states)
        size = self.letter_size[self.exc.tok[k]]
        covered = np.bincount(rows, weights=size, minlength=len(states)).astype(np.int64)
        live = np.bincount(rows, weights=size * F[remaining[rows] - 1, self.exc.dst[k]],
                           minlength=len(states)).astype(np.int64)
        default_live = F[remaining - 1, self.dfa.default[states]]
        count = default_live * (self.vocab_size - len(self.eos_ids) - covered) + live
        if self.eos_ids:
            allowed = np.array([self.eos_allowed(r) for r in remaining], dtype=bool)
            count += (allowed[:, None] & self.eos_accept[states]).sum(1)
        return count

    def log_ratio(self, states, priors=None, remaining=1, *, shifted: bool = False) -> torch.Tensor:
        """Logical guidance [R, V]: 0 on feasible tokens, −inf on the others (``priors`` and
        ``shifted`` ignored)."""
        mask = self.token_feasible(states, remaining)
        return torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, -math.inf)
