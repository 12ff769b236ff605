"""Exact token masks of a context-free grammar under a length budget.

A row's cursor is its Earley set ``c`` (:mod:`ctrlg.cfg.earley`; the whole parse hangs off it)
and its state ``q`` in the regular superset's token DFA A (:mod:`ctrlg.cfg.approximation`).
With EOS terminal (allowed once ``min_new_tokens`` tokens exist), the grammar's feasibility
mirrors :class:`~ctrlg.guide.feasibility.Feasibility`'s ``F_r`` on the parse::

    G_0(c) = accepting(c),
    G_r(c) = [accepting(c) ∧ EOS allowed at r] ∨ ∃ v ≠ EOS: G_{r-1}(c · v),

and the mask of ``(c, q)`` with r tokens left keeps exactly the v with ``G_{r-1}(c · v)`` (EOS:
the bracket). Since ``L(G) ⊆ L(A)``, ``G_r(c) ⇒ F_r(q)``: A's table prunes every query.

Per mask, for every candidate v that A allows, one pass computes from ``c`` at once (vectorised
over tokens, :class:`~ctrlg.cfg.token_index.TokenIndex`):

* *viability* — some path of the recogniser consumes all of v's bytes: a terminal thread
  ``(t, s, o)`` of ``c`` either stays alive to the end of v (``final ≠ 0``) or ends after k of its
  bytes (a completion pair), after which the remaining suffix must be viable from the set
  ``c'(t, o)`` that follows t's completion — the same recursion on shorter suffixes, once per
  distinct ``(t, o)`` (memoised on the origin set, so rows and steps share them);
* an *upper bound* on the tokens still needed after v: the byte cost of the cheapest completion
  (``dist_t`` of the thread's final state plus the cost to finish everything above t, from the
  rules' cheapest completions ``rest`` and the chart, memoised per set), valid because every byte
  it counts is a token on its own.

A viable v whose bound fits (``≤ r − 1``, with room for EOS) is allowed; a viable v whose bound
does not fit is decided exactly by a depth-first search for a completion within ``r − 1`` tokens,
A's table pruning, the bound accepting early (:meth:`GrammarFeasibility.feasible`): it happens
only in the last few tokens of a budget, and a search that expands more than ``max_expansions``
sets raises ConstraintError instead of running on. Cost per mask: one gather per thread and
candidate plus the completion pairs of the threads' terminals — O(threads · V) vectorised — and
the byte-by-byte step of the chosen token (O(items) per byte) to advance the cursor.
"""

from __future__ import annotations

import numpy as np

from ctrlg.cfg.constraint import GrammarConstraint
from ctrlg.cfg.earley import DEAD, EarleySet
from ctrlg.cfg.token_index import INF
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility

__all__ = ["GrammarFeasibility", "ENDED"]

#: The cursor of a row that emitted EOS.
ENDED = EarleySet()


