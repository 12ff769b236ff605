"""A grammar's sentences nesting at most n levels deep, as a byte automaton built on demand.

:func:`~ctrlg.dfa.cfg.approximation.nesting_subset` compiles ``L_≤n`` eagerly: one minimal byte
DFA per (nonterminal, depth) and then the whole automaton. For a grammar whose automaton must
remember the kind of every open bracket (JSON: ``[`` or ``{`` at each level) that DFA doubles
with every level — 4,378 states and 2.3 s at n = 6 for the JSON example — although a generation
visits one state per byte. :func:`lazy_nesting_subset` gives the same language as an ε-NFA built
on demand (:class:`~ctrlg.dfa.lazy_nfa.LazyThompsonNFA`): the unrolled AST of
:class:`~ctrlg.dfa.cfg.approximation.Unroller` (same keys, same loops, same depth accounting)
with every reference to a nonterminal at a depth left as a :class:`~ctrlg.dfa.lazy_nfa.Reference`
that the NFA expands when the subset construction first reaches it. Nothing is compiled before
the first mask, so the cost moves from the compile to the states a generation actually visits.

The cut (a reference past the last level, which ``nesting_subset`` turns into a dead edge) is
the empty language here, and so is every key that cannot derive a sentence without one: the
emptiness of the keys reachable from the start is a least fixpoint computed first (a key is
non-empty when one of its base bodies has only non-empty items), and the bodies that refer to an
empty key are dropped, so every NFA state reaches acceptance, as the lazy subset construction
requires. The language is exactly ``nesting_subset``'s (tested by comparing the minimal DFAs).
"""

from __future__ import annotations

from ctrlg.dfa.cfg.approximation import Unroller
from ctrlg.dfa.cfg.grammar_ir import Grammar, terminal_of
from ctrlg.dfa.lazy import LazyByteDFA
from ctrlg.dfa.lazy_nfa import LazyThompsonNFA, Reference, prune_empty
from ctrlg.dfa.regex_syntax import Alternation, Concat, Node, Repeat

__all__ = ["LazyNesting", "lazy_nesting_subset"]


class LazyNesting(Unroller):
    """The unrolled grammar (:class:`~ctrlg.dfa.cfg.approximation.Unroller`'s keys and loops)
    as ASTs with :class:`~ctrlg.dfa.lazy_nfa.Reference` leaves, the cut as the empty language
    (module docstring). :meth:`node` is the NFA's ``resolve``."""

    def __init__(self, g: Grammar, levels: int):
        super().__init__(g)
        self.levels = int(levels) + 1        # as nesting_subset: R_{n+1} without its cut edges
        self.root = self.key(g.start, self.levels)
        self.terminal = [prune_empty(t.node) for t in g.terminals]
        self.nonempty = self._nonempty_keys()
        self._nodes: dict[tuple, Node | None] = {}

    def _keys(self) -> list[tuple]:
        """The keys reachable from the start, references followed (cut keys have none)."""
        seen, todo = {self.root}, [self.root]
        while todo:
            for ref in self._references(todo.pop()):
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)
        return list(seen)

    def _nonempty_keys(self) -> set[tuple]:
        """The least fixpoint of "some base body has only non-empty items" over the reachable
        keys (a cut key has no body: empty)."""
        keys = self._keys()
        out: set[tuple] = set()
        changed = True
        while changed:
            changed = False
            for key in keys:
                a, left, run, _ = key
                if key in out or self._cut(a, left):
                    continue
                if any(self._body_nonempty(rhs, a, left, run, out) for rhs in self._bodies(a).base):
                    out.add(key)
                    changed = True
        return out

    def _body_nonempty(self, rhs, a: int, left, run, nonempty: set) -> bool:
        return all(self.terminal[terminal_of(x)] is not None if x < 0
                   else self._ref(x, k, rhs, a, left, run) in nonempty
                   for k, x in enumerate(rhs))

    def node(self, key: tuple) -> Node:
        """The AST of a non-empty ``key``: ``Y = r* α (l | β r* α)*`` of its loop, each body
        with a reference to an empty key dropped, each other reference a
        :class:`~ctrlg.dfa.lazy_nfa.Reference` (memoised: a key's AST is built once)."""
        if key not in self._nodes:
            self._nodes[key] = self._build(key)
        return self._nodes[key]

    def _build(self, key: tuple) -> Node | None:
        a, left, run, _ = key
        if key not in self.nonempty:
            return None

        def alt(bodies):
            items = [x for x in (self._body(rhs, a, left, run) for rhs in bodies) if x is not None]
            return None if not items else items[0] if len(items) == 1 else Alternation(tuple(items))

        loop = self._bodies(a)
        base = alt(loop.base)                  # non-empty: the key is
        if not (loop.right or loop.left or loop.assoc):
            return base
        right = alt(loop.right)
        head = Concat((Repeat(right, 0, None), base)) if right is not None else base
        steps = [x for x in (self._body(rhs, a, left, run) for rhs in loop.left) if x is not None]
        for rhs in loop.assoc:
            beta = self._body(rhs, a, left, run)
            if beta is not None:
                steps.append(Concat((beta, head)))
        if not steps:
            return head
        return Concat((head, Repeat(steps[0] if len(steps) == 1 else Alternation(tuple(steps)),
                                    0, None)))

    def _body(self, rhs, a: int, left, run) -> Node | None:
        """One rule body as a concatenation, or None when an item's language is empty."""
        items = []
        for k, x in enumerate(rhs):
            if x < 0:
                item = self.terminal[terminal_of(x)]
            else:
                ref = self._ref(x, k, rhs, a, left, run)
                item = Reference(ref) if ref in self.nonempty else None
            if item is None:
                return None
            items.append(item)
        return Concat(tuple(items))


def lazy_nesting_subset(g: Grammar, levels: int) -> LazyByteDFA:
    """The byte automaton of ``L_≤n`` (``levels`` = n; the language of
    :func:`~ctrlg.dfa.cfg.approximation.nesting_subset`), its rows built on demand (module
    docstring); the dead automaton when no sentence nests within n levels."""
    unrolled = LazyNesting(g, levels)
    nfa = LazyThompsonNFA(resolve=unrolled.node)
    nfa.has_empty = False
    start, accept = nfa.add_state(), nfa.add_state()
    if unrolled.root in unrolled.nonempty:
        nfa.build(Reference(unrolled.root), start, accept)
    else:                                       # no sentence: no edges, the start is dead
        nfa.has_empty = True
    out = LazyByteDFA(nfa, start, accept)
    out.too_large_hint = (f"the grammar nested up to {levels} levels deep: allow fewer levels "
                          f"(max_nesting), or write ambiguous repetition such as 'x: x x' as "
                          f"'x: item+'")
    return out
