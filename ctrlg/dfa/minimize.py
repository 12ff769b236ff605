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
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.core import TokenDFA, bfs_order, token_classes

__all__ = ["minimize", "minimize_table", "moore_partition"]


def _row_ids(rows: np.ndarray) -> np.ndarray:
    """Dense ids of the distinct rows of a 2-D int array (rows compared as byte strings)."""
    rows = np.ascontiguousarray(rows)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    return np.unique(keys, return_inverse=True)[1].ravel()


def moore_partition(table: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """Block id of every state in the coarsest partition that separates accepting from
    non-accepting states and is compatible with the successor table ``[S, C]``."""
    block = np.unique(np.asarray(accepting, dtype=np.int64), return_inverse=True)[1].ravel()
    count = int(block.max()) + 1
    while True:
        new_block = _row_ids(np.concatenate([block[:, None], block[table]], axis=1))
        new_count = int(new_block.max()) + 1
        if new_count == count:
            return block
        block, count = new_block, new_count


def minimize_table(table: np.ndarray, accepting: np.ndarray, initial: int):
    """Minimise a class-level automaton ``[S, C]``: returns ``(table, accepting)`` of the minimal
    complete DFA with initial state 0 and states in BFS order."""
    table = np.asarray(table, dtype=np.int64)
    accepting = np.asarray(accepting, dtype=bool)
    S, C = table.shape
    src = np.repeat(np.arange(S, dtype=np.int64), C)
    reach = bfs_order(initial, src, table.ravel(), S)            # reachable states only
    old_to_sub = np.full(S, -1, dtype=np.int64)
    old_to_sub[reach] = np.arange(len(reach))
    sub = old_to_sub[table[reach]]
    block = moore_partition(sub, accepting[reach])
    nblocks = int(block.max()) + 1
    representative = np.zeros(nblocks, dtype=np.int64)
    representative[block[::-1]] = np.arange(len(block))[::-1]      # first state of each block
    quotient = block[sub[representative]]
    block_accepting = accepting[reach][representative]
    start = int(block[0])
    order = bfs_order(start, np.repeat(np.arange(nblocks), C), quotient.ravel(), nblocks)
    new_id = np.empty(nblocks, dtype=np.int64)
    new_id[order] = np.arange(nblocks)
    return new_id[quotient[order]], block_accepting[order]


def minimize(dfa: TokenDFA) -> TokenDFA:
    """The minimal complete DFA accepting the same language (states renumbered in BFS order from
    the initial state; at most one dead state)."""
    classes = token_classes(dfa)
    table, accepting = minimize_table(dfa.class_table(classes), dfa.accepting, dfa.initial)
    return TokenDFA.from_class_table(table, accepting, classes, 0)
