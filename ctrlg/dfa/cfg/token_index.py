"""Per grammar × vocabulary: every token *suffix* run through every terminal's byte DFA at once,
and the byte costs of completing a rule — the tables behind the grammar's token masks.

Suffixes. The bytes of all tokens are laid end to end; suffix id ``i`` is the tail of its token
that starts at byte ``i`` (so token v's full bytes are suffix ``base[v]``, and the suffix
``k`` bytes further is ``i + k``). For a terminal t and a start state q, one run over a set of
suffixes (:func:`terminal_run`: a compiled loop over the suffixes whose first byte leaves q
alive, each read until t's DFA dies) gives

* ``final[i]``: t's DFA state after the whole suffix (0: it died), and
* the *completion pairs* ``(i, i + k)``: t's DFA is accepting after the suffix's first k bytes
  (``k <`` its length) — t may end there and the rest of the token continue after it.

Runs from t's initial state cover every suffix (a terminal starts wherever another ended inside
a token); runs from other states — a row stopped inside a terminal — only whole tokens, built
on first use. Cost of a run: the number of (suffix, byte) pairs that stay alive in t's DFA,
i.e. about the tokens that can continue t, plus laying out one entry per suffix; memory: an
int32 and an int64 array per suffix, and the pairs.

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

__all__ = ["TokenIndex", "Suffixes", "Run", "INF", "terminal_run", "terminal_run_columns",
           "by_first_byte"]

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
        """(position in ``entries``, destination suffix) of every completion pair of
        ``entries``, by position, then in the run's order: a compiled loop over the entries
        (their pair counts, then the pairs) when numba is installed, else numpy gathers."""
        entries = np.asarray(entries, dtype=np.int64)
        if _pairs_of is None:  # pragma: no cover - numba is a dependency
            lo = self.ptr[entries]
            counts = self.ptr[entries + 1] - lo
            return (np.repeat(np.arange(len(entries)), counts),
                    self.dst[ragged_indices(lo, counts)])
        ptr, dst = _read_only(self.ptr, np.int64), _read_only(self.dst, np.int64)
        entries = _read_only(entries, np.int64)
        total = _pair_count(ptr, entries)
        where = np.empty(total, dtype=np.int64)
        out = np.empty(total, dtype=np.int64)
        if total:
            _pairs_of(ptr, dst, entries, where, out)
        return where, out


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
    _groups: dict = field(default_factory=dict, repr=False)

    @property
    def num_suffixes(self) -> int:
        return int(self.base[-1])

    def suffix_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Every suffix by its first byte (:func:`by_first_byte`), built on first use."""
        got = self._groups.get("suffixes")
        if got is None:
            got = self._groups["suffixes"] = by_first_byte(
                self.flat, np.arange(self.num_suffixes), self.suffix_left)
        return got

    def token_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Every non-empty token by its first byte (:func:`by_first_byte`), built on first use."""
        got = self._groups.get("tokens")
        if got is None:
            got = self._groups["tokens"] = by_first_byte(self.flat, self.base[:-1], self.length)
        return got

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
                                  self.suffix_left, self.vocabulary.suffix_groups()))
        return got

    def state_run(self, t: int, q: int) -> Run:
        """Terminal t's run from state q over whole tokens (entries are token ids; shared as
        :meth:`start_run`'s)."""
        got = self._state_runs.get((t, q))
        if got is None:
            got = self._state_runs[(t, q)] = self.vocabulary.shared_run(
                (self.recogniser.grammar.terminals[t].node, int(q)),
                lambda: self._run(t, q, self.base[:-1], self.length,
                                  self.vocabulary.token_groups()))
        return got

    def _run(self, t: int, q: int, starts: np.ndarray, left: np.ndarray,
             groups: tuple[np.ndarray, np.ndarray] | None = None) -> Run:
        """The run of module docstring over the suffixes ``starts`` (entries in that order) of
        ``left`` bytes each (:func:`terminal_run`; ``groups``: those entries by first byte)."""
        dfa = self.recogniser.dfas[t]
        return terminal_run(dfa.table, dfa.accepting, self.flat, starts, left, q, groups)


