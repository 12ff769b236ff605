"""Exact token masks for a :class:`~ctrlg.dfa.canonical_filter.CanonicalDFA` under a length budget.

A row's product state is ``σ = (q, a, f)``: ``q`` the state of the all-encodings DFA A, ``a`` the
last generated token (``START`` before the first) and ``f`` its flag under the bigram test
(:func:`~ctrlg.dfa.canonical.token_verdicts`). With ``r`` tokens left (the next one
included), the canonical feasibility ``C_r(σ)`` mirrors :class:`ctrlg.guide.feasibility.Feasibility`'s
``F_r(q)`` on the product::

    C_0(σ) = accepting(q) ∧ end(f),
    C_r(σ) = [EOS allowed at r ∧ δ(q, EOS) accepting ∧ end(f)]
             ∨ ∃ v ≠ EOS: F_{r-1}(δ(q, v)) ∧ g = verdict(a, f, v) ≠ REJECT ∧ C_{r-1}(δ(q, v), v, g),

where ``end(f)`` says the text may stop after a token with flag ``f``. ``C_r(σ) ⇒ F_r(q)``, so A's
table prunes the search. The mask of σ keeps exactly the tokens ``v`` with the conjunction above
(EOS: the bracket), i.e. those after which a canonical accepted completion still fits.

Search. ``C`` is memoised per ``(q, a, f, r)``. A query is a depth-first search for one
witness: successors are tried in order of A's distance to an EOS-accepting state (the shortest
completions first), their verdicts in growing chunks. The mask of a row needs ``C_{r-1}`` for
every candidate ``v`` (thousands, in a ``[a-z]+`` loop); candidates are grouped by ``(δ(q, v),
g)`` and resolved together: for the group's first promising successors ``w`` one vectorised
verdict ``(v, w)`` per group settles every ``v`` whose pair with ``w`` is canonical and whose
``C_{r-2}(δ(q', w), w, ·)`` holds (one memoised query, shared by the group); the few left over go
through the exact search one by one. A search that expands more than ``max_expansions``
successors raises :class:`~ctrlg.errors.ConstraintError` instead of running on.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ctrlg.dfa.canonical import FREE, REJECT, START, token_verdicts
from ctrlg.dfa.canonical_filter import CanonicalDFA, end_allowed
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility

__all__ = ["CanonicalFeasibility", "restrict_to_mask"]


def restrict_to_mask(log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` of ``log_probs`` [V] over the tokens of the bool ``mask`` only; uniform
    over the mask when ``log_probs`` gives all of them probability 0 (the LM's fallback rule in
    :mod:`ctrlg.guide.guidance`); all −inf when the mask is empty."""
    kept = log_probs.masked_fill(~mask, -math.inf)
    if not bool(torch.isfinite(kept).any()):
        kept = torch.zeros_like(log_probs).masked_fill_(~mask, -math.inf)
    if not bool(mask.any()):
        return kept
    return torch.log_softmax(kept, -1)


_CHUNKS = (16, 256, 4096)        # verdicts checked per step of a witness search
_GROUP_TRIES = 24                 # successors tried per candidate group before one-by-one search


