"""Per grammar × vocabulary: every token *suffix* run through every terminal's byte DFA at once,
and the byte costs of completing a rule — the tables behind the grammar's token masks.

Suffixes. The bytes of all tokens are laid end to end; suffix id ``i`` is the tail of its token
that starts at byte ``i`` (so token v's full bytes are suffix ``base[v]``, and the suffix
``k`` bytes further is ``i + k``). For a terminal t and a start state q, one vectorised run over
a set of suffixes (one column of bytes at a time, dropping suffixes whose DFA died) gives

* ``final[i]``: t's DFA state after the whole suffix (0: it died), and
* the *completion pairs* ``(i, i + k)``: t's DFA is accepting after the suffix's first k bytes
  (``k <`` its length) — t may end there and the rest of the token continue after it.

Runs from t's initial state cover every suffix (a terminal starts wherever another ended inside
a token); runs from other states — a row stopped inside a terminal — only whole tokens, built
on first use. Cost of a run: the number of (suffix, byte) pairs that stay alive in t's DFA,
i.e. about the tokens that can continue t; memory: two int32 arrays per run.

Byte costs. ``w(b) = 1`` for bytes that are tokens on their own (∞ otherwise): a completion of
c such bytes can always be spelled with c tokens. ``dist[t][q]`` is the cheapest way to finish
terminal t from state q, ``min_len`` of each nonterminal its cheapest sentence and
``rest[r][d]`` the cheapest completion of rule r from its dot d (fixed points over the DFAs and
rules; ignored terminals are optional, so they cost nothing). The same fixed points give one
cheapest string per terminal state, nonterminal and rule tail (:meth:`TokenIndex.symbol_string`),
and :meth:`TokenIndex.min_tokens` spells a string with the fewest tokens.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from ctrlg.dfa.cfg.earley import Recogniser, single_byte_weights
from ctrlg.dfa.core import ragged_indices

__all__ = ["TokenIndex", "Suffixes", "Run", "INF"]

INF = np.iinfo(np.int64).max // 4
#: Terminals with at most this many DFA states get every state's run at compile time (the
#: others on first use).
PRECOMPUTED_STATES = 64
#: bytes of terminal runs one vocabulary keeps for all grammars (:meth:`Suffixes.shared_run`)
MAX_SHARED_RUN_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Run:
    """A terminal's DFA run over a query space (all suffixes, or whole tokens): ``final`` int32
    per query entry; completion pairs in CSR order over the entries: ``dst[ptr[i]:ptr[i+1]]``."""

    final: np.ndarray
    ptr: np.ndarray
    dst: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.final.nbytes + self.ptr.nbytes + self.dst.nbytes

    def pairs(self, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in ``entries``, destination suffix) of every completion pair of ``entries``."""
        lo, hi = self.ptr[entries], self.ptr[entries + 1]
        counts = hi - lo
        return np.repeat(np.arange(len(entries)), counts), self.dst[ragged_indices(lo, counts)]


@dataclass(frozen=True, eq=False)
class Suffixes:
    """What a vocabulary contributes to every grammar's index, built once per vocabulary
    (:meth:`of`): the token bytes laid end to end (``flat``; token v starts at ``base[v]`` and has
    ``length[v]`` bytes; ``suffix_left[i]``: the bytes left from suffix i to the end of its
    token), the single-byte weights ``w`` of the byte costs, and the set of distinct token
    strings with their lengths (:meth:`TokenIndex.min_tokens`)."""

    token_bytes: tuple
    length: np.ndarray
    base: np.ndarray
    flat: np.ndarray
    suffix_left: np.ndarray
    weight: np.ndarray
    tokens: frozenset
    token_lengths: tuple
    #: terminal runs over this vocabulary, by (terminal AST, start state or None for the run
    #: from the initial state over every suffix): shared by every grammar that has the terminal
    runs: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def num_suffixes(self) -> int:
        return int(self.base[-1])

    def forget_runs(self) -> None:
        """Drop the shared runs (a benchmark's cold start)."""
        with self._lock:
            self.runs.clear()

    def shared_run(self, key, compute) -> "Run":
        """The run stored under ``key``, or ``compute()`` stored (its arrays read-only; the
        oldest runs dropped first beyond :data:`MAX_SHARED_RUN_BYTES` in all)."""
        got = self.runs.get(key)
        if got is None:
            got = compute()
            for a in (got.final, got.ptr, got.dst):
                a.setflags(write=False)
            with self._lock:
                total = sum(run.nbytes for run in self.runs.values())
                while self.runs and total + got.nbytes > MAX_SHARED_RUN_BYTES:
                    total -= self.runs.pop(next(iter(self.runs))).nbytes
                self.runs[key] = got
        return got

    @classmethod
    def of(cls, token_bytes) -> "Suffixes":
        token_bytes = tuple(bytes(t) for t in token_bytes)
        length = np.fromiter(map(len, token_bytes), dtype=np.int64, count=len(token_bytes))
        base = np.zeros(len(length) + 1, dtype=np.int64)
        np.cumsum(length, out=base[1:])
        flat = np.frombuffer(b"".join(token_bytes), dtype=np.uint8).astype(np.int64)
        owner = np.repeat(np.arange(len(length)), length)
        suffix_left = base[owner + 1] - np.arange(int(base[-1]))
        tokens = frozenset(token_bytes) - {b""}
        weight = single_byte_weights(token_bytes)
        for shared in (length, base, flat, suffix_left, weight):
            shared.setflags(write=False)
        return cls(token_bytes, length, base, flat, suffix_left,
                   weight, tokens,
                   tuple(sorted({len(t) for t in tokens})))