def by_first_byte(flat: np.ndarray, starts: np.ndarray, left: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(order, offsets)``: the non-empty entries of ``starts`` / ``left`` grouped by their
    first byte ``flat[starts[i]]`` (a stable counting sort): entries starting with byte b are
    ``order[offsets[b]:offsets[b + 1]]``, in increasing order."""
    entries = np.flatnonzero(np.asarray(left) > 0)
    first = np.asarray(flat)[np.asarray(starts)[entries]].astype(np.uint8)
    order = entries[np.argsort(first, kind="stable")]
    offsets = np.zeros(257, dtype=np.int64)
    np.cumsum(np.bincount(first, minlength=256), out=offsets[1:])
    return order.astype(np.int64), offsets


def terminal_run(table: np.ndarray, accepting: np.ndarray, flat: np.ndarray, starts: np.ndarray,
                 left: np.ndarray, q: int,
                 groups: tuple[np.ndarray, np.ndarray] | None = None) -> Run:
    """A terminal DFA's :class:`Run` from state ``q`` over the byte strings
    ``flat[starts[i]:starts[i] + left[i]]``: each entry's final state (0 where the DFA died or
    the entry is empty) and its completion pairs ``(i, starts[i] + k)`` for every ``k <
    left[i]`` after which the DFA accepts. ``groups``: the entries by first byte
    (:func:`by_first_byte`, computed here when None), so that only the entries whose first
    byte leaves ``q`` alive are read. Cost: O(entries) to lay out the result, plus the
    (entry, byte) pairs the DFA reads before it dies, one table look-up each, in a compiled
    loop of two passes (final states and pair counts, then the pairs) when numba is installed;
    otherwise :func:`terminal_run_columns`."""
    if _run_entries is None:  # pragma: no cover - numba is a dependency
        return terminal_run_columns(table, accepting, flat, starts, left, q)
    order, offsets = by_first_byte(flat, starts, left) if groups is None else groups
    # read-only views of the inputs, so that one compiled signature serves them all
    table, accepting, flat, starts, left, order, offsets = (
        _read_only(a, dtype) for a, dtype in ((table, np.int32), (accepting, np.bool_),
                                              (flat, np.int64), (starts, np.int64),
                                              (left, np.int64), (order, np.int64),
                                              (offsets, np.int64)))
    n = len(starts)
    final = np.zeros(n, dtype=np.int32)
    ptr = np.zeros(n + 1, dtype=np.int64)
    _run_entries(table, accepting, flat, starts, left, order, offsets, int(q), final, ptr,
                 ptr, False)                                      # pair counts in ptr[1:]
    np.cumsum(ptr, out=ptr)
    dst = np.empty(int(ptr[-1]), dtype=np.int64)
    if len(dst):
        _run_entries(table, accepting, flat, starts, left, order, offsets, int(q), final, ptr,
                     dst, True)
    return Run(final=final, ptr=ptr, dst=dst)


def _read_only(a: np.ndarray, dtype) -> np.ndarray:
    view = np.ascontiguousarray(a, dtype=dtype).view()
    view.setflags(write=False)
    return view


def _run_entries_py(table, accepting, flat, starts, left, order, offsets, q, final, ptr, out,
                    fill):
    """The loop of :func:`terminal_run` over the entries whose first byte leaves ``q`` alive:
    with ``fill`` false, writes ``final`` and each entry's pair count into ``ptr[i + 1]``
    (``out`` unused); with ``fill`` true, writes the pairs' destinations into ``out`` from
    ``ptr[i]`` on (``ptr`` the counts' prefix sums)."""
    for byte in range(256):
        if table[q, byte] == 0:
            continue
        for j in range(offsets[byte], offsets[byte + 1]):
            i = order[j]
            s = q
            b = starts[i]
            n = left[i]
            k = ptr[i] if fill else 0
            for c in range(n):
                s = table[s, flat[b + c]]
                if s == 0:
                    break
                if c + 1 == n:
                    if not fill:
                        final[i] = s
                elif accepting[s]:
                    if fill:
                        out[k] = b + c + 1
                    k += 1
            if not fill:
                ptr[i + 1] = k


def _pair_count_py(ptr, entries):
    """The number of completion pairs of ``entries`` (:meth:`Run.pairs`)."""
    total = 0
    for e in entries:
        total += ptr[e + 1] - ptr[e]
    return total


def _pairs_of_py(ptr, dst, entries, where, out):
    """:meth:`Run.pairs` into ``where`` / ``out`` (sized by :func:`_pair_count_py`)."""
    k = 0
    for i in range(entries.shape[0]):
        e = entries[i]
        for j in range(ptr[e], ptr[e + 1]):
            where[k] = i
            out[k] = dst[j]
            k += 1


try:   # compiled loops when numba is installed; numpy otherwise
    import numba as _numba
    _run_entries = _numba.njit(cache=True, nogil=True)(_run_entries_py)
    _pair_count = _numba.njit(cache=True, nogil=True)(_pair_count_py)
    _pairs_of = _numba.njit(cache=True, nogil=True)(_pairs_of_py)
except ImportError:  # pragma: no cover - numba is a dependency; kept for odd platforms
    _run_entries = _pair_count = _pairs_of = None


def terminal_run_columns(table: np.ndarray, accepting: np.ndarray, flat: np.ndarray,
                         starts: np.ndarray, left: np.ndarray, q: int) -> Run:
    """:func:`terminal_run` in numpy, one byte column of every live entry at a time (entries
    whose DFA died dropped): the reference of the compiled loop, and its stand-in without
    numba. Each column is a few passes over the entries still alive; the first one reads
    every entry."""
    n = len(starts)
    final = np.zeros(n, dtype=np.int32)
    idx = np.flatnonzero(left > 0)
    state = np.full(len(idx), q, dtype=np.int64)
    src, dst = [], []
    column = 0
    while len(idx):
        state = table[state, flat[starts[idx] + column]]
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
