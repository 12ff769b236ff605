"""DFA minimisation over token classes (Moore's partition refinement, vectorised with numpy).

Tokens with identical exception signatures in every state behave identically, so the automaton
is first rewritten over its token classes (:func:`ctrlg.dfa.core.token_classes`): a dense table
``[S, C]`` with C usually far below V (all tokens that are an exception nowhere form one class).

After dropping unreachable states, Moore's algorithm refines the partition {accepting,
non-accepting}: two states stay in one block iff they are in the same block and, for every class,
their successors are in the same block. Each round gives the rows
``(block[s], block[δ(s, c)] for c)`` dense ids (one ``np.unique`` over the rows viewed as
byte strings); the partition is stable after at most S rounds. The stable
partition is the Myhill–Nerode equivalence on reachable states, so the quotient automaton is the
unique minimal complete DFA for the language (all dead states collapse into one).

Moore needs as many rounds as the longest shortest distinguishing string: a counter automaton
(``length(0, 4000)``, ``word_count(0, 4000)``) needs thousands of O(S·C) rounds — quadratic. So
after :data:`MOORE_ROUNDS` vectorised rounds an unfinished refinement continues with **Hopcroft's
algorithm** (1971) from Moore's current partition: a worklist of splitters (block, class); each
one splits every block by "successor under the class lies in the splitter", and only the smaller
half of a split block is queued again, so each state enters O(log S) splitters per class:
O(C·S·log S) in all. Pairs whose preimage is empty are never queued, so a split costs the
in-edges of its smaller half, not a pass over all C classes (see :func:`hopcroft_refine`). Starting from any partition that refines {accepting, rejecting} and is
refined by Myhill–Nerode (every Moore round is one), with every (block, class) pair queued, it
ends at the coarsest stable refinement: the same Myhill–Nerode partition.
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.core import TokenDFA, bfs_order, distinct_edges, token_classes

__all__ = ["minimize", "minimize_table", "moore_partition", "hopcroft_refine"]

# Vectorised Moore rounds before switching to Hopcroft (shallow automata finish within them).
MOORE_ROUNDS = 24
#: ... and at most this many table entries over all rounds (a round costs S·C; a long literal's
#: class count grows with its length, so S·C does too)
MOORE_BUDGET = 20_000_000


def _row_ids(rows: np.ndarray) -> np.ndarray:
    """Dense ids of the distinct rows of a 2-D int array (rows compared as byte strings)."""
    rows = np.ascontiguousarray(rows)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    return np.unique(keys, return_inverse=True)[1].ravel()


def moore_partition(table: np.ndarray, accepting: np.ndarray,
                    max_rounds: int | None = MOORE_ROUNDS) -> np.ndarray:
    """Block id of every state in the coarsest partition that separates accepting from
    non-accepting states and is compatible with the successor table ``[S, C]`` (Moore rounds,
    then :func:`hopcroft_refine` if ``max_rounds`` did not suffice; ``None``: Moore only)."""
    block = np.unique(np.asarray(accepting, dtype=np.int64), return_inverse=True)[1].ravel()
    count = int(block.max()) + 1
    rounds = 0
    while True:
        if max_rounds is not None and rounds >= max_rounds:
            return hopcroft_refine(table, block)
        new_block = _row_ids(np.concatenate([block[:, None], block[table]], axis=1))
        new_count = int(new_block.max()) + 1
        rounds += 1
        if new_count == count:
            return block
        block, count = new_block, new_count


def hopcroft_refine(table: np.ndarray, block: np.ndarray, sink: int | None = None) -> np.ndarray:
    """The coarsest refinement of the partition ``block`` [S] that is stable under the successor
    table ``[S, C]`` (Hopcroft's algorithm, module docstring). Blocks are contiguous segments of
    one state array; marking a state swaps it to the front of its segment, so a split costs the
    size of its marked part. Returns dense block ids.

    Splitters (block B, class c) are queued only where some state of B has a predecessor under c
    (an empty preimage splits nothing). Initially, for each class, every block but the one with
    the most predecessors under it is queued (stability under all blocks but one implies it under
    the last: their union's preimage is everything). A split keeps the larger half under the old
    id and gives the smaller one a new id, queued under every class entering it: if (B, c) was
    queued, both halves now are; if not, the smaller one suffices. Each state therefore moves
    O(log S) times and each move costs its entering classes: O(E log S) for the E distinct
    (class, target) pairs, never a pass over all C classes per split (which made a chain — a
    long literal, whose class count grows with its length — quadratic).

    ``sink``: a block whose states are all equivalent and whose successors all lie in it (the
    states that cannot reach acceptance). It never splits, so it can be the block left out for
    every class; edges into it are then never followed and not even indexed, so the work and
    memory are those of the edges into the other states (a literal's token DFA sends almost
    every (state, class) to the dead state)."""
    table = np.asarray(table, dtype=np.int64)
    S, C = table.shape
    block = np.asarray(block, dtype=np.int64)
    indexed = np.ones(S, dtype=bool) if sink is None else block != sink   # targets indexed
    block = np.unique(block, return_inverse=True)[1].ravel()
    src, cls = np.nonzero(indexed[table])
    keys = cls.astype(np.int64) * S + table[src, cls]    # (class, target), targets not in sink
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    present, counts = np.unique(sorted_keys, return_counts=True)
    starts_of = np.searchsorted(sorted_keys, present)
    pred_ptr = dict(zip(present.tolist(), zip(starts_of.tolist(), (starts_of + counts).tolist())))
    preds = src[order].tolist()                          # predecessors grouped by (class, target)
    by_target = np.lexsort((present // S, present % S))
    in_targets, in_cls = present[by_target] % S, present[by_target] // S
    in_ptr = np.searchsorted(in_targets, np.arange(S + 1)).tolist()
    in_cls_list = in_cls.tolist()                        # classes entering each state, by state
    elems = np.argsort(block, kind="stable")
    loc = np.empty(S, dtype=np.int64)
    loc[elems] = np.arange(S)
    sizes = np.bincount(block)
    ends = np.cumsum(sizes).tolist()
    starts = [0] + ends[:-1]
    # initial splitters: per class, every block with predecessors under it but the largest
    # (or but the sink, whose edges are not indexed)
    nb = len(starts)
    pair = (present // S) * nb + block[present % S]               # class·nb + block
    pair_ids, pair_index = np.unique(pair, return_inverse=True)
    weight = np.bincount(pair_index.ravel(), weights=counts)
    cls_of, blk_of = pair_ids // nb, pair_ids % nb
    if sink is not None:
        keep = np.arange(len(pair_ids))
    else:
        top = np.lexsort((-weight, cls_of))               # per class, heaviest block first
        first = np.ones(len(top), dtype=bool)
        first[1:] = cls_of[top][1:] != cls_of[top][:-1]
        keep = top[~first]
    queued: list[set[int]] = [set() for _ in range(nb)]
    for b, c in zip(blk_of[keep].tolist(), cls_of[keep].tolist()):
        queued[b].add(c)
    waiting = [(b, c) for b in range(nb) for c in queued[b]]
    elems, loc, block_of = elems.tolist(), loc.tolist(), block.tolist()
    while waiting:
        splitter, c = waiting.pop()
        queued[splitter].discard(c)
        base = c * S
        marked: dict[int, int] = {}
        for target in elems[starts[splitter]:ends[splitter]]:
            lo_hi = pred_ptr.get(base + target)
            if lo_hi is None:
                continue
            for k in range(*lo_hi):
                s = preds[k]
                b = block_of[s]
                m = marked.get(b, 0)
                j = starts[b] + m                        # swap s to the front of its block
                other, pos = elems[j], loc[s]
                elems[pos], elems[j] = other, s
                loc[other], loc[s] = pos, j
                marked[b] = m + 1
        for b, m in marked.items():
            size = ends[b] - starts[b]
            if m == size:
                continue                                 # every state of b is marked: no split
            new = len(starts)
            if 2 * m <= size:                            # the marked front part is smaller
                starts.append(starts[b])
                ends.append(starts[b] + m)
                starts[b] += m
            else:                                        # the unmarked back part is smaller
                starts.append(starts[b] + m)
                ends.append(ends[b])
                ends[b] = starts[b] + m
            entering: set[int] = set()
            for i in range(starts[new], ends[new]):
                s = elems[i]
                block_of[s] = new
                entering.update(in_cls_list[in_ptr[s]:in_ptr[s + 1]])
            queued.append(entering)
            waiting.extend((new, a) for a in entering)
    return np.asarray(block_of, dtype=np.int64)


def _coreachable(table: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """bool [S]: the states from which an accepting state is reachable (a breadth-first search
    over the reversed distinct edges, in scipy's C code, from a virtual node before them)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order

    S = table.shape[0]
    src, dst = distinct_edges(table)
    acc = np.flatnonzero(accepting)
    rows = np.concatenate([dst, np.full(len(acc), S)])          # reversed: dst → src
    cols = np.concatenate([src, acc])
    graph = csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(S + 1, S + 1))
    order = breadth_first_order(graph, S, directed=True, return_predecessors=False)
    live = np.zeros(S + 1, dtype=bool)
    live[order] = True
    return live[:S]


def _partition(table: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """Myhill–Nerode blocks of a reachable class-level automaton: the states that cannot reach
    acceptance form one closed block (the sink), the others start as {accepting, rejecting};
    Moore rounds refine while they are cheap (at most :data:`MOORE_ROUNDS`, and at most
    :data:`MOORE_BUDGET` table entries in all), then :func:`hopcroft_refine` finishes with the
    sink left out of its index."""
    S, C = table.shape
    live = _coreachable(table, accepting)
    block = np.where(live, np.where(accepting, 1, 2), 0).astype(np.int64)
    block = np.unique(block, return_inverse=True)[1].ravel()
    sink = int(block[np.flatnonzero(~live)[0]]) if (~live).any() else None
    count = int(block.max()) + 1
    rounds = 0
    while rounds < MOORE_ROUNDS and (rounds + 1) * S * C <= MOORE_BUDGET:
        new_block = _row_ids(np.concatenate([block[:, None], block[table]], axis=1))
        rounds += 1
        new_count = int(new_block.max()) + 1
        if new_count == count:
            return block
        block, count = new_block, new_count
        if sink is not None:
            sink = int(block[np.flatnonzero(~live)[0]])
    return hopcroft_refine(table, block, sink=sink)


def minimize_table(table: np.ndarray, accepting: np.ndarray, initial: int):
    """Minimise a class-level automaton ``[S, C]``: returns ``(table, accepting)`` of the minimal
    complete DFA with initial state 0 and states in BFS order."""
    table = np.asarray(table, dtype=np.int64)
    accepting = np.asarray(accepting, dtype=bool)
    S, C = table.shape
    reach = bfs_order(initial, *distinct_edges(table), S)        # reachable states only
    old_to_sub = np.full(S, -1, dtype=np.int64)
    old_to_sub[reach] = np.arange(len(reach))
    sub = old_to_sub[table[reach]]
    block = _partition(sub, accepting[reach])
    nblocks = int(block.max()) + 1
    representative = np.zeros(nblocks, dtype=np.int64)
    representative[block[::-1]] = np.arange(len(block))[::-1]      # first state of each block
    quotient = block[sub[representative]]
    block_accepting = accepting[reach][representative]
    start = int(block[0])
    order = bfs_order(start, *distinct_edges(quotient), nblocks)
    new_id = np.empty(nblocks, dtype=np.int64)
    new_id[order] = np.arange(nblocks)
    return new_id[quotient[order]], block_accepting[order]


def minimize(dfa: TokenDFA) -> TokenDFA:
    """The minimal complete DFA accepting the same language (states renumbered in BFS order from
    the initial state; at most one dead state)."""
    classes = token_classes(dfa)
    table, accepting = minimize_table(dfa.class_table(classes), dfa.accepting, dfa.initial)
    return TokenDFA.from_class_table(table, accepting, classes, 0)
