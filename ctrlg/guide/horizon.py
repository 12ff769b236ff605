"""Ctrl-G guidance over a lazy automaton: exact budget masks and a bounded lookahead horizon.

The tables of :mod:`ctrlg.guide.tables` cover every state that a budget of n tokens reaches:
O(n · S · h²) before the first token. For a JSON schema's lazy automaton
(:class:`~ctrlg.dfa.lazy.LazyTokenDFA`) S is hundreds to tens of thousands of states, and most are
never visited. :class:`HorizonGuide` builds nothing up front; at each step, from the row's state q
with r tokens left, it computes two things.

**Exact masks.** A token v is allowed iff δ(q, v) is live and d(δ(q, v)) ≤ r − 1, where d(s) is
the fewest tokens from s to an accepting state (a generation that reaches acceptance with tokens to
spare ends with EOS, and one that ends on the budget needs no EOS), and EOS is allowed iff q is
accepting. Whether d(s) ≤ k is decided without building the budget's automaton:

* an upper bound u(s) ≥ d(s): a completion of s in bytes, found over the byte rows built so far
  (one multi-source shortest-path pass from the accepting states; a depth-first search builds
  rows towards a known state when none reaches s yet), counted in single-byte tokens, or, when
  that is not enough, in the fewest tokens that spell it (every token of it spells bytes along
  the completion's path, so it is a token path to acceptance). u(s) ≤ k proves d(s) ≤ k;
* otherwise an exact breadth-first search over tokens from s, stopped at depth k (its distinct
  successor states, memoised per state); a failed search records the lower bound d(s) > k.

**The horizon estimate.** With horizon H, let k = min(H, r). Ctrl-G's p_hmm(α | x≤t, v) is
replaced by p_hmm(α_k | x≤t, v), where α_k = "the next k tokens stay within the constraint, and the
state reached after them (or the EOS before them) can still finish": the recurrence of
:mod:`ctrlg.guide.tables` over the states within k tokens of q (a breadth-first *region*), with
W_0(s) = [u(s) ≤ r − k] (a state whose bound does not prove feasibility counts as dead for the
estimate; the exact mask still allows it, with the floor below), and for r' = 1..k − 1

    W_r'(s) = A · g_s,   g_s = Σ_t Ē_{s,t} ⊙ W_{r'−1}(t)  +  [s accepting] · Σ_e B[:, e]
    Ē_{s,t} = Σ_{v : δ(s, v) = t} B[:, v]                  (tokens grouped by successor)

rows scaled to max 1 with a float64 log scale. Then, for the row's prior p over the hidden state of
the next token (the HMM's filtering posterior, :mod:`ctrlg.guide.priors`),

    p_hmm(α_k | x≤t, v) = (p ⊙ W_{k−1}(δ(q, v))) · B[:, v]  /  p · B[:, v]

(EOS: [q accepting]). When H ≥ r this is exactly Ctrl-G's quantity (W_0 = [s accepting] there: u(s)
≤ 0 iff s accepts); with H < r it is a named approximation: it looks H tokens ahead and trusts the
feasibility bound beyond. ``first_horizon`` F replaces H at the first token only (r = n), whose
region is built from nothing: the time to the first token, traded for one token's lookahead. A
region holds at most ``max_region_states`` states: the breadth-first search stops at the last depth
that fits (k shrinks; at least one step). Exactly feasible tokens whose estimate is 0 (their region
path was cut or their bound unproven) get the row's smallest positive ratio ·
e^−``RATIO_FLOOR_GAP`` (:mod:`ctrlg.guide.token_weights`), so the mask, not the estimate, decides
what is allowed.

Costs per distinct (q, k, W_0): the region's states' token rows (the lazy automaton's walks,
memoised), Σ over its (source, successor) pairs of |tokens|·h for Ē (a loop slice's sum is kept
per slice), k − 1 products [S_region, h]·[h, h] over the rows each step reads (depth ≤ k − r);
per row and step a gather of the allowed tokens' columns B[:, v] for p ⊙ W(δ(q, v)) · B[:, v]
and p · B[:, v], or one [1 + g, h]·[h, V] product (p, and p ⊙ W of each of the g groups of
``DENSE_GROUP`` tokens or more) when such a group exists or more than ``PRODUCT_SHARE`` of the
vocabulary is gathered. At a JSON document's first token (two or three tokens allowed) no
product over V is paid. Regions are memoised per (q, k, W_0) and hold for every row and step
that meets them again.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from ctrlg.dfa.lazy import DEAD, ENDED, LazyTokenDFA
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.guide.emission_operands import (completion_memo, emission_operands, host_copy,
                                           transition_operands)
from ctrlg.guide.letter_sums import LARGE_LETTER, GroupSumsMemo
from ctrlg.guide.tables import PRECISIONS, forward_update, grouped_sums, resolve_precision
from ctrlg.guide.token_weights import RATIO_FLOOR_GAP

__all__ = ["HorizonGuide", "HorizonRows", "LazyFeasibility", "DEFAULT_HORIZON", "MAX_REGION_STATES"]

#: Tokens of lookahead by default: chosen on 30 Glaiveai2K schemas (benchmarks/json_guidance_quality:
#: H = 4 and 8 within 0.03 nat per token of each other, 4 the cheaper; docs/sampler.md).
DEFAULT_HORIZON = 4
#: States in one lookahead region at most (the horizon shrinks to the last depth that fits).
MAX_REGION_STATES = 96
#: A group of tokens with one successor this large is read off the dense product p ⊙ W · B
#: instead of a gather of its columns.
DENSE_GROUP = 2048
#: Tokens whose emission columns are gathered at once (bounds the temporary [T, h] blocks).
GATHER_BLOCK = 4096
#: Pair sums over at most this many columns gather them (more: a sparse product).
GATHER_SUMS = 512
#: Above this share of the vocabulary gathered, p · B comes from one product over V instead.
PRODUCT_SHARE = 0.25
#: Longest token (in bytes) the token bound u(s) tries.
GREEDY_MATCH = 16


_TOKEN_INDEX: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
def _rarity_order_py(row: np.ndarray, single: np.ndarray, dead: int) -> np.ndarray:
    """The distinct values of ``row[single]`` other than ``dead``, by how often they occur
    (fewest first; ties by value): the order of ``np.unique(..., return_counts=True)`` then a
    stable sort by count, without numpy's per-call cost (compiled below, ~4 µs a row)."""
    r = np.sort(row[single])
    n = len(r)
    values = np.empty(n, dtype=np.int64)
    counts = np.empty(n, dtype=np.int64)
    m, i = 0, 0
    while i < n:
        j = i
        while j < n and r[j] == r[i]:
            j += 1
        if r[i] != dead:
            values[m] = r[i]
            counts[m] = j - i
            m += 1
        i = j
    return values[:m][np.argsort(counts[:m], kind="mergesort")]