class CanonicalFeasibility:
    """Decode-time masks of ``L(A) ∩ Canon`` (module docstring) on top of A's
    :class:`~ctrlg.guide.feasibility.Feasibility` table ``table`` (same DFA, budget and EOS ids).

    Args:
        table: A's feasibility (or guide) table; ``table.dfa`` is the all-encodings factor.
        constraint: the :class:`CanonicalDFA` (its tokenizer's pair checker is used).
        max_expansions: bound on successors one witness search may try.
    """

    def __init__(self, table: Feasibility, constraint: CanonicalDFA, *,
                 max_expansions: int = 2_000_000):
        self.table, self.constraint = table, constraint
        self.checker = constraint.checker
        self.checker.merge_tables()   # once per vocabulary (~1 s on 49k tokens): pairs in bulk
        self.dfa = table.dfa
        self.max_expansions = int(max_expansions)
        self.eos = np.asarray(table.eos_ids, dtype=np.int64)
        self.eos_accept_any = (table.eos_accept.any(axis=1) if len(self.eos)
                               else np.zeros(self.dfa.num_states, dtype=bool))
        self._distance = self._distance_to_end()
        self._memo: dict[tuple[int, int, int, int], bool] = {}
        self._successors: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._expanded = 0

    # ------------------------------------------------------------------ structure of A
    def _distance_to_end(self) -> np.ndarray:
        """Tokens from each state of A to one where the text may end (EOS-accepting, or
        accepting without EOS ids): a shortest-first order for witness searches."""
        d, S = self.dfa, self.dfa.num_states
        goal = self.eos_accept_any if len(self.eos) else d.accepting
        dist = np.where(goal, 0, np.iinfo(np.int64).max // 2).astype(np.int64)
        exc = self.table.exc
        for _ in range(S):
            via = np.full(S, dist.max(), dtype=np.int64)
            if len(exc.src):
                np.minimum.at(via, exc.src, dist[exc.dst])
            via = np.where(self.table.has_default, np.minimum(via, dist[d.default]), via)
            new = np.minimum(dist, via + 1)
            if np.array_equal(new, dist):
                break
            dist = new
        return dist

    def successors(self, q: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, next states) of A's live non-EOS transitions from ``q``, nearest end first."""
        got = self._successors.get(q)
        if got is None:
            V = self.vocab_size
            tokens = np.arange(V, dtype=np.int64)
            nxt = self.dfa.step_many(np.full(V, q, dtype=np.int64), tokens)
            keep = self.table.feasible[self.table.max_new_tokens, nxt] | self.dfa.accepting[nxt]
            keep[self.eos] = False
            tokens, nxt = tokens[keep], nxt[keep]
            order = np.argsort(self._distance[nxt], kind="stable")
            got = self._successors[q] = (tokens[order], nxt[order])
        return got

    @property
    def vocab_size(self) -> int:
        return self.dfa.vocab_size

    def row_state(self, q: int, generated: list[int]) -> tuple[int, int, int]:
        """σ = (q, last token, its flag) of a row in A-state ``q`` that generated ``generated``."""
        if not generated:
            return q, START, FREE
        last = int(generated[-1])
        before = START if len(generated) == 1 else int(generated[-2])
        flag = int(token_verdicts(self.checker, before, FREE, last))
        return q, last, flag

    def check_satisfiable(self) -> None:
        """Raise UnsatisfiableConstraintError unless a canonical accepted sequence fits the budget."""
        if not self.feasible(self.dfa.initial, START, FREE, self.table.max_new_tokens):
            raise UnsatisfiableConstraintError(
                f"the {self.constraint.what} has no canonical tokenization of at most "
                f"max_new_tokens={self.table.max_new_tokens} tokens (min_new_tokens="
                f"{self.table.min_new_tokens}) here")

    # ------------------------------------------------------------------ C_r(σ)
    def feasible(self, q: int, last: int, flag: int, r: int) -> bool:
        """``C_r((q, last, flag))`` (module docstring), memoised."""
        key = (int(q), int(last), int(flag), int(r))
        got = self._memo.get(key)
        if got is None:
            self._expanded = 0
            got = self._search(*key)
        return got

    def _search(self, q: int, last: int, flag: int, r: int) -> bool:
        key = (q, last, flag, r)
        got = self._memo.get(key)
        if got is not None:
            return got
        table = self.table
        if r == 0:
            got = bool(self.dfa.accepting[q] and end_allowed(flag))
        elif not table.feasible[r, q]:
            got = False
        elif end_allowed(flag) and table.eos_allowed(r) and self.eos_accept_any[q]:
            got = True
        else:
            got = self._witness(q, last, flag, r)
        self._memo[key] = got
        return got

    def _witness(self, q: int, last: int, flag: int, r: int) -> bool:
        """Whether some token v continues σ canonically with C_{r-1} after it (depth first)."""
        tokens, nxt = self.successors(q)
        live = self.table.feasible[r - 1, nxt]
        tokens, nxt = tokens[live], nxt[live]
        start = 0
        for size in _CHUNKS + (len(tokens),):
            end = min(len(tokens), max(start, size))
            if end <= start:
                continue
            chunk, chunk_next = tokens[start:end], nxt[start:end]
            self._count(end - start)
            verdicts = token_verdicts(self.checker, last, flag, chunk)
            for k in np.flatnonzero(verdicts != REJECT):
                if self._search(int(chunk_next[k]), int(chunk[k]), int(verdicts[k]), r - 1):
                    return True
            start = end
            if start >= len(tokens):
                break
        return False

    def _count(self, n: int) -> None:
        self._expanded += n
        if self._expanded > self.max_expansions:
            raise ConstraintError(
                f"deciding whether a canonical completion of {self.constraint.what} exists took "
                f"more than max_expansions={self.max_expansions} token checks; use "
                f"encodings='all' for this pattern")

    # ------------------------------------------------------------------ masks
    def token_mask(self, q: int, last: int, flag: int, remaining: int) -> np.ndarray:
        """Exact bool mask [V] of σ = (q, last, flag) with ``remaining`` tokens left (v included):
        v keeps a canonical accepted completion within the budget."""
        table = self.table
        base = table.token_feasible(np.array([q]), np.array([remaining])).numpy()[0]
        out = np.zeros(self.vocab_size, dtype=bool)
        if len(self.eos):
            out[self.eos] = base[self.eos] & bool(end_allowed(flag))
            base[self.eos] = False
        cand = np.flatnonzero(base)
        if not len(cand):
            return out
        verdicts = token_verdicts(self.checker, last, flag, cand)
        ok = verdicts != REJECT
        cand, verdicts = cand[ok], verdicts[ok]
        nxt = self.dfa.step_many(np.full(len(cand), q, dtype=np.int64), cand)
        out[cand[self._continues(cand, nxt, verdicts, remaining - 1)]] = True
        return out

    def _continues(self, cand: np.ndarray, nxt: np.ndarray, flags: np.ndarray, r: int) -> np.ndarray:
        """Bool per candidate: ``C_r((nxt, cand, flags))``, in groups (module docstring)."""
        if r == 0:
            return self.dfa.accepting[nxt] & end_allowed(flags)
        done = (end_allowed(flags) & self.eos_accept_any[nxt] & self.table.eos_allowed(r)
                & self.table.feasible[r, nxt])
        todo = np.flatnonzero(~done & self.table.feasible[r, nxt])
        keys = nxt[todo] * 4 + flags[todo]
        order = np.argsort(keys, kind="stable")
        todo, keys = todo[order], keys[order]
        bounds = np.flatnonzero(np.diff(keys)) + 1
        for members in np.split(todo, bounds) if len(todo) else []:
            q2, f2 = int(nxt[members[0]]), int(flags[members[0]])
            state = self._settle_group(cand[members], q2, f2, r)
            done[members[state == 1]] = True
            for i in members[state < 0].tolist():
                self._expanded = 0
                done[i] = self._search(q2, int(cand[i]), f2, r)
        return done

    def _settle_group(self, lasts: np.ndarray, q: int, flag: int, r: int) -> np.ndarray:
        """For candidates ``lasts`` that all reach (q, ·, flag): int8 per candidate, 1 where
        ``C_r`` holds and −1 where the group pass did not decide it. The pass tries q's first
        promising successors w, with one vectorised pair verdict ``(lasts, w)`` and one
        memoised ``C_{r-1}`` after w per resulting flag."""
        state = np.full(len(lasts), -1, dtype=np.int8)
        tokens, nxt = self.successors(q)
        tried = 0
        for k in np.flatnonzero(self.table.feasible[r - 1, nxt]):
            w, q3 = int(tokens[k]), int(nxt[k])
            idx = np.flatnonzero(state < 0)
            if not len(idx) or tried >= _GROUP_TRIES:
                break
            if self.checker.singles_array(np.array([w]))[0] == REJECT:
                continue                      # never the start of a text: rarely a witness
            tried += 1
            verdicts = token_verdicts(self.checker, lasts[idx], flag, w)
            for g in np.unique(verdicts[verdicts != REJECT]).tolist():
                self._expanded = 0
                if self._search(int(q3), int(w), int(g), r - 1):
                    state[idx[verdicts == g]] = 1
        return state

