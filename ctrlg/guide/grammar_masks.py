"""Exact token masks of a context-free grammar under a length budget.

A row's cursor is its Earley set ``c`` (:mod:`ctrlg.dfa.cfg.earley`; the whole parse hangs off it)
and its state ``q`` in the regular superset's token DFA A (:mod:`ctrlg.dfa.cfg.approximation`).
With EOS terminal (allowed once ``min_new_tokens`` tokens exist), the grammar's feasibility
mirrors :class:`~ctrlg.guide.feasibility.Feasibility`'s ``F_r`` on the parse::

    G_0(c) = accepting(c),
    G_r(c) = [accepting(c) ∧ EOS allowed at r] ∨ ∃ v ≠ EOS: G_{r-1}(c · v),

and the mask of ``(c, q)`` with r tokens left keeps exactly the v with ``G_{r-1}(c · v)`` (EOS:
the bracket). Since ``L(G) ⊆ L(A)``, ``G_r(c) ⇒ F_r(q)``: A's table prunes every query.

Per mask, for every candidate v that A allows, one pass computes from ``c`` at once (vectorised
over tokens, :class:`~ctrlg.dfa.cfg.token_index.TokenIndex`):

* *viability* — some path of the recogniser consumes all of v's bytes: a terminal thread
  ``(t, s, o)`` of ``c`` either stays alive to the end of v (``final ≠ 0``) or ends after k of its
  bytes (a completion pair), after which the remaining suffix must be viable from the set
  ``c'(t, o)`` that follows t's completion — the same recursion on shorter suffixes, once per
  distinct ``(t, o)`` (memoised on the origin set, so rows and steps share them);
* an *upper bound* on the tokens still needed after v: the byte cost of the cheapest completion
  (``dist_t`` of the thread's final state plus the cost to finish everything above t, from the
  rules' cheapest completions ``rest`` and the chart, memoised per set), valid because every byte
  it counts is a token on its own.

A viable v whose bound fits (``≤ r − 1``, with room for EOS) is allowed. A viable v whose bound
does not fit (only in the last tokens of a budget) is decided exactly: first A's own shortest
completion from ``δ_A(q, v)`` is tried as a witness (walked through the recogniser: when A is
exact there, as it is within the unrolled depth, it parses), then, if it does not parse, a
depth-first search for a completion within ``r − 1`` tokens with A's table pruning and the bound
accepting early (:meth:`GrammarFeasibility.feasible`). The searches of one mask expand at most
``max_expansions`` sets and cost at most ``max_search_work`` candidate tokens in all: each
expansion computes the costs of every token A's table still allows, so over a coarse superset
such as R_1, which prunes little, one expansion costs the whole vocabulary and a budget's last
masks would run hundreds of them. Past either bound a search is abandoned and its token left out
of the mask (counted in ``undecided``, with one warning): the mask then stays sound — every
token it keeps has a completion — but may miss a token that had one; at the start of a
generation it is an error. Cost per mask: one gather per thread and candidate plus the
completion pairs of the threads' terminals — O(threads · V) vectorised — and the byte-by-byte
step of the chosen token (O(items) per byte) to advance the cursor.
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np

from ctrlg.dfa.cfg.constraint import GrammarConstraint
from ctrlg.dfa.cfg.earley import DEAD, EarleySet, completion_effect
from ctrlg.dfa.cfg.token_index import INF
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility

__all__ = ["GrammarFeasibility", "ENDED", "signature"]

#: The cursor of a row that emitted EOS.
ENDED = EarleySet()
#: candidate tokens the exact searches of one mask may cost in all (:class:`GrammarFeasibility`):
#: about five expansions over SmolLM2's whole vocabulary, where a coarse superset prunes nothing
MAX_SEARCH_WORK = 262_144
#: what deciding one group of tokens costs against that bound before any expansion (its
#: representative's bytes through the parser and the two witnesses: ≈ 0.3 ms, as ~1,000
#: candidates' costs)
DECISION_WORK = 1024
#: per-configuration costs kept by :meth:`GrammarFeasibility.candidate_costs`, each 10 + 4 ×
#: (the set's threads) bytes per candidate token: ≈ 1.3 MB for 49,152 candidates and 5 threads
MAX_MEMOISED_COSTS = 32


class _SearchTooLong(Exception):
    """An exact search expanded more than ``max_expansions`` sets."""


def signature(s: EarleySet):
    """A key that two sets share iff they have the same future: the same threads and rule items
    started elsewhere (their own predictions follow from those) and the same acceptance. Gap
    tokens that lead to one configuration (say, any letters continuing a name) are decided once."""
    got = s.cache.get("signature")
    if got is None:
        threads = frozenset((t, q, 0 if o is s else id(o)) for t, q, o in s.threads)
        items = frozenset((r, d, id(o)) for waiting in (s.waiting, s.waiting_t)
                          for group in waiting.values() for r, d, o in group if o is not s)
        got = s.cache["signature"] = (threads, items, s.accepting)
    return got


class GrammarFeasibility:
    """Decode-time masks of a :class:`GrammarConstraint` (module docstring) on top of the
    feasibility (or guide) table ``table`` of its regular superset A (same budget and EOS ids).

    Args:
        table: A's table; ``table.dfa`` is A restricted to the budget.
        constraint: the grammar constraint.
        max_expansions: bound on the sets the exact searches of one mask may expand in all.
        max_search_work: bound on the candidate tokens those expansions may cost in all (each
            expansion computes the costs of every token the table still allows).
    """

    def __init__(self, table: Feasibility, constraint: GrammarConstraint, *,
                 max_expansions: int = 256, max_search_work: int = MAX_SEARCH_WORK):
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
        self.max_search_work = int(max_search_work)
        self._expanded = self._work = 0
        self.undecided = 0
        self._completed: dict = {}
        self._costs_memo: dict = {}
        self.memo_hits = 0
        F = table.feasible                          # A's distance to acceptance, in tokens
        self._distance = np.where(F.any(0), F.argmax(0), np.iinfo(np.int64).max // 4)

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
        self._expanded = self._work = 0
        try:
            ok = self.string_witness(self.start(), n) or \
                self.feasible(self.start(), self.table.dfa.initial, n, {})
        except _SearchTooLong:
            raise ConstraintError(
                f"deciding whether the {self.constraint.what} has a sentence of at most "
                f"max_new_tokens={n} tokens took more than max_expansions={self.max_expansions} "
                f"parser states or max_search_work={self.max_search_work} candidate tokens; "
                f"raise max_new_tokens") from None
        if not ok:
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
        ids, viable, cost, finals, paired = self.candidate_costs(s, base & self.has_bytes)
        if not len(ids):
            return out
        fits = self._fits(cost, remaining - 1)
        out[ids[viable & fits]] = True
        gap = np.flatnonzero(viable & ~fits)
        if len(gap):
            self._expanded = self._work = 0
            out[ids[gap]] = self._decide_gaps(s, q, ids[gap], finals[:, gap], paired[gap],
                                              remaining - 1, cost=cost[gap])
        return out

    def _decide_gaps(self, s: EarleySet, q: int, tokens: np.ndarray, finals: np.ndarray,
                     paired: np.ndarray, k: int, decided: dict | None = None,
                     cost: np.ndarray | None = None, first_true: bool = False) -> np.ndarray:
        """``G_k(s · v)`` for viable tokens whose bound does not fit. Tokens that only continue
        threads (no terminal ends inside them) and end in the same thread states and A-state
        have the same future: one representative decides for all; the others are decided once
        per distinct :func:`signature` of the set they lead to (``decided``, shared by a whole
        mask computation). Cheapest bound first; with ``first_true`` it stops at the first
        feasible token (a search only needs one)."""
        decided = {} if decided is None else decided
        top = not first_true
        nxt = self.table.dfa.step_many(np.full(len(tokens), q, dtype=np.int64), tokens)
        out = np.zeros(len(tokens), dtype=bool)
        keys = np.concatenate([finals.T, nxt[:, None], paired[:, None] * np.arange(len(tokens))[:, None]],
                              axis=1)
        _, first, group = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        group = group.reshape(-1)
        if cost is not None:
            first = first[np.argsort(cost[first], kind="stable")]
        for i in first.tolist():
            verdict = self._decide(s, int(tokens[i]), int(nxt[i]), k, decided, top)
            if verdict:
                out[group == group[i]] = True
                if first_true:
                    return out
        return out

    def _decide(self, s: EarleySet, v: int, q2: int, k: int, decided: dict, top: bool) -> bool:
        if self._work >= self.max_search_work:       # the mask's search budget is spent
            if not top:
                raise _SearchTooLong(k)
            self._leave_out(k)
            return False
        self._work += DECISION_WORK                   # the token's bytes through the parser
        s2 = self.advance(s, v)
        key = (signature(s2), q2, k)
        if key not in decided:
            try:                     # the mask's searches share one budget (token_mask)
                decided[key] = self.string_witness(s2, k) or \
                    self.automaton_witness(s2, q2, k) or self.feasible(s2, q2, k, decided)
            except _SearchTooLong:
                if not top:          # the search above this one is abandoned with it
                    raise
                decided[key] = False
                self._leave_out(k)
        return decided[key]

    def _leave_out(self, k: int) -> None:
        """Count a token left out undecided (warned once)."""
        self.undecided += 1
        if self.undecided == 1:
            warnings.warn(f"the {self.constraint.what}: deciding whether some tokens can still "
                          f"end within {k} tokens took more than max_expansions="
                          f"{self.max_expansions} parser states or max_search_work="
                          f"{self.max_search_work} candidate tokens; they are left out of the "
                          f"mask (sound, possibly not exact)", RuntimeWarning, stacklevel=3)

    def automaton_witness(self, s: EarleySet, q: int, k: int) -> bool:
        """Whether A's shortest completion from ``q`` (ties: the first token) parses from ``s``
        within ``k`` tokens: a sufficient condition for ``G_k(s)``, cheap to test."""
        dfa, table = self.table.dfa, self.table
        while s is not DEAD:
            if s.accepting and (k == 0 or table.eos_allowed(k)):
                return True
            if k == 0 or not table.feasible[k, q]:
                return False
            ids = np.flatnonzero(table.token_feasible(np.array([q]), np.array([k])).numpy()[0]
                                 & self.has_bytes)
            if not len(ids):
                return False
            nxt = dfa.step_many(np.full(len(ids), q, dtype=np.int64), ids)
            v = int(ids[np.argmin(self._distance[nxt])])
            s, q, k = self.advance(s, v), int(dfa.step(q, v)), k - 1
        return False

    def _fits(self, cost: np.ndarray, k: int) -> np.ndarray:
        """Whether a completion of ``cost`` tokens, then EOS (or the end of the budget), fits in
        ``k`` tokens."""
        n, lo = self.table.max_new_tokens, self.table.min_new_tokens
        after = k - cost                       # tokens left once the completion is spelled
        return (after == 0) | ((after >= 1) & (n - after >= lo))

    def feasible(self, s: EarleySet, q: int, k: int, decided: dict | None = None) -> bool:
        """``G_k(s)`` (module docstring) for a row in A-state ``q``: exact, by depth-first search
        (at k = 1 the bound is exact: a cost of 0 is a token after which the set accepts)."""
        if s is DEAD:
            return False
        if s.accepting and (k == 0 or self.table.eos_allowed(k)):
            return True
        if k == 0 or not self.table.feasible[k, q]:
            return False
        self._expanded += 1
        base = self.table.token_feasible(np.array([q]), np.array([k])).numpy()[0]
        candidates = base & self.has_bytes
        self._work += int(candidates.sum())
        if self._expanded > self.max_expansions or self._work > self.max_search_work:
            raise _SearchTooLong(k)
        ids, viable, cost, finals, paired = self.candidate_costs(s, candidates)
        if not len(ids):
            return False
        if (viable & self._fits(cost, k - 1)).any():
            return True
        if k == 1 or not viable.any():
            return False
        keep = np.flatnonzero(viable)
        return bool(self._decide_gaps(s, q, ids[keep], finals[:, keep], paired[keep], k - 1,
                                      decided, cost[keep], first_true=True).any())

    # ------------------------------------------------------------------ viability and costs
    def candidate_costs(self, s: EarleySet, candidates: np.ndarray):
        """``(ids, viable, cost, finals, paired)``: :meth:`costs` with ``detail`` of the tokens
        ``ids`` where the bool mask ``candidates`` holds, memoised by the set's
        :func:`signature` and the candidates (a digest of the mask). Sets with one signature
        have the same future, so the same costs: a generation that comes back to a
        configuration (the inside of a JSON string, the next member of an object) computes its
        costs once. The memo keeps each entry's set, and so the origin sets whose ids the
        signature holds, alive; it holds :data:`MAX_MEMOISED_COSTS` entries, oldest out first."""
        key = (signature(s), hashlib.blake2b(np.packbits(candidates).tobytes(),
                                             digest_size=16).digest())
        ids = np.flatnonzero(candidates)
        got = self._costs_memo.get(key)
        if got is None:
            got = (s, *(self.costs(s, ids, detail=True) if len(ids) else (None,) * 4))
            for a in got[1:]:
                if a is not None:
                    a.setflags(write=False)
            if MAX_MEMOISED_COSTS > 0:
                if len(self._costs_memo) >= MAX_MEMOISED_COSTS:
                    del self._costs_memo[next(iter(self._costs_memo))]
                self._costs_memo[key] = got
        else:
            self.memo_hits += 1
        return (ids, *got[1:])

    def costs(self, s: EarleySet, tokens: np.ndarray, detail: bool = False):
        """(viable bool, cost int64) of each of ``tokens`` after the set ``s`` (module
        docstring); with ``detail`` also each thread's final state per token ([threads, n]) and
        whether a terminal ends inside the token."""
        viable = np.zeros(len(tokens), dtype=bool)
        cost = np.full(len(tokens), INF, dtype=np.int64)
        starts = self.index.base[tokens]
        finals = np.zeros((len(s.threads), len(tokens)), dtype=np.int32)
        paired = np.zeros(len(tokens), dtype=bool)
        for j, (t, state, origin) in enumerate(s.threads):
            if state == self.rec.initial[t]:
                run, entries = self.index.start_run(t), starts
            else:
                run, entries = self.index.state_run(t, state), tokens
            finals[j], where = self._thread(run, entries, t, origin, viable, cost)
            paired[where] = True
        return (viable, cost, finals, paired) if detail else (viable, cost)

    def _suffix_costs(self, s: EarleySet, suffixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`costs` for token suffixes (a set reached inside a token: threads all start).
        Suffixes are deduplicated first: the splits of a run of ignored or repeatable bytes
        into terminals are exponentially many paths but only quadratically many suffixes."""
        unique, back = np.unique(suffixes, return_inverse=True)
        if len(unique) < len(suffixes):
            viable, cost = self._suffix_costs(s, unique)
            return viable[back.reshape(-1)], cost[back.reshape(-1)]
        loops = [t for t, _, origin in s.threads if self.completed(t, origin) is s]
        if loops:
            return self._looping_suffix_costs(s, suffixes, loops)
        viable = np.zeros(len(suffixes), dtype=bool)
        cost = np.full(len(suffixes), INF, dtype=np.int64)
        for t, _, origin in s.threads:
            self._thread(self.index.start_run(t), suffixes, t, origin, viable, cost)
        return viable, cost

    def _looping_suffix_costs(self, s: EarleySet, suffixes: np.ndarray, loops: list[int]
                              ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_suffix_costs` when completing some terminals leads back to ``s`` itself (a
        run of ignored whitespace): every suffix those completions reach is solved together,
        shortest first (a completion pair always points to a shorter suffix), instead of one
        recursion level per byte of the run."""
        runs = [self.index.start_run(t) for t in loops]
        mark = np.zeros(self.index.num_suffixes, dtype=bool)   # the suffixes the loops reach
        mark[suffixes] = True
        frontier = suffixes
        while len(frontier):
            reached = np.concatenate([run.pairs(frontier)[1] for run in runs])
            frontier = np.unique(reached[~mark[reached]])
            mark[frontier] = True
        every = np.flatnonzero(mark)
        viable = np.zeros(len(every), dtype=bool)
        cost = np.full(len(every), INF, dtype=np.int64)
        for t, _, origin in s.threads:
            if t in loops:
                self._alive(self.index.start_run(t), every, t, origin, viable, cost)
            else:
                self._thread(self.index.start_run(t), every, t, origin, viable, cost)
        pairs = [run.pairs(every) for run in runs]
        where = np.concatenate([w for w, _ in pairs])
        dst = np.searchsorted(every, np.concatenate([d for _, d in pairs]))
        fold_shorter_first(where, dst, self.index.suffix_left[every[where]], viable, cost)
        at = np.searchsorted(every, suffixes)
        return viable[at], cost[at]

    def _thread(self, run, entries: np.ndarray, t: int, origin: EarleySet, viable: np.ndarray,
                cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fold one thread's contribution for ``entries`` into ``viable`` / ``cost``; returns
        the thread's final states and the entries where t ends inside with a viable rest."""
        final = self._alive(run, entries, t, origin, viable, cost)
        where, dst = run.pairs(entries)
        if len(where):
            nxt = self.completed(t, origin)
            sub_viable, sub_cost = self._suffix_costs(nxt, dst)
            fold(where, sub_viable, sub_cost, viable, cost)
            where = where[sub_viable]
        return final, where

    def _alive(self, run, entries: np.ndarray, t: int, origin: EarleySet, viable: np.ndarray,
               cost: np.ndarray) -> np.ndarray:
        """The part of :meth:`_thread` where t's DFA is still alive at the end of the entry."""
        final = run.final[entries]
        alive = final != 0
        if alive.any():
            viable |= alive
            after = self.after_terminal(t, origin)
            if after < INF:
                c = np.minimum(self.index.dist[t][final[alive]], INF) + after
                cost[alive] = np.minimum(cost[alive], c)
        return final

    def completed(self, t: int, origin: EarleySet) -> EarleySet:
        """The set right after terminal ``t`` started in ``origin`` completes. It depends only on
        the items of ``origin`` waiting on t (:func:`completion_effect`), so origins with the same
        ones share it: a run of ignored whitespace keeps coming back to one set."""
        key = ("completed", t)
        got = origin.cache.get(key)
        if got is None:
            shared = (t, completion_effect(origin, t))
            got = self._completed.get(shared)
            if got is None:
                got = self._completed[shared] = self.rec.complete_terminal(t, origin)
            origin.cache[key] = got
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
        best: dict[int, tuple] = {}
        inner = []
        for a, items in s.waiting.items():
            for r, d, o2 in items:
                if o2 is s:
                    inner.append((a, r, d))
                    continue
                c = rest[r][d + 1] + self.after_nonterminal(o2).get(lhs[r], INF)
                if c < cost[a]:
                    cost[a], best[a] = c, (r, d, o2)
        changed = True
        while changed:
            changed = False
            for a, r, d in inner:
                c = rest[r][d + 1] + cost.get(lhs[r], INF)
                if c < cost[a]:
                    cost[a], best[a], changed = c, (r, d, s), True
        s.cache["after_nt"], s.cache["after_nt_best"] = cost, best
        return cost

    # ------------------------------------------------------------------ cheapest completions
    def completion_string(self, s: EarleySet) -> bytes | None:
        """The bytes of a cheapest completion of ``s`` (None when none is spelled by
        single-byte tokens): the cost bound's own witness."""
        if s.accepting:
            return b""
        best, best_cost = None, INF
        for t, q, o in s.threads:
            c = self.index.dist[t][q] + self.after_terminal(t, o)
            if c < best_cost:
                best, best_cost = (t, q, o), c
        if best is None:
            return None
        t, q, o = best
        out = [self.index.terminal_tail(t, q)]
        rest, lhs = self.index.rest, self.rec.lhs
        items = o.waiting_t.get(t, ())
        r, d, o2 = min(items, key=lambda i: rest[i[0]][i[1] + 1]
                       + self.after_nonterminal(i[2]).get(lhs[i[0]], INF))
        while True:
            out.append(self.index.rest_string(r, d + 1))
            a = lhs[r]
            if a == self.rec.grammar.start:
                return b"".join(out)
            self.after_nonterminal(o2)
            r, d, o2 = o2.cache["after_nt_best"][a]

    def string_witness(self, s: EarleySet, k: int) -> bool:
        """Whether the cheapest completion of ``s``, spelled with the fewest tokens, fits in
        ``k`` tokens (then EOS): a sufficient condition for ``G_k(s)``, tighter than the byte
        bound wherever tokens span several bytes (``":``, ``}]``)."""
        if s is DEAD:
            return False
        data = self.completion_string(s)
        if data is None:
            return False
        return bool(self._fits(np.array([self.index.min_tokens(data)]), k)[0])


# ---------------------------------------------------------------------- folds (compiled)
def _fold_py(where, sub_viable, sub_cost, viable, cost):
    """``viable[where[k]] |= sub_viable[k]`` and ``cost[where[k]] = min(cost[where[k]],
    sub_cost[k])`` for every k (``np.logical_or.at`` / ``np.minimum.at`` in one loop)."""
    for k in range(where.shape[0]):
        w = where[k]
        if sub_viable[k]:
            viable[w] = True
        if sub_cost[k] < cost[w]:
            cost[w] = sub_cost[k]


def _fold_shorter_first_py(where, dst, length, viable, cost):
    """For every pair k, in increasing ``length[k]`` (a counting sort): ``viable[where[k]] |=
    viable[dst[k]]`` and ``cost[where[k]] = min(cost[where[k]], cost[dst[k]])``. Each pair
    points from a suffix of ``length[k]`` bytes to a strictly shorter one, so a suffix's value
    is final before a longer one reads it: the per-length passes of ``ufunc.at`` in one loop."""
    n = where.shape[0]
    if n == 0:
        return
    top = 0
    for k in range(n):
        if length[k] > top:
            top = length[k]
    start = np.zeros(top + 2, dtype=np.int64)
    for k in range(n):
        start[length[k] + 1] += 1
    for L in range(top + 1):
        start[L + 1] += start[L]
    order = np.empty(n, dtype=np.int64)
    for k in range(n):
        order[start[length[k]]] = k
        start[length[k]] += 1
    for j in range(n):
        k = order[j]
        w, d = where[k], dst[k]
        if viable[d]:
            viable[w] = True
        if cost[d] < cost[w]:
            cost[w] = cost[d]


try:   # compiled loops when numba is installed; the same functions in Python otherwise
    import numba as _numba
    fold = _numba.njit(cache=True, nogil=True)(_fold_py)
    fold_shorter_first = _numba.njit(cache=True, nogil=True)(_fold_shorter_first_py)
except ImportError:  # pragma: no cover - numba is a dependency; kept for odd platforms
    fold, fold_shorter_first = _fold_py, _fold_shorter_first_py