def _unit_distances_py(heads: np.ndarray, tails: np.ndarray, num_states: int,
                       sources: np.ndarray) -> np.ndarray:
    """float64 [num_states]: the fewest edges from any of ``sources`` to each state over the
    edges ``heads[i] → tails[i]`` (inf where none leads): multi-source breadth-first search
    over a CSR built by counting sort, O(E + Q); the same distances as a unit-weight
    Dijkstra."""
    start = np.zeros(num_states + 1, dtype=np.int64)
    for h in heads:
        start[h + 1] += 1
    for q in range(num_states):
        start[q + 1] += start[q]
    fill = start[:-1].copy()
    adjacent = np.empty(len(heads), dtype=np.int64)
    for i in range(len(heads)):
        adjacent[fill[heads[i]]] = tails[i]
        fill[heads[i]] += 1
    dist = np.full(num_states, np.inf)
    queue = np.empty(num_states, dtype=np.int64)
    read, write = 0, 0
    for s in sources:
        if dist[s] == np.inf:
            dist[s] = 0.0
            queue[write] = s
            write += 1
    while read < write:
        q = queue[read]
        read += 1
        for e in range(start[q], start[q + 1]):
            t = adjacent[e]
            if dist[t] == np.inf:
                dist[t] = dist[q] + 1.0
                queue[write] = t
                write += 1
    return dist


def _descent_py(table: np.ndarray, dist: np.ndarray, single: np.ndarray,
                q: int) -> tuple[np.ndarray, np.ndarray]:
    """``(states, bytes)`` of the path from ``q`` that descends ``dist`` by one at every step
    (the lowest such single-token byte each time) down to a state at distance 0: ``states``
    holds q and every state after it but the last, ``bytes`` the byte read from each. Every
    state with a finite positive distance has its row built (one of its edges reached the
    graph), so the path is read off ``table``."""
    n = int(dist[q])
    states = np.empty(n, dtype=np.int64)
    data = np.empty(n, dtype=np.int64)
    for i in range(n):
        states[i] = q
        want = dist[q] - 1.0
        found = False
        for byte in range(256):
            if single[byte] and dist[table[q, byte]] == want:
                data[i] = byte
                q = table[q, byte]
                found = True
                break
        if not found:     # a distance without the row that gave it: the graph is stale
            raise RuntimeError("the byte distances do not descend from this state")
    return states, data


try:   # compiled when numba is installed (a dependency); the same functions in Python otherwise
    import numba as _numba
    _rarity_order = _numba.njit(cache=True, nogil=True)(_rarity_order_py)
    _unit_distances = _numba.njit(cache=True, nogil=True)(_unit_distances_py)
    _descent = _numba.njit(cache=True, nogil=True)(_descent_py)
except ImportError:  # pragma: no cover - numba is a dependency; kept for odd platforms
    _rarity_order, _unit_distances, _descent = _rarity_order_py, _unit_distances_py, _descent_py


def _token_index(trie, eos, vocab_size) -> tuple[dict, int]:
    """``({token bytes: a token id}, longest match tried)`` of a vocabulary trie (non-EOS
    tokens with bytes), built once per trie."""
    key = (eos, vocab_size)
    per_trie = _TOKEN_INDEX.setdefault(trie, {})
    if key not in per_trie:
        token_of: dict[bytes, int] = {}
        for i, b in enumerate(trie.token_bytes):
            if b and i != eos and i < vocab_size:
                token_of.setdefault(bytes(b), i)
        # matches up to GREEDY_MATCH bytes (shorter tokens still give a valid bound)
        per_trie[key] = (token_of, min(GREEDY_MATCH, max(map(len, token_of), default=1)))
    return per_trie[key]


