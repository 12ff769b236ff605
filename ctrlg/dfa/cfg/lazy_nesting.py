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
from ctrlg.dfa.regex_syntax import CharSet, Concat, Node

__all__ = ["LazyNesting", "lazy_nesting_subset"]

NOTHING = CharSet(())          # the empty language, pruned by prune_empty


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
        self._nodes: dict[tuple, Node] = {}

    def _nonempty_keys(self) -> set[tuple]:
        """The least fixpoint of "some base body has only non-empty items" over the reachable
        keys (a cut key has no body: empty)."""
        self.uses = {}
        self._count(self.root)                       # every key reachable from the start
        keys = list(dict.fromkeys([self.root, *self.uses]))
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
        """The AST of a non-empty ``key``: the eager unrolling's loop form
        (:meth:`~ctrlg.dfa.cfg.approximation.Unroller._node`) over :meth:`_sequence`'s bodies,
        with the bodies that refer to an empty key pruned (memoised: a key's AST is built
        once)."""
        if key not in self._nodes:
            self._nodes[key] = prune_empty(self._node(key))
        return self._nodes[key]

    def _sequence(self, rhs, a: int, left, run) -> Node:
        """One rule body: its terminals, and each reference a
        :class:`~ctrlg.dfa.lazy_nfa.Reference` to a non-empty key or the empty language."""
        items = []
        for k, x in enumerate(rhs):
            if x < 0:
                items.append(self.g.terminals[terminal_of(x)].node)
            else:
                ref = self._ref(x, k, rhs, a, left, run)
                items.append(Reference(ref) if ref in self.nonempty else NOTHING)
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