class TokenIndex:
    """Suffix runs and byte costs of ``recogniser``'s grammar over ``token_bytes`` (module
    docstring).

    Args:
        recogniser: the grammar's Earley recogniser (its terminals' DFAs).
        token_bytes: the bytes of every token id, or their :class:`Suffixes` (shared by every
            grammar over the same vocabulary).
        precompute: compute every terminal's run over all suffixes, and the runs of the small
            terminals' states, now (``True``), or each on first use (``False``: a compile in
            milliseconds, the first masks that need a run pay for it).
    """

    def __init__(self, recogniser: Recogniser, token_bytes, *, precompute: bool = True):
        self.recogniser = recogniser
        vocabulary = token_bytes if isinstance(token_bytes, Suffixes) else Suffixes.of(token_bytes)
        self.vocabulary = vocabulary
        self.token_bytes = vocabulary.token_bytes
        self.length, self.base, self.flat = vocabulary.length, vocabulary.base, vocabulary.flat
        self.num_suffixes = vocabulary.num_suffixes
        self.suffix_left = vocabulary.suffix_left
        self._start_runs: dict[int, Run] = {}
        self._state_runs: dict[tuple[int, int], Run] = {}
        self._costs(vocabulary.weight)
        if not precompute:
            return
        for t, d in enumerate(recogniser.dfas):      # every terminal starts inside some token
            self.start_run(t)
            if d.num_states <= PRECOMPUTED_STATES:     # and rows stop inside small ones
                for q in np.flatnonzero(d.live()).tolist():
                    self.state_run(t, q)

    # ------------------------------------------------------------------ byte costs
    def _costs(self, weight: np.ndarray) -> None:
        rec = self.recogniser
        self.dist = [_distance_to_accept(d.table, d.accepting, weight) for d in rec.dfas]
        g = rec.grammar
        term_len = [int(min(d[rec.initial[t]], INF)) for t, d in enumerate(self.dist)]
        min_len = [INF] * len(g.nonterminals)
        changed = True
        while changed:
            changed = False
            for lhs, rhs in g.rules:
                c = sum(term_len[-1 - x] if x < 0 else min_len[x] for x in rhs)
                if c < min_len[lhs]:
                    min_len[lhs] = min(c, INF)
                    changed = True
        self.min_len = min_len
        self.rest = []
        for _, rhs in g.rules:
            costs = [term_len[-1 - x] if x < 0 else min_len[x] for x in rhs]
            self.rest.append([min(sum(costs[d:]), INF) for d in range(len(rhs) + 1)])
        self._weight = weight
        self._strings: dict[int, bytes] = {}
        self.best_rule = self._best_rules(term_len)
        self._tokens = self.vocabulary.tokens
        self._token_lengths = self.vocabulary.token_lengths

    # ------------------------------------------------------------------ cheapest strings
    def _best_rules(self, term_len) -> list[int]:
        """A rule reaching each nonterminal's ``min_len`` whose symbols reached theirs first
        (improvements only, so following best rules never loops)."""
        g = self.recogniser.grammar
        best, cost = [-1] * len(g.nonterminals), [INF] * len(g.nonterminals)
        changed = True
        while changed:
            changed = False
            for k, (lhs, rhs) in enumerate(g.rules):
                c = sum(term_len[-1 - x] if x < 0 else cost[x] for x in rhs)
                if c < cost[lhs]:
                    cost[lhs], best[lhs], changed = c, k, True
        return best

    def terminal_tail(self, t: int, q: int) -> bytes:
        """The cheapest bytes that take terminal t's DFA from state q to acceptance."""
        dfa, dist, out = self.recogniser.dfas[t], self.dist[t], []
        while not dfa.accepting[q]:
            b = int(np.argmin(self._weight + np.where(dist[dfa.table[q]] >= INF, np.inf,
                                                       dist[dfa.table[q]])))
            out.append(b)
            q = int(dfa.table[q, b])
        return bytes(out)

    def symbol_string(self, x: int) -> bytes:
        """The cheapest string of a rule symbol (terminal or nonterminal)."""
        if x < 0:
            return self.terminal_tail(-1 - x, self.recogniser.initial[-1 - x])
        got = self._strings.get(x)
        if got is None:
            rhs = self.recogniser.rhs[self.best_rule[x]]
            got = self._strings[x] = b"".join(self.symbol_string(y) for y in rhs)
        return got

    def rest_string(self, r: int, d: int) -> bytes:
        """The cheapest string of rule r's symbols from its dot d on."""
        return b"".join(self.symbol_string(x) for x in self.recogniser.rhs[r][d:])

    def min_tokens(self, data: bytes) -> int:
        """The fewest tokens whose bytes spell ``data`` (dynamic programming over its cuts)."""
        best = [0] + [INF] * len(data)
        for i in range(len(data)):
            if best[i] >= INF:
                continue
            for n in self._token_lengths:
                if i + n > len(data):
                    break
                if data[i:i + n] in self._tokens and best[i] + 1 < best[i + n]:
                    best[i + n] = best[i] + 1
        return best[-1]

    # ------------------------------------------------------------------ runs
    def start_run(self, t: int) -> Run:
        """Terminal t's run from its initial state over every suffix (shared through the
        vocabulary's :meth:`Suffixes.shared_run` with every grammar that has the terminal)."""
        got = self._start_runs.get(t)
        if got is None:
            got = self._start_runs[t] = self.vocabulary.shared_run(
                (self.recogniser.grammar.terminals[t].node, None),
                lambda: self._run(t, self.recogniser.initial[t], np.arange(self.num_suffixes),
                                  self.suffix_left))
        return got

    def state_run(self, t: int, q: int) -> Run:
        """Terminal t's run from state q over whole tokens (entries are token ids; shared as
        :meth:`start_run`'s)."""
        got = self._state_runs.get((t, q))
        if got is None:
            got = self._state_runs[(t, q)] = self.vocabulary.shared_run(
                (self.recogniser.grammar.terminals[t].node, int(q)),
                lambda: self._run(t, q, self.base[:-1], self.length))
        return got

    def _run(self, t: int, q: int, starts: np.ndarray, left: np.ndarray) -> Run:
        """The run of module docstring over the suffixes ``starts`` (entries in that order) of
        ``left`` bytes each."""
        dfa = self.recogniser.dfas[t]
        table, accepting = dfa.table, dfa.accepting
        n = len(starts)
        final = np.zeros(n, dtype=np.int32)
        idx = np.flatnonzero(left > 0)
        state = np.full(len(idx), q, dtype=np.int64)
        src, dst = [], []
        column = 0
        while len(idx):
            state = table[state, self.flat[starts[idx] + column]]
            live = state != 0
            idx, state = idx[live], state[live]
            done = left[idx] == column + 1
            final[idx[done]] = state[done]
            more = ~done
            idx, state = idx[more], state[more]
            acc = accepting[state]
            src.append(idx[acc])
            dst.append(starts[idx[acc]] + column + 1)
            column += 1
        src = np.concatenate(src) if src else np.zeros(0, dtype=np.int64)
        dst = np.concatenate(dst) if dst else np.zeros(0, dtype=np.int64)
        order = np.argsort(src, kind="stable")
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
        return Run(final=final, ptr=ptr, dst=dst[order].astype(np.int64))


