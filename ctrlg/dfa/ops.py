"""Boolean operations on token DFAs: intersection, union, complement and concatenation.

Every operation works on **token classes** (:func:`ctrlg.dfa.core.token_classes`): tokens whose
transitions agree in every state of every operand are one letter of a small alphabet, so a
product never iterates over the vocabulary. Products are built over **reachable pairs only**:
starting from (initial₁, initial₂), a breadth-first search over the class-level successor tables
(vectorised with numpy, one frontier at a time) discovers exactly the pairs some token string
reaches; a k-ary operation folds binary products, whose reachable pairs are projections of the
k-ary product's reachable tuples, so no intermediate has more states than there are reachable
k-tuples.

Results are **minimal** (Moore refinement over the class table, :mod:`ctrlg.dfa.minimize`; with
``minimal=False`` only trimmed: unreachable states dropped, every state that cannot reach
acceptance merged into one absorbing dead state) and are returned **over letters**: the token
classes become the result's letters, so nothing is expanded per token (the per-token view is
materialised only if a caller asks for ``exc_tokens``). Memory and time are O(S·C) for S result
states and C classes, plus O(V + E) to compute the classes.

Concatenation L₁·L₂ uses the subset construction over (state of D₁, set of D₂ states), and Ctrl-G's
Proposition 4.1 fast path when every accepting state of D₁ leads only to dead states: then a
string has at most one split point, so D₁'s accepting states can simply be replaced by D₂'s
initial state (|Q₁| + |Q₂| states, no subsets).

Sizes: a product of k automata can have the product of their sizes, and a subset construction
2^|Q₂| states, which no estimate made before the search can bound usefully; so the searches
count what they build and raise :class:`~ctrlg.errors.ConstraintError` past ``max_states``
(:data:`MAX_PRODUCT_STATES` reachable tuples of one binary product, :data:`MAX_CONCAT_STATES`
subsets). Builders whose growth is known up front check an estimate before any work instead
(:mod:`ctrlg.dfa.size_bounds`).

By default an operation whose result accepts nothing raises
:class:`~ctrlg.errors.UnsatisfiableConstraintError`; pass ``allow_empty=True`` to get the empty
automaton instead (useful while composing).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ctrlg.dfa.core import (TokenClasses, TokenDFA, bfs_order, check_same_vocab,
                            distinct_edges, ragged_indices, reachable_mask, token_classes)
from ctrlg.dfa.minimize import minimize_table
from ctrlg.dfa.canonical_filter import CanonicalDFA
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.validation import check_count

__all__ = ["intersect", "union", "complement", "concat", "product", "bfs_distances",
           "min_tokens_to_accept", "restrict_to_budget"]


# ---------------------------------------------------------------------- class-level helpers
def trim_table(table: np.ndarray, accepting: np.ndarray, initial: int):
    """Trim a class-level automaton: keep states reachable from ``initial`` that can reach
    acceptance, renumbered in BFS order (initial = 0), plus one absorbing dead state if any
    transition leads to a dead state. Returns ``(table, accepting)`` or ``None`` when the language
    is empty."""
    S, C = table.shape
    src, dst = distinct_edges(table)
    live = reachable_mask(np.nonzero(accepting)[0], dst, src, S)
    if not live[initial]:
        return None
    keep = live[src] & live[dst]
    order = bfs_order(initial, src[keep], dst[keep], S)
    n = len(order)
    new_id = np.full(S, n, dtype=np.int64)
    new_id[order] = np.arange(n, dtype=np.int64)
    out = new_id[table[order]]
    acc = np.asarray(accepting, dtype=bool)[order]
    if np.any(out == n):
        out = np.vstack([out, np.full((1, C), n, dtype=np.int64)])
        acc = np.append(acc, False)
    return out, acc


def reduce_table(table: np.ndarray, accepting: np.ndarray, initial: int, minimal: bool):
    """Minimise (``minimal``) or trim a class-level automaton; returns ``(table, accepting)``
    with initial state 0 (a single non-accepting state when the language is empty)."""
    if minimal:
        return minimize_table(table, accepting, initial)
    trimmed = trim_table(np.asarray(table, dtype=np.int64), accepting, initial)
    if trimmed is None:
        return np.zeros((1, table.shape[1]), dtype=np.int64), np.zeros(1, dtype=bool)
    return trimmed


def finish(table: np.ndarray, accepting: np.ndarray, initial: int, classes: TokenClasses,
           allow_empty: bool, what: str, minimal: bool = True) -> TokenDFA:
    """Minimise (or trim) a class-level automaton and wrap it as a :class:`TokenDFA` whose
    letters are ``classes``. Raises UnsatisfiableConstraintError for an empty language unless
    ``allow_empty``."""
    table, acc = reduce_table(table, accepting, initial, minimal)
    if not acc.any() and not allow_empty:
        raise UnsatisfiableConstraintError(
            f"the {what} is unsatisfiable: its automaton accepts no token sequence")
    return TokenDFA.from_class_table(table, acc, classes, 0)


# pair-key ranges up to this size get a "seen" bitmap (one byte per pair); larger ones a sorted
# set of reached keys (O(reached) per level)
_BITMAP_PAIRS = 1 << 25
# pair-key ranges up to this size also get a dense key → id table (8 bytes per pair)
_DENSE_IDS = 1 << 23


# Default bound on the reachable states of one product (a product of k automata can have the
# product of their sizes); about 1 GB of tables at 80 token classes.
MAX_PRODUCT_STATES = 2_000_000


def _too_many(found: int, max_states: int, sizes: tuple[int, int], what: str) -> None:
    if found > max_states:
        raise ConstraintError(
            f"the {what} of a {sizes[0]:,}-state and a {sizes[1]:,}-state automaton reaches more "
            f"than max_states={max_states:,} states (a product can have as many states as the "
            f"product of its operands' sizes); combine fewer constraints or raise max_states")


def _binary_product(t1: np.ndarray, a1: np.ndarray, i1: int, t2: np.ndarray, a2: np.ndarray,
                    i2: int, rule: Callable[[np.ndarray, np.ndarray], np.ndarray],
                    max_states: int = MAX_PRODUCT_STATES, what: str = "product"):
    """Class-level product over reachable pairs only (frontier BFS on pair keys s1·S2 + s2).
    With a bitmap of seen pairs each BFS level costs O(frontier · C), so the whole search is
    O(reached pairs · C) however deep the product is (a 4,000-token length counter is 4,000
    levels). More than ``max_states`` reached pairs raise ConstraintError."""
    S2 = np.int64(t2.shape[0])
    sizes = (t1.shape[0], t2.shape[0])
    t1 = t1.astype(np.int64)
    t2 = t2.astype(np.int64)
    start = np.array([i1 * S2 + i2], dtype=np.int64)
    frontier = start
    if t1.shape[0] * int(S2) <= _BITMAP_PAIRS:
        seen = np.zeros(t1.shape[0] * int(S2), dtype=bool)
        seen[start] = True
        levels = [start]
        found = 1
        while frontier.size:
            succ = (t1[frontier // S2] * S2 + t2[frontier % S2]).ravel()
            frontier = np.unique(succ[~seen[succ]])     # drop the seen pairs before sorting
            seen[frontier] = True
            levels.append(frontier)
            found += len(frontier)
            _too_many(found, max_states, sizes, what)
        reached = np.sort(np.concatenate(levels))
        if len(seen) <= _DENSE_IDS:                      # pair key → state id by a lookup
            ids = np.zeros(len(seen), dtype=np.int64)
            ids[reached] = np.arange(len(reached))
            table = ids[t1[reached // S2] * S2 + t2[reached % S2]]
            return (table, rule(a1[reached // S2], a2[reached % S2]),
                    int(ids[start[0]]))
    else:
        reached = start
        while frontier.size:
            succ = np.unique(t1[frontier // S2] * S2 + t2[frontier % S2])
            frontier = np.setdiff1d(succ, reached, assume_unique=True)
            reached = np.union1d(reached, frontier)
            _too_many(len(reached), max_states, sizes, what)
    table = np.searchsorted(reached, t1[reached // S2] * S2 + t2[reached % S2])
    accepting = rule(a1[reached // S2], a2[reached % S2])
    initial = int(np.searchsorted(reached, start[0]))
    return table, accepting, initial


def product(dfas: Sequence[TokenDFA], rule: Callable[[np.ndarray, np.ndarray], np.ndarray],
            what: str, allow_empty: bool = False, minimal: bool = True,
            max_states: int = MAX_PRODUCT_STATES) -> TokenDFA:
    """Fold binary products of ``dfas`` with the accepting rule ``rule(acc1, acc2)``. Each
    intermediate is minimised (or, with ``minimal=False``, trimmed: its dead states merged),
    valid for monotone rules such as ``and``/``or``, where a tuple of dead states stays dead.
    A binary product that reaches more than ``max_states`` states raises ConstraintError."""
    check_same_vocab(dfas)
    max_states = check_count("max_states", max_states, minimum=1)
    classes = token_classes(*dfas)
    tables = [d.class_table(classes) for d in dfas]
    table, acc = reduce_table(tables[0], dfas[0].accepting, dfas[0].initial, minimal)
    for d, t in zip(dfas[1:], tables[1:]):
        table, acc, init = _binary_product(table, acc, 0, t, d.accepting, d.initial, rule,
                                           max_states, what)
        table, acc = reduce_table(table, acc, init, minimal)
    return finish(table, acc, 0, classes, allow_empty, what, minimal)


# ---------------------------------------------------------------------- public operations
def intersect(*dfas: TokenDFA | CanonicalDFA, allow_empty: bool = False,
              minimal: bool = True,
              max_states: int = MAX_PRODUCT_STATES) -> TokenDFA | CanonicalDFA:
    """A DFA accepting the token sequences accepted by **all** of ``dfas`` (product automaton
    over reachable state tuples; minimised unless ``minimal=False``). Raises
    UnsatisfiableConstraintError if no sequence is accepted, unless ``allow_empty``. With a
    :class:`CanonicalDFA` among them the result is one too: ``(A ∩ B) ∩ Canon``. A product
    step that reaches more than ``max_states`` states raises ConstraintError."""
    _only_automata(dfas, "intersection")
    canonical = [d for d in dfas if isinstance(d, CanonicalDFA)]
    if canonical:
        for other in canonical[1:]:
            if other.checker is not canonical[0].checker:
                raise VocabularyMismatchError(
                    "intersect: the canonical constraints come from different tokenizers")
        inner = [d.dfa if isinstance(d, CanonicalDFA) else d for d in dfas]
        return canonical[0].with_dfa(product(inner, np.logical_and, "intersection",
                                             allow_empty, minimal, max_states))
    return product(dfas, np.logical_and, "intersection", allow_empty, minimal, max_states)


def _only_automata(dfas, operation: str) -> None:
    """ConstraintError for an operand that is not an automaton (a grammar constraint)."""
    for d in dfas:
        if not isinstance(d, (TokenDFA, CanonicalDFA)):
            raise ConstraintError(
                f"{operation} takes token DFAs, got a {type(d).__name__}; a context-free "
                f"grammar cannot be combined with automata: write the combination into the "
                f"grammar's own rules instead")


def _no_canonical(dfas, operation: str) -> None:
    """ConstraintError for a CanonicalDFA given to an operation that does not distribute over
    the canonical filter (and for operands that are not automata)."""
    _only_automata(dfas, operation)
    if any(isinstance(d, CanonicalDFA) for d in dfas):
        raise ConstraintError(
            f"{operation} of a canonical-encodings constraint built without the product "
            f"automaton (a CanonicalDFA) is not supported: canonicality does not distribute over "
            f"{operation}. Build the regex with encodings='all', or combine the patterns into "
            f"one regex before compiling it")


def union(*dfas: TokenDFA, allow_empty: bool = False, minimal: bool = True,
          max_states: int = MAX_PRODUCT_STATES) -> TokenDFA:
    """A DFA accepting the token sequences accepted by **any** of ``dfas`` (``max_states`` as in
    :func:`intersect`)."""
    _no_canonical(dfas, "union")
    return product(dfas, np.logical_or, "union", allow_empty, minimal, max_states)


def complement(dfa: TokenDFA, allow_empty: bool = False, minimal: bool = True) -> TokenDFA:
    """A DFA accepting exactly the token sequences ``dfa`` rejects (the automaton is complete,
    so flipping the accepting states suffices)."""
    _no_canonical([dfa], "complement")
    check_same_vocab([dfa])
    classes = token_classes(dfa)
    return finish(dfa.class_table(classes), ~dfa.accepting, dfa.initial, classes, allow_empty,
                  "complement", minimal)


# Default bound on the states of one subset construction (worst case exponential in |Q₂|).
MAX_CONCAT_STATES = 100_000


def concat(*dfas: TokenDFA, allow_empty: bool = False, minimal: bool = True,
           max_states: int = MAX_CONCAT_STATES) -> TokenDFA:
    """A DFA for the concatenation L₁·L₂·…: sequences that split into consecutive pieces, the
    i-th accepted by ``dfas[i]``. Folds left to right (see the module docstring). The subset
    construction raises ConstraintError instead of building more than ``max_states`` states."""
    _no_canonical(dfas, "concatenation")
    check_same_vocab(dfas)
    max_states = check_count("max_states", max_states, minimum=1)
    result = dfas[0].trim()
    for d in dfas[1:]:
        result = _concat2(result, d.trim(), minimal, max_states)
    if not allow_empty:
        result.require_nonempty("concatenation")
    return result


def accepting_states_lead_only_to_dead(dfa: TokenDFA) -> bool:
    """Ctrl-G Proposition 4.1's condition: no token leads from an accepting state to a state from
    which acceptance is still possible (so each string has at most one accepted prefix)."""
    live = dfa.live_states()
    if live[dfa.default[dfa.accepting]].any():
        return False
    return not live[dfa.letter_next[dfa.accepting[dfa.letter_exception_states()]]].any()


def _concat2(d1: TokenDFA, d2: TokenDFA, minimal: bool,
             max_states: int = MAX_CONCAT_STATES) -> TokenDFA:
    classes = token_classes(d1, d2)
    t1 = d1.class_table(classes).astype(np.int64)
    t2 = d2.class_table(classes).astype(np.int64)
    S1 = d1.num_states
    if accepting_states_lead_only_to_dead(d1):
        # Proposition 4.1: an accepting state of D1 behaves as D2's initial state.
        table = np.vstack([t1, t2 + S1])
        accepting = np.concatenate([np.zeros(S1, dtype=bool), d2.accepting])
        acc1 = np.nonzero(d1.accepting)[0]
        table[acc1] = t2[d2.initial] + S1
        accepting[acc1] = d2.accepting[d2.initial]
        return finish(table, accepting, d1.initial, classes, True, "concatenation", minimal)
    return _concat_subsets(d1, d2, t1, t2, classes, minimal, max_states)


def _concat_subsets(d1: TokenDFA, d2: TokenDFA, t1: np.ndarray, t2: np.ndarray,
                    classes: TokenClasses, minimal: bool,
                    max_states: int = MAX_CONCAT_STATES) -> TokenDFA:
    """Subset construction: state (q1, set of D2 states running on suffixes after a split)."""
    acc1, i2 = d1.accepting, d2.initial
    live2 = d2.live_states()

    def close(q1: int, subset: frozenset) -> tuple:
        # D2 runs that can no longer accept are dropped: they never contribute
        subset = frozenset(q for q in subset if live2[q])
        return (q1, subset | {i2}) if acc1[q1] and live2[i2] else (q1, subset)

    start = close(d1.initial, frozenset())
    ids = {start: 0}
    states = [start]
    rows = []
    head = 0
    while head < len(states):
        q1, subset = states[head]
        head += 1
        members = np.fromiter(sorted(subset), dtype=np.int64, count=len(subset))
        # column c: D1's next state, then the D2 runs' next states; classes with equal columns
        # lead to the same subset state, so each distinct column is closed once, in the order of
        # its first class (the states are numbered as a class-by-class loop would number them)
        columns = np.vstack([t1[q1][None, :], t2[members]])
        distinct, first, inverse = np.unique(columns, axis=1, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        target = np.empty(distinct.shape[1], dtype=np.int64)
        for j in order:
            key = close(int(distinct[0, j]), frozenset(distinct[1:, j].tolist()))
            if key not in ids:
                if len(states) >= max_states:
                    raise ConstraintError(
                        f"the concatenation of a {d1.num_states}-state and a {d2.num_states}-state "
                        f"DFA needs more than max_states={max_states} states (the subset "
                        "construction is exponential in the worst case); simplify the operands "
                        "(e.g. make the first one end unambiguously) or raise max_states")
                ids[key] = len(states)
                states.append(key)
            target[j] = ids[key]
        rows.append(target[np.asarray(inverse).reshape(-1)])
    table = np.vstack(rows)
    accepting = np.array([bool(d2.accepting[list(sub)].any()) if sub else False
                          for _, sub in states])
    return finish(table, accepting, 0, classes, True, "concatenation", minimal)


# ---------------------------------------------------------------------- token budgets
# budgets up to this many levels are searched level by level in numpy (no scipy import)
_LEVEL_BFS_LIMIT = 256


def bfs_distances(sources, src: np.ndarray, dst: np.ndarray, num_nodes: int,
                  limit: int | None = None) -> np.ndarray:
    """int64 [num_nodes]: the number of edges on a shortest path from any of ``sources`` along
    edges ``src → dst`` (−1 when unreachable, or farther than ``limit``). Breadth-first search:
    for a small ``limit`` one numpy step per level over a CSR adjacency, O(E log E + reached
    edges); otherwise in C (scipy.sparse.csgraph, unweighted), O(S + E) whatever the depth."""
    sources = np.unique(np.asarray(sources, dtype=np.int64))
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    out = np.full(num_nodes, -1, dtype=np.int64)
    if not len(sources):
        return out
    if limit is not None and limit <= _LEVEL_BFS_LIMIT:
        order = np.argsort(src, kind="stable")
        ptr = np.searchsorted(src[order], np.arange(num_nodes + 1))
        targets = dst[order]
        out[sources] = 0
        frontier = sources
        for level in range(1, limit + 1):
            nxt = targets[ragged_indices(ptr[frontier], ptr[frontier + 1] - ptr[frontier])]
            nxt = np.unique(nxt[out[nxt] < 0])
            if not nxt.size:
                break
            out[nxt] = level
            frontier = nxt
        return out
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    hub = num_nodes                        # one virtual node with an edge to every source
    rows = np.concatenate([src, np.full(len(sources), hub)])
    cols = np.concatenate([dst, sources])
    graph = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(num_nodes + 1,) * 2)
    dist = dijkstra(graph, indices=hub, unweighted=True,
                    limit=np.inf if limit is None else limit + 1.5)[:num_nodes]
    finite = np.isfinite(dist)
    out[finite] = dist[finite].astype(np.int64) - 1
    return out


def min_tokens_to_accept(dfa: TokenDFA) -> int | None:
    """The length of the shortest accepted token sequence (None when the language is empty)."""
    src, dst = dfa._edge_list()
    dist = bfs_distances([dfa.initial], src, dst, dfa.num_states)
    lengths = dist[dfa.accepting & (dist >= 0)]
    return int(lengths.min()) if lengths.size else None


def _only_the_dead_state(dfa: TokenDFA, dropped: np.ndarray) -> bool:
    """Whether ``dropped`` is one non-accepting state whose every token leads back to it: the
    dead state the restriction would build anyway (then the restriction is ``dfa`` itself)."""
    states = np.flatnonzero(dropped)
    if len(states) != 1:
        return False
    d = int(states[0])
    return (not dfa.accepting[d] and int(dfa.default[d]) == d
            and bool(np.all(dfa.letter_next[dfa.letter_ptr[d]:dfa.letter_ptr[d + 1]] == d)))


def restrict_to_budget(dfa: TokenDFA, max_tokens: int) -> TokenDFA:
    """A DFA that agrees with ``dfa`` on every sequence of at most ``max_tokens`` tokens, keeping
    only the states such a sequence can pass through on its way to acceptance: state s is kept
    iff dist(initial → s) + dist(s → accepting) ≤ ``max_tokens`` (two breadth-first searches);
    every other transition goes to one dead state (``dfa`` itself when the only state left out is
    already such a dead state: a CommonGen constraint's). Guide tables over the result cost
    O(kept states) instead of O(all states) (e.g. ``length(0, 10**5)`` with a budget of 8 keeps
    9 states). Raises UnsatisfiableConstraintError when no sequence within the budget is accepted.
    """
    src, dst = dfa._edge_list()
    S = dfa.num_states
    ahead = bfs_distances([dfa.initial], src, dst, S, limit=max_tokens)
    behind = bfs_distances(np.nonzero(dfa.accepting)[0], dst, src, S, limit=max_tokens)
    keep = (ahead >= 0) & (behind >= 0) & (ahead + behind <= max_tokens)
    if not keep[dfa.initial]:
        raise UnsatisfiableConstraintError(
            f"the constraint accepts no token sequence of at most {max_tokens} tokens "
            f"(its shortest accepted sequence is longer); raise the token budget")
    if keep.all() or _only_the_dead_state(dfa, ~keep):
        return dfa
    classes = (TokenClasses.from_labels(dfa.letter_of_token) if dfa.has_letters
               else token_classes(dfa))
    table = dfa.class_table(classes)
    kept = np.nonzero(keep)[0]
    n = len(kept)
    new_id = np.full(S, n, dtype=np.int64)          # n: the dead state
    new_id[kept] = np.arange(n)
    out = np.vstack([new_id[table[kept]], np.full((1, classes.num_classes), n)])
    accepting = np.append(dfa.accepting[kept], False)
    return finish(out, accepting, int(new_id[dfa.initial]), classes, False,
                  "budget-restricted constraint", minimal=False)