class GrammarFeasibility:
    """Decode-time masks of a :class:`GrammarConstraint` (module docstring) on top of the
    feasibility (or guide) table ``table`` of its regular superset A (same budget and EOS ids).

    Args:
        table: A's table; ``table.dfa`` is A restricted to the budget.
        constraint: the grammar constraint.
        max_expansions: bound on the sets one exact search may expand.
    """

    def __init__(self, table: Feasibility, constraint: GrammarConstraint, *,
                 max_expansions: int = 2_000):
        if not table.eos_ids:
            raise ConstraintError(
                f"the {constraint.what} needs an EOS token: a sentence ends where EOS is emitted "
                f"(pass eos_token_id to the processor and to dfa.grammar)")
        self.table, self.constraint = table, constraint
        self.rec, self.index = constraint.recogniser, constraint.index
        self.eos = np.asarray(table.eos_ids, dtype=np.int64)
        self.has_bytes = self.index.length > 0
        self.has_bytes[self.eos] = False
        self.max_expansions = int(max_expansions)
        self._expanded = 0

    @property
    def vocab_size(self) -> int:
        return self.table.vocab_size

    # ------------------------------------------------------------------ cursors
    def start(self) -> EarleySet:
        return self.rec.start()

    def advance(self, s: EarleySet, token: int) -> EarleySet:
        """The set after ``token`` (``ENDED`` after EOS, ``DEAD`` when the bytes do not parse)."""
        if s is DEAD or s is ENDED or token in self.table.eos_ids:
            return ENDED if token in self.table.eos_ids and s is not DEAD else DEAD
        data = self.index.token_bytes[token] if token < len(self.index.token_bytes) else b""
        return self.rec.feed(s, data) if data else DEAD

    def check_satisfiable(self) -> None:
        """Raise UnsatisfiableConstraintError unless a sentence fits the budget."""
        n = self.table.max_new_tokens
        self._expanded = 0
        if not self.feasible(self.start(), self.table.dfa.initial, n):
            raise UnsatisfiableConstraintError(
                f"the {self.constraint.what} has no sentence of at most max_new_tokens={n} "
                f"tokens (min_new_tokens={self.table.min_new_tokens}); raise max_new_tokens")

    # ------------------------------------------------------------------ masks
    def token_mask(self, s: EarleySet, q: int, remaining: int) -> np.ndarray:
        """Exact bool mask [V] of the row with Earley set ``s`` and A-state ``q`` when
        ``remaining`` tokens are left (the next one included)."""
        out = np.zeros(self.vocab_size, dtype=bool)
        if s is DEAD or s is ENDED:
            return out
        base = self.table.token_feasible(np.array([q]), np.array([remaining])).numpy()[0]
        out[self.eos] = base[self.eos] & s.accepting
        ids = np.flatnonzero(base & self.has_bytes)
        if not len(ids):
            return out
        viable, cost = self.costs(s, ids)
        fits = self._fits(cost, remaining - 1)
        out[ids[viable & fits]] = True
        for v in ids[viable & ~fits].tolist():
            self._expanded = 0
            out[v] = self.feasible(self.advance(s, v), int(self.table.dfa.step(q, v)), remaining - 1)
        return out

    def _fits(self, cost: np.ndarray, k: int) -> np.ndarray:
        """Whether a completion of ``cost`` tokens, then EOS (or the end of the budget), fits in
        ``k`` tokens."""
        n, lo = self.table.max_new_tokens, self.table.min_new_tokens
        after = k - cost                       # tokens left once the completion is spelled
        return (after == 0) | ((after >= 1) & (n - after >= lo))

    def feasible(self, s: EarleySet, q: int, k: int) -> bool:
        """``G_k(s)`` (module docstring) for a row in A-state ``q``: exact, by depth-first search."""
        if s is DEAD:
            return False
        if s.accepting and (k == 0 or self.table.eos_allowed(k)):
            return True
        if k == 0 or not self.table.feasible[k, q]:
            return False
        self._expanded += 1
        if self._expanded > self.max_expansions:
            raise ConstraintError(
                f"deciding whether the {self.constraint.what} can still end within {k} tokens "
                f"took more than max_expansions={self.max_expansions} parser states; raise "
                f"max_new_tokens or simplify the grammar")
        base = self.table.token_feasible(np.array([q]), np.array([k])).numpy()[0]
        ids = np.flatnonzero(base & self.has_bytes)
        viable, cost = self.costs(s, ids) if len(ids) else (np.zeros(0, bool), np.zeros(0, int))
        if (viable & self._fits(cost, k - 1)).any():
            return True
        order = np.argsort(cost[viable], kind="stable")
        for v in ids[viable][order].tolist():
            if self.feasible(self.advance(s, v), int(self.table.dfa.step(q, v)), k - 1):
                return True
        return False

    # ------------------------------------------------------------------ viability and costs
    def costs(self, s: EarleySet, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(viable bool, cost int64) of each of ``tokens`` after the set ``s`` (module docstring)."""
        viable = np.zeros(len(tokens), dtype=bool)
        cost = np.full(len(tokens), INF, dtype=np.int64)
        starts = self.index.base[tokens]
        for t, state, origin in s.threads:
            if state == self.rec.initial[t]:
                run, entries = self.index.start_run(t), starts
            else:
                run, entries = self.index.state_run(t, state), tokens
            self._thread(run, entries, t, origin, viable, cost)
        return viable, cost

    def _suffix_costs(self, s: EarleySet, suffixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`costs` for token suffixes (a set reached inside a token: threads all start)."""
        viable = np.zeros(len(suffixes), dtype=bool)
        cost = np.full(len(suffixes), INF, dtype=np.int64)
        for t, _, origin in s.threads:
            self._thread(self.index.start_run(t), suffixes, t, origin, viable, cost)
        return viable, cost

    def _thread(self, run, entries: np.ndarray, t: int, origin: EarleySet, viable: np.ndarray,
                cost: np.ndarray) -> None:
        """Fold one thread's contribution for ``entries`` into ``viable`` / ``cost``."""
        final = run.final[entries]
        alive = final != 0
        if alive.any():
            viable |= alive
            after = self.after_terminal(t, origin)
            if after < INF:
                c = np.minimum(self.index.dist[t][final[alive]], INF) + after
                cost[alive] = np.minimum(cost[alive], c)
        where, dst = run.pairs(entries)
        if len(where):
            nxt = self.completed(t, origin)
            sub_viable, sub_cost = self._suffix_costs(nxt, dst)
            np.logical_or.at(viable, where, sub_viable)
            np.minimum.at(cost, where, sub_cost)

    def completed(self, t: int, origin: EarleySet) -> EarleySet:
        """The set right after terminal ``t`` started in ``origin`` completes (memoised on it)."""
        key = ("completed", t)
        got = origin.cache.get(key)
        if got is None:
            got = origin.cache[key] = self.rec.complete_terminal(t, origin)
        return got

    def after_terminal(self, t: int, origin: EarleySet) -> int:
        """Byte cost to finish the sentence once terminal ``t`` (started in ``origin``) ends."""
        key = ("after", t)
        got = origin.cache.get(key)
        if got is None:
            rest, lhs = self.index.rest, self.rec.lhs
            got = INF
            for r, d, o2 in origin.waiting_t.get(t, ()):
                got = min(got, rest[r][d + 1] + self.after_nonterminal(o2).get(lhs[r], INF))
            origin.cache[key] = got = min(got, INF)
        return got

    def after_nonterminal(self, s: EarleySet) -> dict[int, int]:
        """Byte cost to finish the sentence once nonterminal A, started in ``s``, completes — for
        every A that items of ``s`` wait on (a fixed point over the items started in ``s``)."""
        got = s.cache.get("after_nt")
        if got is not None:
            return got
        rest, lhs = self.index.rest, self.rec.lhs
        cost: dict[int, int] = {a: INF for a in s.waiting}
        cost[self.rec.grammar.start] = 0           # the start rule completes: a sentence
        inner = []
        for a, items in s.waiting.items():
            for r, d, o2 in items:
                if o2 is s:
                    inner.append((a, rest[r][d + 1], lhs[r]))
                else:
                    cost[a] = min(cost[a], rest[r][d + 1] + self.after_nonterminal(o2).get(lhs[r], INF))
        changed = True
        while changed:
            changed = False
            for a, c, b in inner:
                if c + cost.get(b, INF) < cost[a]:
                    cost[a] = c + cost[b]
                    changed = True
        s.cache["after_nt"] = cost
        return cost