def _distance_to_accept(table: np.ndarray, accepting: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """int64 [Q]: cheapest weighted path from each state to an accepting one (INF where none,
    and for the dead state 0): Dijkstra's algorithm from the accepting states over the reversed
    edges (``scipy.sparse.csgraph.dijkstra``; weights ≥ 0), each edge q → r weighted by its
    cheapest byte. O(E log Q) for the E distinct edges — a Bellman-Ford pass per path length
    was quadratic in a long literal's length."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import dijkstra

    table = np.asarray(table)
    Q = table.shape[0]
    weight = np.asarray(weight, dtype=np.float64)
    usable = np.flatnonzero(np.isfinite(weight))
    src, col = np.nonzero(table[:, usable])
    dst = table[src, usable[col]].astype(np.int64)
    keep = (src != 0) & (dst != 0)
    src, dst, w = src[keep], dst[keep], weight[usable[col[keep]]]
    # the cheapest byte of each distinct edge (src, dst); a zero weight is stored as a tiny one,
    # since a sparse matrix drops explicit zeros
    key = src.astype(np.int64) * Q + dst
    order = np.lexsort((w, key))
    first = np.ones(len(order), dtype=bool)
    first[1:] = key[order][1:] != key[order][:-1]
    pick = order[first]
    tiny = np.where(w[pick] == 0, np.finfo(np.float64).tiny, w[pick])
    reverse = coo_matrix((tiny, (dst[pick], src[pick])), shape=(Q, Q)).tocsr()
    targets = np.flatnonzero(np.asarray(accepting, dtype=bool))
    targets = targets[targets != 0]
    if not len(targets):
        return np.full(Q, INF, dtype=np.int64)
    dist = dijkstra(reverse, directed=True, indices=targets, min_only=True)
    dist[0] = np.inf
    out = np.full(Q, INF, dtype=np.int64)
    finite = np.isfinite(dist)
    out[finite] = np.round(dist[finite]).astype(np.int64)
    return out
