"""Regex AST → byte-level DFA over the 256 byte values.

Three classical steps:

1. **UTF-8 encoding of code-point sets** (as in Rust's ``utf8-ranges``): a set of code-point
   ranges is split into sequences of byte ranges ``[b1_lo-b1_hi][b2_lo-b2_hi]...`` so that a code
   point is in the set iff its UTF-8 encoding matches one of the sequences.
2. **Thompson's construction** of an ε-NFA whose edges are labelled by byte ranges.
3. **Subset construction** (Rabin–Scott) into a complete DFA ``table[q, byte]`` followed by
   **Moore's partition refinement** to the minimal DFA.

State 0 of every :class:`ByteDFA` is the dead (absorbing, non-accepting) state, so ``table``
can be used without bounds checks: ``table[0, :] == 0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ctrlg.dfa.core import ragged_indices
from ctrlg.dfa.minimize import hopcroft_refine
from ctrlg.dfa.regex_syntax import Alternation, CharSet, Concat, Node, Repeat, parse
from ctrlg.errors import RegexError

__all__ = ["ByteDFA", "ByteNFA", "compile_bytes_dfa", "utf8_sequences", "DEAD", "Budget",
           "AutomatonTooLarge"]

DEAD = 0
MAX_NFA_STATES = 500_000
MAX_DFA_STATES = 200_000
#: rounds of the worklist refinement before Hopcroft's algorithm finishes it: a chain (a long
#: literal, a counter) splits one state per round, and each round costs a few numpy calls
WORKLIST_ROUNDS = 64

_UTF8_LIMITS = ((0x0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF))


# ---------------------------------------------------------------------- UTF-8 byte ranges
def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose union is exactly the UTF-8 encodings of code points
    ``lo..hi`` (inclusive). Surrogates must already be removed."""
    out: list[list[tuple[int, int]]] = []
    stack = [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        # split at encoding-length boundaries
        split = False
        for a, b in _UTF8_LIMITS:
            if lo <= b < hi and lo >= a:
                stack.append((b + 1, hi))
                stack.append((lo, b))
                split = True
                break
        if split:
            continue
        if hi <= 0x7F:
            out.append([(lo, hi)])
            continue
        # split so that all but a prefix of bytes span full continuation ranges
        done = False
        for i in range(1, 4):
            mask = (1 << (6 * i)) - 1
            if lo & ~mask != hi & ~mask:
                if lo & mask != 0:
                    stack.append(((lo | mask) + 1, hi))
                    stack.append((lo, lo | mask))
                    done = True
                    break
                if hi & mask != mask:
                    stack.append((hi & ~mask, hi))
                    stack.append((lo, (hi & ~mask) - 1))
                    done = True
                    break
        if done:
            continue
        a, b = _encode(lo), _encode(hi)
        assert len(a) == len(b)
        out.append([(x, y) for x, y in zip(a, b)])
    out.sort()
    return out


# ---------------------------------------------------------------------- Thompson NFA
class ByteNFA:
    """ε-NFA with byte-range edges. ``edges[s]`` = sequence of ``(lo, hi, target)``,
    ``eps[s]`` = sequence of ε-targets. The construction adds to them with ``+=`` and a tuple,
    so a subclass may store a state's edges as tuples: the lazy NFA does
    (:class:`~ctrlg.dfa.lazy_nfa.LazyThompsonNFA`), as the garbage collector stops tracking
    tuples of numbers."""

    def __init__(self):
        self.edges: list[Sequence[tuple[int, int, int]]] = []
        self.eps: list[Sequence[int]] = []

    def add_state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise AutomatonTooLarge(f"regex automaton exceeds {MAX_NFA_STATES} NFA states; "
                             "reduce repetition bounds")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def build(self, node: Node, start: int, end: int) -> None:
        """Add a fragment from ``start`` to ``end`` recognising ``node``."""
        if isinstance(node, CharSet):
            self._charset(node, start, end)
        elif isinstance(node, Concat):
            if not node.items:
                self.eps[start] += (end,)
                return
            cur = start
            for k, item in enumerate(node.items):
                nxt = end if k == len(node.items) - 1 else self.add_state()
                self.build(item, cur, nxt)
                cur = nxt
        elif isinstance(node, Alternation):
            for item in node.items:
                s, e = self.add_state(), self.add_state()
                self.eps[start] += (s,)
                self.build(item, s, e)
                self.eps[e] += (end,)
        elif isinstance(node, Repeat):
            self._repeat(node, start, end, lambda s, e: self.build(node.item, s, e))
        else:  # pragma: no cover - parser produces only the node types above
            raise TypeError(f"unknown regex node {node!r}")

    def _repeat(self, node: Repeat, start: int, end: int, item) -> None:
        """Thompson's construction of ``x{min,max}`` (``max`` None: ``x{min,}``) between ``start``
        and ``end``: ``min`` copies in a row, then a loop ``x*`` or ``max - min`` optional
        copies, each with an epsilon to ``end``. ``item(s, e)`` wires one copy of ``x`` from
        state ``s`` to state ``e``."""
        cur = start
        for _ in range(node.min):
            nxt = self.add_state()
            item(cur, nxt)
            cur = nxt
        if node.max is None:
            loop_s, loop_e = self.add_state(), self.add_state()
            self.eps[cur] += (loop_s,)
            item(loop_s, loop_e)
            self.eps[loop_e] += (loop_s,)
            self.eps[loop_s] += (end,)
        else:
            for _ in range(node.max - node.min):
                self.eps[cur] += (end,)
                nxt = self.add_state()
                item(cur, nxt)
                cur = nxt
            self.eps[cur] += (end,)

    def _charset(self, node: CharSet, start: int, end: int) -> None:
        # share intermediate states by byte-prefix (a trie of byte-range sequences)
        trie: dict[tuple[tuple[int, int], ...], int] = {(): start}
        for lo, hi in node.ranges:
            for seq in utf8_sequences(lo, hi):
                for k in range(len(seq)):
                    key = tuple(seq[:k + 1])
                    if k == len(seq) - 1:
                        self.edges[trie[tuple(seq[:k])]] += ((seq[k][0], seq[k][1], end),)
                    elif key not in trie:
                        t = self.add_state()
                        trie[key] = t
                        self.edges[trie[tuple(seq[:k])]] += ((seq[k][0], seq[k][1], t),)


# ---------------------------------------------------------------------- DFA
@dataclass(frozen=True)
class ByteDFA:
    """A complete DFA over bytes. ``table`` int32 [Q, 256]; state 0 is dead; ``initial`` is the
    start state; ``accepting`` bool [Q]."""

    table: np.ndarray
    accepting: np.ndarray
    initial: int

    @property
    def num_states(self) -> int:
        return self.table.shape[0]

    def run(self, data: bytes, state: int | None = None) -> int:
        q = self.initial if state is None else state
        for b in data:
            q = int(self.table[q, b])
        return q

    def fullmatch(self, data: bytes) -> bool:
        return bool(self.accepting[self.run(data)])

    def live(self) -> np.ndarray:
        """Bool [Q]: states from which an accepting state is reachable."""
        return _live(self.table, self.accepting)

    def is_empty(self) -> bool:
        return not bool(self.live()[self.initial])


def _hash_weights(n: int, seed: int) -> np.ndarray:
    """``n`` odd pseudo-random uint64 weights of a linear hash mod 2^64."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, 2**63, size=n, dtype=np.uint64) | np.uint64(1)


def _distinct_columns(table: np.ndarray) -> np.ndarray:
    """Sorted indices of the first of each group of equal columns of ``table`` [Q, 256]
    (bytes that act alike in every state). Columns are hashed by a random linear form (in
    floating point: rounding can only merge columns, which the check catches) and grouped by
    hash; groups are then checked column by column (exact ``np.unique`` on a
    collision)."""
    weights = np.random.default_rng(0xC01).random(table.shape[0]) + 0.5
    hashes = table.T.astype(np.float64) @ weights              # one BLAS product
    _, first, group = np.unique(hashes, return_index=True, return_inverse=True)
    if np.array_equal(table, table[:, first[group.reshape(-1)]]):
        return np.sort(first)
    _, first = np.unique(table.T, axis=0, return_index=True)
    return np.sort(first)


def _live(table: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """Backward breadth-first search from the accepting states over the distinct edges into
    states other than the dead state 0 (bytes that act alike are one column): O(edges), not
    O(depth · Q · 256) as a fixed-point iteration would be."""
    table = np.asarray(table)
    Q = table.shape[0]
    compact = table[:, _distinct_columns(table)]
    src, column = np.nonzero(compact)
    dst = compact[src, column].astype(np.int64)
    order = np.argsort(dst, kind="stable")
    src, dst = src[order].astype(np.int64), dst[order]
    ptr = np.searchsorted(dst, np.arange(Q + 1))
    live = np.asarray(accepting, dtype=bool).copy()
    live[DEAD] = False
    frontier = np.flatnonzero(live)
    while len(frontier):
        counts = ptr[frontier + 1] - ptr[frontier]
        total = int(counts.sum())
        if not total:
            break
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        preds = src[np.repeat(ptr[frontier], counts) + offsets]
        preds = np.unique(preds[~live[preds]])
        live[preds] = True
        frontier = preds
    return live


def _closure(nfa: ByteNFA, states) -> frozenset[int]:
    seen = set(states)
    stack = list(states)
    while stack:
        s = stack.pop()
        for t in nfa.eps[s]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return frozenset(seen)


class AutomatonTooLarge(RegexError):
    """A subset construction that ran past its state bound or its :class:`Budget`."""


@dataclass
class Budget:
    """What a sequence of subset constructions may still spend, fixed before the first starts:
    ``states`` DFA states in all and ``work`` NFA-state entries summed over their subsets (the
    memory the subsets hold and the time their ε-closures take). :func:`determinize` charges
    each new DFA state against it and raises :class:`AutomatonTooLarge` once either runs out,
    so the whole sequence is bounded in time and memory however large its automata would grow."""

    states: int
    work: int

    def charge(self, subset_size: int, states: int = 1) -> None:
        """Spend ``states`` DFA states and ``subset_size`` work (NFA states built or held)."""
        self.states -= states
        self.work -= subset_size
        if self.states < 0 or self.work < 0:
            raise AutomatonTooLarge("the subset construction ran out of its budget of states "
                                    "and work")


def determinize(nfa: ByteNFA, start: int, accept: int, budget: Budget | None = None) -> ByteDFA:
    """Subset construction; state 0 is the dead state (the empty set). With ``budget``, every
    new state is charged to it (:class:`Budget`)."""
    init = _closure(nfa, [start])
    if budget is not None:
        budget.charge(len(init))
    index: dict[frozenset[int], int] = {frozenset(): DEAD, init: 1}
    order = [frozenset(), init]
    rows = [np.zeros(256, dtype=np.int32)]
    head = 1
    while head < len(order):
        subset = order[head]
        head += 1
        row = np.zeros(256, dtype=np.int32)
        edges = [e for s in subset for e in nfa.edges[s]]
        if edges:
            cuts = sorted({lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
            for a, b in zip(cuts, cuts[1:]):
                targets = [t for lo, hi, t in edges if lo <= a and b - 1 <= hi]
                if not targets:
                    continue
                target = _closure(nfa, targets)
                q = index.get(target)
                if q is None:
                    q = len(order)
                    if q >= MAX_DFA_STATES:
                        raise AutomatonTooLarge(f"regex byte DFA exceeds {MAX_DFA_STATES} states")
                    if budget is not None:
                        budget.charge(len(target))
                    index[target] = q
                    order.append(target)
                row[a:b] = q
        rows.append(row)
    table = np.stack(rows)
    accepting = np.array([accept in s for s in order], dtype=bool)
    return ByteDFA(table=table, accepting=accepting, initial=1)


#: automata with at most this many states are minimised by :func:`_small_partition` (whole-table
#: rounds: fewer numpy calls than the worklist's bookkeeping, which costs ~0.7 ms however small)
SMALL_DFA_STATES = 64


def minimize(dfa: ByteDFA) -> ByteDFA:
    """Moore's partition refinement, then renumbering in BFS order from the initial state
    (dead state first, id 0). Unreachable states are dropped; all dead states merge into 0."""
    small = dfa.num_states <= SMALL_DFA_STATES
    live = _small_live(dfa.table, dfa.accepting) if small else dfa.live()
    table = np.where(live[dfa.table], dfa.table, DEAD)
    table[~live] = DEAD
    # initial partition: dead / live-accepting / live-rejecting
    block = np.where(~live, 0, np.where(dfa.accepting, 1, 2)).astype(np.int64)
    if small:
        block = _small_partition(block, table)
    else:
        # bytes that act identically in every state form one column (byte class)
        block = _refine(block, table[:, _distinct_columns(table)])
    # BFS renumbering (level by level, each level in the order a sequential BFS over the blocks'
    # rows, byte by byte, discovers it); the dead block gets id 0
    num_blocks = int(block.max()) + 1
    rep = _first_members(block)
    block_table = block[table[rep]]                          # [blocks, 256]
    new_id = np.full(num_blocks, -1, dtype=np.int64)
    new_id[block[DEAD]] = 0
    count = 1
    initial_block = int(block[dfa.initial])
    if new_id[initial_block] < 0:
        new_id[initial_block] = count
        count += 1
    frontier = np.array([initial_block], dtype=np.int64)
    while len(frontier):
        found = block_table[frontier].reshape(-1)
        found = found[new_id[found] < 0]
        if not len(found):
            break
        _, first = np.unique(found, return_index=True)
        frontier = found[np.sort(first)]
        new_id[frontier] = count + np.arange(len(frontier))
        count += len(frontier)
    reached = np.flatnonzero(new_id >= 0)
    new_table = np.zeros((count, 256), dtype=np.int32)
    new_table[new_id[reached]] = new_id[block_table[reached]]
    new_table[0] = 0
    accepting = np.zeros(count, dtype=bool)
    accepting[new_id[reached]] = dfa.accepting[rep[reached]] & live[rep[reached]]
    return ByteDFA(table=new_table, accepting=accepting, initial=int(new_id[initial_block]))


def _small_live(table: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """:func:`_live` for a small automaton: the fixed point of "accepting, or some byte leads
    to a live state" over the whole table (at most Q rounds of one [Q, 256] gather)."""
    live = np.asarray(accepting, dtype=bool).copy()
    live[DEAD] = False
    while True:
        grown = live | live[table].any(1)
        grown[DEAD] = False
        if (grown == live).all():
            return live
        live = grown


def _small_partition(block: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Moore's refinement for a small automaton: each round splits every block by its states'
    rows of successor blocks (one dictionary of the [Q, 257] keys' bytes) until no block
    splits. The coarsest stable partition is unique, so it is :func:`_refine`'s; block ids
    here are in order of first appearance (state 0 first)."""
    Q = len(block)
    count = len(np.unique(block))
    while True:
        keys = np.ascontiguousarray(np.concatenate([block[:, None], block[table]], axis=1))
        ids: dict = {}
        block = np.fromiter((ids.setdefault(row.tobytes(), len(ids)) for row in keys),
                            dtype=np.int64, count=Q)
        if len(ids) == count:
            return block
        count = len(ids)


def _first_members(block: np.ndarray) -> np.ndarray:
    """int64 [blocks]: the smallest state of each block (``block`` gives dense ids)."""
    rep = np.zeros(int(block.max()) + 1, dtype=np.int64)
    rep[block[::-1]] = np.arange(len(block) - 1, -1, -1)
    return rep


def _refine(block: np.ndarray, compact: np.ndarray) -> np.ndarray:
    """Moore's partition refinement with a worklist: split blocks by their successors' blocks
    until stable, recomputing only the states whose successors moved.

    A state's *key* hashes its successors' blocks to one 64-bit number, a random linear form
    mod 2^64 (odd weights; edges into the dead block 0 add 0). Members of a block that have not
    been touched since it last split share one key (``block_key``), so a round only looks at the
    predecessors of the states that moved: those whose key differs from their block's are split
    off, grouped by (block, key); a block whose touched members all agree on a new key and
    cover it keeps its id. Each round therefore costs O(edges of the touched states), and deep
    automata (long counters: a JSON string of ≤ 128 characters) need no O(Q) pass per level.

    A hash collision can only merge states that differ; the final partition is checked to be
    stable (every state's successor blocks and initial block equal its block representative's)
    and on a collision the exact row comparison is used instead. ``block`` must give the dead
    states block 0. After :data:`WORKLIST_ROUNDS` rounds (a chain splits one state per round,
    and a changed majority of a block moves while its untouched minority keeps the id, so a
    round may cost a whole block) the partition so far is finished by :func:`_hopcroft`."""
    initial_block = block
    Q = len(block)
    weights = _hash_weights(compact.shape[1], seed=0x5EED)
    state, column = np.nonzero(compact)
    target = compact[state, column].astype(np.int64)
    edge_weight = weights[column]
    fwd_ptr = np.searchsorted(state, np.arange(Q + 1))
    order = np.argsort(target, kind="stable")
    pred, pred_ptr = state[order].astype(np.int64), np.searchsorted(target[order], np.arange(Q + 1))

    def keys_of(states, block):
        counts = fwd_ptr[states + 1] - fwd_ptr[states]
        edges = ragged_indices(fwd_ptr[states], counts)
        contrib = edge_weight[edges] * block[target[edges]].astype(np.uint64)
        out = np.zeros(len(states), dtype=np.uint64)
        has = counts > 0
        if has.any():
            starts = (np.cumsum(counts) - counts)[has]
            out[has] = np.add.reduceat(contrib, starts)
        return out

    # first round over every state: blocks = distinct (initial block, key)
    keys = keys_of(np.arange(Q), block)
    pairs = np.stack([block.astype(np.uint64), keys], axis=1)
    _, block = np.unique(pairs, axis=0, return_inverse=True)   # dead (0, 0) sorts first: 0
    block = block.reshape(-1).astype(np.int64)
    num_blocks = int(block.max()) + 1
    block_key = np.zeros(Q + 1, dtype=np.uint64)       # capacity for every block there can be
    block_key[block] = keys
    block_size = np.zeros(Q + 1, dtype=np.int64)
    block_size[:num_blocks] = np.bincount(block, minlength=num_blocks)
    moved = np.arange(Q)
    rounds = 0
    while len(moved):
        rounds += 1
        if rounds > WORKLIST_ROUNDS:       # a long chain: finish with Hopcroft (exact)
            return _hopcroft(compact, block)
        counts = pred_ptr[moved + 1] - pred_ptr[moved]
        touched = np.unique(pred[ragged_indices(pred_ptr[moved], counts)])
        if not len(touched):
            break
        new_keys = keys_of(touched, block)
        keys[touched] = new_keys
        differ = touched[new_keys != block_key[block[touched]]]
        if not len(differ):
            break
        # groups of (block, new key) among the states whose key left their block's
        order = np.lexsort((keys[differ], block[differ]))
        differ = differ[order]
        b, k = block[differ], keys[differ]
        first = np.ones(len(differ), dtype=bool)
        first[1:] = (b[1:] != b[:-1]) | (k[1:] != k[:-1])
        group = np.cumsum(first) - 1
        group_start = np.flatnonzero(first)
        group_size = np.diff(np.append(group_start, len(differ)))
        group_block = b[group_start]
        # a block left with no untouched members keeps its id for its largest group
        # per round only the blocks touched are visited (a pass over all blocks per round made
        # a chain — one split per round — quadratic)
        split_blocks, group_of_block = np.unique(group_block, return_inverse=True)
        moved_total = np.bincount(group_of_block.ravel(), weights=group_size)
        emptied = moved_total[group_of_block.ravel()] == block_size[group_block]
        largest = np.zeros(len(group_start), dtype=bool)
        if emptied.any():
            cand = np.flatnonzero(emptied)
            # per emptied block, its largest group (ties: the first) stays
            order2 = np.lexsort((-group_size[cand], group_block[cand]))
            cand = cand[order2]
            head = np.ones(len(cand), dtype=bool)
            head[1:] = group_block[cand][1:] != group_block[cand][:-1]
            largest[cand[head]] = True
        stay_groups = np.flatnonzero(largest)
        block_key[group_block[stay_groups]] = k[group_start[stay_groups]]
        go = ~largest
        new_ids = np.full(len(group_start), -1, dtype=np.int64)
        new_ids[go] = num_blocks + np.arange(int(go.sum()))
        block_key[new_ids[go]] = k[group_start[go]]
        block_size[new_ids[go]] = group_size[go]
        num_blocks += int(go.sum())
        moving = go[group]
        moved = differ[moving]
        np.subtract.at(block_size, group_block[go], group_size[go])
        block[moved] = new_ids[group[moving]]
    _, block = np.unique(block, return_inverse=True)     # dense ids; the dead block stays 0
    block = block.reshape(-1).astype(np.int64)
    rep = _first_members(block)
    stable = np.array_equal(block[compact], block[compact[rep[block]]])
    if stable and np.array_equal(initial_block, initial_block[rep[block]]):
        return block
    return _refine_exact(initial_block, compact)


def _hopcroft(compact: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Finish the refinement of ``block`` (a partition every round of :func:`_refine` keeps
    between the initial one and Myhill–Nerode) with Hopcroft's algorithm
    (:func:`ctrlg.dfa.minimize.hopcroft_refine`, O(E log Q)); dense ids, the dead block 0."""

    out = hopcroft_refine(compact.astype(np.int64), block)
    dead = int(out[DEAD])
    swapped = out.copy()
    swapped[out == dead], swapped[out == 0] = 0, dead
    return swapped


def _refine_exact(block: np.ndarray, compact: np.ndarray) -> np.ndarray:
    """Moore's rounds with exact signatures (``np.unique`` over whole rows)."""
    num_blocks = len(np.unique(block))
    while True:
        signature = np.ascontiguousarray(
            np.concatenate([block[:, None], block[compact]], axis=1))
        keys = signature.view(np.dtype((np.void, signature.dtype.itemsize * signature.shape[1])))
        _, new_block = np.unique(keys.reshape(-1), return_inverse=True)
        new_block = new_block.reshape(-1).astype(np.int64)
        count = int(new_block.max()) + 1
        block = new_block
        if count == num_blocks:
            return block
        num_blocks = count


def compile_ast(node: Node) -> ByteDFA:
    nfa = ByteNFA()
    start, accept = nfa.add_state(), nfa.add_state()
    nfa.build(node, start, accept)
    return minimize(determinize(nfa, start, accept))


def compile_bytes_dfa(pattern: str) -> ByteDFA:
    """Minimal byte-level DFA of the full-match language of ``pattern`` (UTF-8 encoded).

    Raises RegexError / UnsupportedRegexError (see :mod:`ctrlg.dfa.regex_syntax`)."""
    return compile_ast(parse(pattern))