class LazyFeasibility:
    """Exact budget feasibility over a :class:`~ctrlg.dfa.lazy.LazyTokenDFA` (module docstring):
    :meth:`within` decides d(s) ≤ k, :meth:`mask` is the exact next-token mask."""

    def __init__(self, dfa: LazyTokenDFA):
        if not isinstance(dfa, LazyTokenDFA):
            raise ConstraintError(f"a lazy guide needs a LazyTokenDFA, got {type(dfa).__name__}")
        self.dfa = dfa
        self._edges: dict[int, tuple] = {}
        self._groups: dict[int, tuple] = {}
        self._upper: dict[int, float] = {}      # s -> a bound of d(s) in tokens
        self._step: dict[int, tuple] = {}       # s -> (token, next state) of that completion
        self._exact: dict[int, int] = {}        # d(s) where a search found it
        self._lower: dict[int, int] = {}        # d(s) ≥ this (failed searches)
        self._token_of, self._longest = _token_index(dfa.trie, dfa.eos_token_id, dfa.vocab_size)
        #: bytes spelled by a single token: the edges of the byte distances (so a distance in
        #: bytes is a count of tokens, an upper bound of d)
        self._single = np.array([bytes([c]) in self._token_of for c in range(256)])
        self._dist, self._dist_key = None, None
        self._in_graph = np.zeros(0, dtype=bool)     # byte rows whose edges are in the graph
        self._heads = self._tails = np.zeros(0, dtype=np.int64)   # its reversed edges

    # ------------------------------------------------------------------ token rows
    def edges(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(tokens, successors, loop tokens or None)`` of live state ``s`` (EOS not included;
        :meth:`LazyTokenDFA._expand`, memoised)."""
        got = self._edges.get(s)
        if got is None:
            tok, nxt, loop = self.dfa._expand(s)
            live = nxt != DEAD
            got = self._edges[s] = (tok[live], nxt[live], loop if loop is not None and len(loop) else None)
        return got

    def successors(self, s: int) -> np.ndarray:
        """The distinct live successors of ``s`` over non-EOS tokens (sorted)."""
        if s in (DEAD, ENDED):
            return np.zeros(0, dtype=np.int64)
        return self.groups(s)[0]

    def groups(self, s: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(successors, token ids per successor)`` of live state ``s`` (non-EOS tokens grouped
        by their successor; the loop slice joins the group of ``s`` itself), memoised."""
        got = self._groups.get(s)
        if got is None:
            tok, nxt, loop = self.edges(s)
            order = np.argsort(nxt, kind="stable")          # tokens by successor, in token order
            ordered = nxt[order]
            starts = np.flatnonzero(np.diff(ordered, prepend=ordered[:1] - 1)) if len(nxt) \
                else np.zeros(0, dtype=np.int64)
            targets = ordered[starts]
            ordered_tokens = tok[order]
            bounds = starts.tolist() + [len(nxt)]
            members = [ordered_tokens[a:b] for a, b in zip(bounds, bounds[1:])]
            if loop is not None:
                at = int(np.searchsorted(targets, s))
                if at < len(targets) and targets[at] == s:
                    members[at] = np.concatenate([loop, members[at]])
                else:
                    targets = np.insert(targets, at, s)
                    members.insert(at, np.asarray(loop, dtype=np.int64))
            got = self._groups[s] = (targets.astype(np.int64), members)
        return got

    # ------------------------------------------------------------------ d(s) ≤ k
    def _byte_distances(self) -> np.ndarray:
        """float64 [Q]: for every byte state, the fewest bytes to acceptance along rows built so
        far, by bytes that are single tokens (inf where none leads there yet): an upper bound of
        d in tokens that tightens as the automaton is explored. One multi-source shortest-path
        pass over the reversed explored graph (a compiled breadth-first search), redone
        when rows were added; the graph keeps the edges of the rows already read (a row is final
        once built) and reads only the new rows' distinct targets."""
        b = self.dfa.bdfa
        Q = b.num_states
        computed = b.computed[:Q]
        built = int(np.count_nonzero(computed))
        if self._dist is not None and self._dist_key == (Q, built):
            return self._dist
        # rows are final once built: only the rows built since the last pass add edges
        if len(self._in_graph) < Q:
            grown = np.zeros(max(Q, 2 * len(self._in_graph)), dtype=bool)
            grown[:len(self._in_graph)] = self._in_graph
            self._in_graph = grown
        new = np.flatnonzero(computed & ~self._in_graph[:Q])
        self._in_graph[new] = True
        new = new[new > ENDED]
        if len(new):             # each row's distinct live targets: reversed edges target → row
            dst = np.sort(b.table[new][:, self._single], axis=1)
            keep = (dst != DEAD) & (np.diff(dst, axis=1, prepend=DEAD) != 0)
            self._heads = np.concatenate([self._heads, dst[keep].astype(np.int64)])
            self._tails = np.concatenate([self._tails, np.repeat(new, keep.sum(1))])
        sources = np.flatnonzero(b.accepting[:Q])
        sources = sources[sources > ENDED].astype(np.int64)
        dist = _unit_distances(self._heads, self._tails, Q, sources)
        self._dist, self._dist_key = dist, (Q, built)
        return dist

    def _explore_from(self, s: int) -> None:
        """Build byte rows from ``s`` along one path to a state whose distance is known (or an
        accepting one): depth first, never revisiting a state, trying first the successors
        that a state reaches by the fewest bytes (a closing quote or bracket before the bytes
        of a string's body or a number's digits), so the path is short without a breadth-first
        search over every state nearer than the end (whose rows cost a subset construction
        each). Every live state reaches acceptance, so the search ends; any path gives an upper
        bound, which :meth:`_byte_distances` then shortens over every row built so far."""
        b = self.dfa.bdfa
        known = self._dist if self._dist is not None else np.zeros(0)
        seen = {s}
        stack = [iter(self._successors_by_rarity(s))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                continue
            if nxt in seen:
                continue
            seen.add(nxt)
            if b.accepting[nxt] or (nxt < len(known) and np.isfinite(known[nxt])):
                return
            stack.append(iter(self._successors_by_rarity(nxt)))

    def _successors_by_rarity(self, q: int) -> list[int]:
        """The live byte successors of ``q`` (by single-token bytes), fewest bytes first."""
        return _rarity_order(self.dfa.bdfa.row(q), self._single, DEAD).tolist()

    def upper_bound(self, s: int, k: float = -1) -> float:
        """u(s) ≥ d(s) (module docstring), or any bound ≤ ``k`` found first: the byte distance
        of :meth:`_byte_distances`, or, when that exceeds ``k``, the fewest tokens that spell the
        completion it follows (:meth:`_token_bound`). inf: no completion explored yet."""
        if s == DEAD:
            return math.inf
        if s == ENDED or self.dfa.is_accepting(s):
            return 0
        dist = self._dist
        if dist is None or s >= len(dist) or not np.isfinite(dist[s]):
            dist = self._byte_distances()       # rows built since the last pass may reach s
            if s >= len(dist) or not np.isfinite(dist[s]):
                self._explore_from(s)
                dist = self._byte_distances()
        if not np.isfinite(dist[s]):
            return math.inf
        length = int(dist[s])
        if length <= k:
            return length
        return min(length, self._token_bound(s, dist))

    def _token_bound(self, s: int, dist: np.ndarray) -> float:
        """A bound of d(s) in tokens along the completion that descends ``dist`` by one byte at
        a time, up to the first state with a bound of its own: the fewest tokens that spell
        the path's bytes (right to left, f_i = 1 + min over tokens t starting at byte i of
        f_{i+|t|}; matches up to GREEDY_MATCH bytes), plus that state's bound. Every state along
        the path gets its bound (a suffix of a token path is one); any valid bound stays valid
        as the explored automaton grows."""
        path, path_bytes = _descent(self.dfa.bdfa.table, dist, self._single, s)
        states, tail = path.tolist(), 0
        n = len(states)
        for i, q in enumerate(states):          # up to the first state with a bound of its own
            known = self._upper.get(q)
            if known is not None:
                n, tail = i, known
                break
        data = bytes(path_bytes[:n].tolist())
        states = states[:n]
        # the state after the last byte
        states.append(self.dfa.bdfa.table[states[-1], data[-1]].item() if n else s)
        best, take = [math.inf] * n + [tail], [n] * (n + 1)
        for i in range(n - 1, -1, -1):
            for j in range(i + 1, min(n, i + self._longest) + 1):
                if best[j] + 1 < best[i] and data[i:j] in self._token_of:
                    best[i], take[i] = best[j] + 1, j
            if best[i] < self._upper.get(states[i], math.inf):
                self._upper[states[i]] = best[i]
                if best[i] < math.inf:
                    self._step[states[i]] = (self._token_of[data[i:take[i]]], states[take[i]])
        return self._upper.get(s, math.inf)

    def completion_step(self, s: int):
        """``(token, next state)``: the first token of the completion behind u(s) (None when
        ``s`` accepts or no completion is explored yet)."""
        if s in (DEAD, ENDED) or self.dfa.is_accepting(s):
            return None
        if s not in self._step:
            self.upper_bound(s)
        return self._step.get(s)

    def within(self, s: int, k: int) -> bool:
        """Whether d(s) ≤ k: some sequence of at most ``k`` non-EOS tokens from ``s`` reaches an
        accepting state (exact)."""
        s, k = int(s), int(k)
        if s == DEAD or k < 0:
            return False
        exact = self._exact.get(s)
        if exact is not None:
            return exact <= k
        if self.upper_bound(s, k) <= k:
            return True
        if self._lower.get(s, 0) > k:
            return False
        return self._search(s, k)

    def _search(self, s: int, k: int) -> bool:
        """Breadth-first over tokens from ``s`` to depth ``k``; records d(s) or d(s) > k."""
        seen = {s}
        layer = [s]
        for depth in range(k + 1):
            for q in layer:
                if q == ENDED or self.dfa.is_accepting(q) or self._exact.get(q) == 0:
                    self._exact[s] = depth
                    return True
            if depth == k:
                break
            nxt = []
            for q in layer:
                for t in self.successors(q).tolist():
                    if t not in seen:
                        # a successor proven to finish within what is left ends the search early
                        seen.add(t)
                        nxt.append(t)
            layer = nxt
            if not layer:
                break
        self._lower[s] = k + 1
        return False

    # ------------------------------------------------------------------ the exact mask
    def mask(self, q: int, remaining: int, eos_ok: bool = True) -> np.ndarray:
        """bool [V]: the tokens allowed from state ``q`` with ``remaining`` tokens left (this one
        included): live successor with d ≤ remaining − 1, EOS iff ``q`` accepts (and ``eos_ok``)."""
        d = self.dfa
        out = np.zeros(d.vocab_size, dtype=bool)
        if q in (DEAD,) or remaining < 1:
            return out
        if q == ENDED:
            if d.eos_token_id is not None:
                out[d.eos_token_id] = True
            return out
        targets, members = self.groups(q)
        for t, tokens in zip(targets.tolist(), members):
            if self.within(t, remaining - 1):
                out[tokens] = True
        if d.eos_token_id is not None:
            out[d.eos_token_id] = eos_ok and d.is_accepting(q)
        return out


class _Region:
    """The horizon recurrence's result for one (q, k, W_0): Ŵ_{k−1} [n, h] and c_{k−1} [n] of
    q's successors, in the order of :meth:`LazyFeasibility.groups`."""

    __slots__ = ("w_hat", "log_scale")

    def __init__(self, w_hat, log_scale):
        self.w_hat, self.log_scale = w_hat, log_scale


class HorizonGuide:
    """Ctrl-G guidance over a lazy automaton with lookahead horizon H (module docstring).

    Args:
        dfa: a :class:`~ctrlg.dfa.lazy.LazyTokenDFA` (e.g. :func:`ctrlg.dfa.lazy_json_schema`).
        hmm: a :class:`ctrlg.HMM` over the same vocabulary, or None (exact masks only). The
            guide computes on the CPU: an HMM on a GPU is read through a CPU copy
            (:func:`~ctrlg.guide.emission_operands.host_copy`), and the ratios are CPU tensors.
        max_new_tokens: the budget n.
        horizon: H ≥ 1 tokens of lookahead (H ≥ n: Ctrl-G's exact guidance).
        max_region_states: states in a lookahead region at most.
        first_horizon: the horizon of the first token only (the whole budget left), or None
            (``horizon``): a shorter first lookahead cuts the time to the first token, since
            the first region is built from nothing; the later tokens keep ``horizon``.
        precision: of the per-token product p · B ("float32", "bfloat16" or "auto").

    Raises UnsatisfiableConstraintError when no accepted generation fits the budget.
    """

    def __init__(self, dfa: LazyTokenDFA, hmm=None, max_new_tokens: int = 32, *,
                 horizon: int = DEFAULT_HORIZON, max_region_states: int = MAX_REGION_STATES,
                 precision: str = "float32", first_horizon: int | None = None):
        self.feasibility = LazyFeasibility(dfa)
        self.dfa = dfa
        self.vocab_size = dfa.vocab_size
        self.max_new_tokens = int(max_new_tokens)
        if self.max_new_tokens < 1:
            raise ConstraintError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
        self.horizon = int(horizon)
        if self.horizon < 1:
            raise ConstraintError(f"horizon must be ≥ 1, got {horizon}")
        self.first_horizon = self.horizon if first_horizon is None else int(first_horizon)
        if self.first_horizon < 1:
            raise ConstraintError(f"first_horizon must be ≥ 1, got {first_horizon}")
        self.max_region_states = int(max_region_states)
        if self.max_region_states < 2:
            raise ConstraintError(f"max_region_states must be ≥ 2, got {max_region_states}")
        hmm = None if hmm is None else host_copy(hmm)
        self.hmm = hmm
        self.eos_ids = [] if dfa.eos_token_id is None else [int(dfa.eos_token_id)]
        self.precision = "float32"
        if hmm is not None:
            if hmm.vocab_size != dfa.vocab_size:
                raise VocabularyMismatchError(
                    f"the automaton has vocabulary size {dfa.vocab_size} but the HMM has "
                    f"{hmm.vocab_size}")
            self.precision = resolve_precision(precision, hmm.emission.device)
            ops = emission_operands(hmm, PRECISIONS[self.precision])
            self._emission_t = ops.emission_t                      # Bᵀ [V, h] float32
            self._product = ops.product                            # x ↦ x · B
            self._row_sum = ops.row_sum                            # Σ_v B[:, v], float64
            self._large_letters = ops.large_letters                # sums of large token sets
            self._group_sums = ops.group_sums                      # pair sums met before
            self._transition, self._transition_t = transition_operands(hmm)    # A, Aᵀ
            self._transition_np = self._transition.cpu().numpy()  # β's products (numpy)
            self._emission_np = self._emission_t.cpu().numpy()
            self._completions = completion_memo(hmm, self._transition_np, self._emission_np)
            self._eos_column = self._emission_t[self.eos_ids].sum(0) if self.eos_ids \
                else torch.zeros(hmm.hidden_size)
        self._pair_sums: dict[int, torch.Tensor] = {}
        self._completion: dict[int, tuple] = {}
        self._regions: dict = {}
        if not self.feasibility.within(dfa.initial, self.max_new_tokens):
            raise UnsatisfiableConstraintError(
                f"no accepted generation within max_new_tokens={self.max_new_tokens} tokens")

    # ------------------------------------------------------------------ public queries
    def mask(self, state: int, remaining: int) -> np.ndarray:
        """The exact allowed tokens (bool [V]) from ``state`` with ``remaining`` tokens left."""
        return self.feasibility.mask(int(state), int(remaining))

    def log_ratio(self, state: int, prior: torch.Tensor | None, remaining: int) -> torch.Tensor:
        """float32 [V]: log p_hmm(α_k | x≤t, v) (module docstring) for the row in ``state`` with
        ``prior`` [h] over the next token's hidden state and ``remaining`` tokens left; −inf
        exactly on the tokens :meth:`mask` forbids; 0 on the allowed ones without an HMM (or
        ``prior`` None)."""
        state, remaining = int(state), int(remaining)
        allowed = torch.from_numpy(self.mask(state, remaining))
        if self.hmm is None or prior is None or state == ENDED or not bool(allowed.any()):
            return torch.where(allowed, 0.0, -math.inf)
        k = min(self.first_horizon if remaining == self.max_new_tokens else self.horizon,
                remaining)
        region = self._region(state, remaining, k)
        _, members = self.feasibility.groups(state)
        p = prior.reshape(-1).float()
        weighted = p * region.w_hat                                 # [n, h]
        log_joint = torch.full((self.vocab_size,), -math.inf, dtype=torch.float64)
        finite = np.isfinite(region.log_scale.numpy())
        dense = [j for j, tokens in enumerate(members) if len(tokens) >= DENSE_GROUP and finite[j]]
        small = [j for j, tokens in enumerate(members) if len(tokens) < DENSE_GROUP and finite[j]]
        tiny = torch.finfo(torch.float32).tiny
        sizes = [len(members[j]) for j in small]
        gathered = sum(sizes)
        use_product = bool(dense) or gathered > PRODUCT_SHARE * self.vocab_size
        if use_product:      # p · B (and p ⊙ Ŵ · B of the dense groups): one product over V
            prod = self._product(torch.cat([p[None], weighted[dense]])).float()   # [1 + |dense|, V]
            marginal = prod[0].clamp_min(tiny).log().double()
            for row, j in enumerate(dense, start=1):
                tokens = torch.from_numpy(members[j])
                log_joint[tokens] = prod[row][tokens].clamp_min(0).log().double() + region.log_scale[j]
        else:                # p · B[:, v] filled in from the gathered columns below
            marginal = torch.zeros(self.vocab_size, dtype=torch.float64)
        if small:            # the other groups' columns, gathered in blocks of GATHER_BLOCK
            tokens_all = torch.from_numpy(np.concatenate([members[j] for j in small]))
            group_all = torch.repeat_interleave(torch.tensor(small), torch.tensor(sizes))
            for lo in range(0, gathered, GATHER_BLOCK):
                tokens, group = tokens_all[lo:lo + GATHER_BLOCK], group_all[lo:lo + GATHER_BLOCK]
                columns = self._emission_t[tokens]                                 # [T, h]
                joint = (columns * weighted[group]).sum(1)
                log_joint[tokens] = joint.clamp_min(0).log().double() + region.log_scale[group]
                if not use_product:          # p · B[:, v] from the same columns
                    marginal[tokens] = (columns @ p).clamp_min(tiny).log().double()
        ratio = (log_joint - marginal).float()
        if self.eos_ids:
            ratio[self.eos_ids] = 0.0 if self.dfa.is_accepting(state) else -math.inf
        ok = allowed & torch.isfinite(ratio)
        lost = allowed & ~ok
        if bool(lost.any()):           # exactly feasible, estimated 0: the floor
            floor = float(ratio[ok].min()) - RATIO_FLOOR_GAP if bool(ok.any()) else 0.0
            ratio[lost] = floor
        return torch.where(allowed, ratio, -math.inf)

    def initial_prior(self) -> torch.Tensor:
        """π [h]: the prior over generated token 1's hidden state."""
        return self.hmm.initial.float().clone()

    def advance_prior(self, prior: torch.Tensor, token: int) -> torch.Tensor:
        """The filtering step p' ∝ (p ⊙ B[:, v]) A for one row: the tables' own step
        (:func:`ctrlg.guide.tables.forward_update`, so both paths filter alike)."""
        tokens = torch.tensor([int(token)])
        return forward_update(prior.reshape(1, -1).float(), tokens, self._transition,
                              self._emission_t)[0]

    # ------------------------------------------------------------------ regions
    def _region(self, q: int, remaining: int, k: int) -> _Region:
        """The region of ``q`` for a horizon of ``k`` tokens: breadth first to depth k (fewer
        where the next level would pass ``max_region_states``), W_0 from the bounds u(s)."""
        feas = self.feasibility
        order, depth = [q], {q: 0}
        frontier = [q]
        for level in range(1, k + 1):
            nxt = []
            for s in frontier:
                for t in feas.successors(s).tolist():
                    if t not in depth:
                        nxt.append(t)
                        depth[t] = level
            if level > 1 and len(order) + len(nxt) > self.max_region_states:
                for t in nxt:
                    del depth[t]
                k = level - 1
                break
            order.extend(nxt)
            frontier = nxt
        left = remaining - k
        flags = tuple(s for s in order if feas.upper_bound(s, left) <= left)
        key = (q, k, flags, left == 0)
        got = self._regions.get(key)
        if got is None:
            got = self._regions[key] = self._build_region(q, order, depth, k, flags, left)
        return got

    def completion_weight(self, s: int) -> tuple[np.ndarray, float]:
        """β(s) = P_hmm(the next tokens are y(s), then EOS | z) for every hidden state z of the
        token just emitted, as (float32 vector with max 1 [h], log scale): y(s) the token
        completion behind u(s) (:meth:`LazyFeasibility.completion_step`), so β(s) ≤ W_∞(s), the
        probability of finishing from s by any path. β(s) = A · (B[:, y_1] ⊙ β(δ(s, y_1))),
        β(accepting) = A · Σ_e B[:, e]; memoised per state, and per token sequence by the HMM's
        :class:`~ctrlg.guide.completion_memo.CompletionMemo` (shared by its guides: a sequence
        met before costs a dict probe, a new one O(h²), one matrix-vector product in numpy).
        The vectors are shared and must not be written to."""
        chain, q = [], s
        while q not in self._completion:
            step = self.feasibility.completion_step(q)
            if step is None:
                break
            chain.append((q, step[0]))
            q = step[1]
        if q in self._completion:
            node, vec, scale = self._completion[q]
        elif self.feasibility.dfa.is_accepting(q):
            node, vec, scale = self._completions.base(tuple(self.eos_ids),
                                                      self._eos_column.numpy())
            self._completion[q] = (node, vec, scale)
        else:                                      # no completion explored: nothing to say
            node, vec, scale = None, np.zeros(self.hmm.hidden_size, dtype=np.float32), -math.inf
        for state, token in reversed(chain):
            if node is not None:
                node, vec, scale = self._completions.extend(node, vec, scale, token)
            self._completion[state] = (node, vec, scale)
        got = self._completion.get(s)
        return (vec, scale) if got is None else (got[1], got[2])

    def pair_sums(self, s: int) -> torch.Tensor:
        """Ē_{s,t} = Σ_{v: δ(s, v) = t} B[:, v] for the successors t of :meth:`LazyFeasibility.groups`
        (float32 [n, h], memoised): one sparse 0/1 [n, V] matrix times Bᵀ, which reads only the
        members' columns (:func:`ctrlg.guide.tables.grouped_sums`); at most ``GATHER_SUMS``
        columns in all are gathered and summed per group instead (numpy: no sparse set-up). A
        group of more than half the vocabulary is the row sum minus every other column (its
        complement: the other groups, dead tokens and EOS, one more row of that matrix), in
        float64. A group of ``LARGE_LETTER`` tokens or more (short of that half) is summed by
        the HMM's shared store (:class:`ctrlg.guide.letter_sums.LargeLetterSums`, float64): the
        same token sets recur across states and schemas (the digits that continue a number, the
        characters of a string), and the store gives a set it has seen, or one close to it, for
        the cost of the difference. A result over more than ``GATHER_SUMS`` tokens is kept by
        the HMM's :class:`ctrlg.guide.letter_sums.GroupSumsMemo` under a digest of the groups
        (the whole result is read back when another guide meets the same groups); it must not
        be written to."""
        got = self._pair_sums.get(s)
        if got is not None:
            return got
        targets, members = self.feasibility.groups(s)
        n = len(targets)
        sizes = np.fromiter(map(len, members), dtype=np.int64, count=n)
        total = int(sizes.sum())
        key = None
        if total > GATHER_SUMS:              # worth a digest: kept across guides of this HMM
            key = GroupSumsMemo.key(members)
            got = self._group_sums.get(key)
            if got is not None:
                self._pair_sums[s] = got
                return got
        if not n:
            out = torch.zeros(0, self.hmm.hidden_size)
        elif total <= GATHER_SUMS:           # a few columns (no big group): gathered, summed
            starts = np.concatenate([[0], np.cumsum(sizes[:-1])])
            out = torch.from_numpy(np.add.reduceat(self._emission_np[np.concatenate(members)],
                                                   starts, axis=0))
        else:
            big = int(np.argmax(sizes)) if sizes.max() > self.vocab_size // 2 else -1
            stored = sizes >= LARGE_LETTER       # summed by the HMM's store of large sums
            summed = ~stored                     # summed here, by the sparse product
            if big >= 0:                         # neither: the complement
                stored[big] = summed[big] = False
            group = np.repeat(np.arange(n), sizes)
            keep = summed[group]
            group, tokens = group[keep], np.concatenate(members)[keep]
            if big >= 0:                     # row n: the complement of the big group
                rest = np.ones(self.vocab_size, dtype=bool)
                for g in np.flatnonzero(~summed):   # the big group; the stored ones, added below
                    rest[members[g]] = False
                rest_tokens = np.flatnonzero(rest)
                group = np.concatenate([group, np.full(len(rest_tokens), n)])
                tokens = np.concatenate([tokens, rest_tokens])
            sums = grouped_sums(group, tokens, self._emission_t, n + 1)
            out = sums[:n].contiguous()
            complement = sums[n].double()
            for g in np.flatnonzero(stored):
                large = self._large_letters.sum(members[g])
                out[g] = large.float()
                complement += large
            if big >= 0:
                out[big] = (self._row_sum - complement).clamp_min(0).float()
        if key is not None:
            self._group_sums.put(key, out)
        self._pair_sums[s] = out
        return out

    def _build_region(self, q: int, order: list, depth: dict, k: int, flags: tuple,
                      left_after: int) -> _Region:
        """Ŵ_{k−1}, c_{k−1} of q's successors by the module docstring's recurrence over the
        states of ``order`` (depth ≤ k). The small per-state arithmetic is numpy's (tens of
        states: torch's per-call cost would be most of it); the products by A are torch's."""
        feas, h = self.feasibility, self.hmm.hidden_size
        S = len(order)
        local = {s: i for i, s in enumerate(order)}
        w = np.zeros((S, h), dtype=np.float32)
        c = np.full(S, -math.inf)
        for s in flags:                  # W_0: the states whose bound proves they finish in time
            if left_after == 0:          # the budget ends at the horizon: [s accepting], exact
                w[local[s]], c[local[s]] = 1.0, 0.0
            else:                        # what finishing costs from s: β(s) (module docstring)
                vec, c[local[s]] = self.completion_weight(s)
                w[local[s]] = vec
        # (source, successor) pairs of the states with rows: depth ≤ k − 1 (a state first met at
        # depth d is read at r' ≤ k − d tokens left, so step r' computes the rows of depth
        # ≤ k − r'); sources come in the order of ``order``, so each state's pairs are contiguous
        src, dst, sums = [], [], []
        for s in order:
            if depth[s] <= k - 1:
                targets = feas.successors(s)
                src.extend([local[s]] * len(targets))
                dst.extend(local[t] for t in targets.tolist())
                sums.append(self.pair_sums(s).numpy())
        depth_a = np.fromiter((depth[s] for s in order), dtype=np.int64, count=S)
        order_a = np.asarray(order)
        accepting = self.dfa.bdfa.accepting[order_a] & bool(self.eos_ids)
        if self.eos_ids:
            accepting[order_a == ENDED] = True
        src_a, dst_a = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        pair_e = np.concatenate(sums) if sums else np.zeros((0, h), dtype=np.float32)
        eos_column = self._eos_column.numpy()
        for r in range(1, k):
            # W_r is read at the rows of depth ≤ k − r only: the pairs and products of those
            rows = np.flatnonzero(depth_a <= k - r)
            use = np.flatnonzero(depth_a[src_a] <= k - r)
            at = np.full(S, -1, dtype=np.int64)
            at[rows] = np.arange(len(rows))
            src_r, dst_r = at[src_a[use]], dst_a[use]                 # row index, local state
            m = np.full(len(rows), -math.inf)
            np.maximum.at(m, src_r, c[dst_r])
            eos_live = accepting[rows]
            m = np.where(eos_live, np.maximum(m, 0.0), m)
            m_safe = np.where(np.isfinite(m), m, 0.0)
            coef = np.exp(c[dst_r] - m_safe[src_r]).astype(np.float32)
            g = np.zeros((len(rows), h), dtype=np.float32)
            if len(use):                 # sums over each row's pairs (contiguous, in order)
                first = np.flatnonzero(np.diff(src_r, prepend=-1))
                g[src_r[first]] = np.add.reduceat(pair_e[use] * w[dst_r] * coef[:, None],
                                                  first, axis=0)
            # EOS's term, e^{−m} ≤ 1 where EOS is live (m ≥ 0 there); nothing elsewhere: a row
            # whose successors all finish at a log scale below −709 must not read e^{−m} = inf
            # (0 · inf is nan, and the row would read as unable to finish)
            eos_scale = np.zeros(len(rows))
            eos_scale[eos_live] = np.exp(-m_safe[eos_live])
            g += eos_scale.astype(np.float32)[:, None] * eos_column
            raw = (torch.from_numpy(g) @ self._transition_t).numpy()
            mx = raw.max(1)                 # rows holds q at least (depth 0)
            ok = (mx > 0) & np.isfinite(m)
            w = np.zeros((S, h), dtype=np.float32)
            c = np.full(S, -math.inf)
            w[rows] = np.where(ok[:, None], raw / np.where(ok, mx, 1.0)[:, None], 0.0)
            c[rows] = np.where(ok, m_safe + np.log(np.where(ok, mx, 1.0).astype(np.float64)),
                               -math.inf)
        mine = [local[t] for t in feas.successors(q).tolist()]
        return _Region(torch.from_numpy(w[mine]), torch.from_numpy(c[mine]))


class HorizonRows:
    """Per-row bookkeeping of the lazy guide inside a LogitsProcessor: each row's automaton state
    and HMM prior, found from its parent's (the row's generated tokens less the last) kept from
    the previous call, so beam reordering and duplication need nothing else; a row whose parent
    is unknown is replayed from its tokens. Rows with the same tokens share one evaluation."""

    def __init__(self, guides: list[HorizonGuide]):
        self.guides = guides
        self.reset()

    def reset(self) -> None:
        self._known: dict[tuple, tuple] = {}       # (guide, tokens) -> (state, prior)

    def _state(self, g: int, tokens: tuple):
        got = self._known.get((g, tokens))
        if got is not None:
            return got
        guide = self.guides[g]
        if tokens:
            state, prior = self._state(g, tokens[:-1])
            state = guide.dfa.step(state, tokens[-1]) if state != DEAD else DEAD
            prior = None if prior is None else guide.advance_prior(prior, tokens[-1])
        else:
            state = guide.dfa.initial
            prior = None if guide.hmm is None else guide.initial_prior()
        self._known[(g, tokens)] = (state, prior)
        return state, prior

    def log_ratios(self, generated: torch.Tensor, guide_of_row: np.ndarray, remaining: int,
                   use_hmm: bool = True) -> torch.Tensor:
        """float32 [R, V]: :meth:`HorizonGuide.log_ratio` of every row of ``generated`` [R, L]
        (its tokens so far) with ``remaining`` tokens left; ``use_hmm`` False: masks only."""
        rows = [tuple(r) for r in generated.tolist()]
        keep = {}
        out = []
        done: dict = {}
        for tokens, g in zip(rows, guide_of_row.tolist()):
            key = (g, tokens)
            if key not in done:
                state, prior = self._state(g, tokens)
                keep[key] = (state, prior)
                done[key] = self.guides[g].log_ratio(state, prior if use_hmm else None, remaining)
            out.append(done[key])
        self._known = keep               # only this step's rows can be parents next time
        return torch.stack(out)
