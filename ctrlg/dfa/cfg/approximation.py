"""A regular superset of a grammar's language: the grammar unrolled to a nesting depth d.

Ctrl-G's look-ahead needs a DFA (the HMM's backward tables are built over one); a context-free
language has none. This module builds the byte DFA of a regular language ``R_d ⊇ L(G)``:

* a nonterminal whose only recursion is *linear* — every rule is ``A → α`` or ``A → A β`` (or
  every rule ``A → α`` or ``A → β A``), with α, β free of A — is the loop ``α β*`` (``β* α``):
  exact, no depth spent (this is what Lark's ``x*`` / ``x+`` expand to);
* a reference to a nonterminal of the same strongly connected component with symbols on both
  sides in its rule (self-embedding: the content of parentheses, a JSON value inside an array)
  is expanded with the component's *depth* increased by one; a reference first or last in its
  rule keeps the depth (a chain of such references that runs around the component without a
  self-embedding one also costs one level, so the unrolling ends);
* at depth d the reference — and the whole rest of the sentence — is replaced by
  ``U = (t_1 | … | t_k)*`` over all the grammar's terminals (ignored ones included), a superset of
  whatever can follow a prefix there;
* references into another component (the components form a DAG) start its own depth at 0.

So ``R_d`` equals ``L(G)`` on sentences whose nesting stays within depth d, and only adds
sentences that go deeper (``R_d = L(G)`` when the grammar's only recursion is linear). Each
``(nonterminal, depth)`` is compiled once into a minimal byte DFA (Thompson, subset
construction, Moore; :mod:`ctrlg.dfa.bytes_dfa`) and embedded as a sub-automaton where it is
referenced, so the cost is linear in d times the grammar's size. A cut is compiled as the byte
0xFF (never part of UTF-8 text) and, at the top, every 0xFF edge becomes an ε-move into U that
ends the sentence: the automaton never has to guess how many levels a closing bracket inside U
closed, which keeps it small.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctrlg.dfa.cfg.grammar_ir import Grammar, terminal_of
from ctrlg.dfa.bytes_dfa import MAX_DFA_STATES, ByteDFA, ByteNFA, determinize, minimize
from ctrlg.dfa.regex_syntax import Alternation, Concat, Node, Repeat, positions
from ctrlg.errors import ConstraintError, RegexError

__all__ = ["regular_superset", "Unroller", "MAX_AUTO_DEPTH", "AUTO_STATES", "grammar_positions",
           "check_grammar_size", "MAX_GRAMMAR_POSITIONS"]

#: ``depth="auto"`` unrolls at most this deep ...
MAX_AUTO_DEPTH = 12
#: ... and stops before the byte DFA exceeds this many states (JSON-like grammars, whose DFA
#: must remember the kind of every open bracket, double per level).
AUTO_STATES = 1024


@dataclass(frozen=True, eq=False)
class Embedded(Node):
    """A compiled byte DFA used as a regex AST node."""

    dfa: ByteDFA


#: The byte that stands for a cut (module docstring); UTF-8 text never contains it.
CUT = 0xFF


class _NFA(ByteNFA):
    """Thompson NFA that also embeds compiled DFAs (:class:`Embedded`)."""

    def build(self, node: Node, start: int, end: int) -> None:
        if isinstance(node, Embedded):
            self.embed(node.dfa, start, end)
        else:
            super().build(node, start, end)

    def embed(self, dfa: ByteDFA, start: int, end: int, cut_to: int | None = None) -> None:
        """``dfa`` as a fragment from ``start`` to ``end``; with ``cut_to``, its :data:`CUT`
        edges become ε-moves to that state."""
        ids = {q: self.add_state() for q in range(1, dfa.num_states)}
        if dfa.initial not in ids:
            return                               # the empty language
        self.eps[start].append(ids[dfa.initial])
        for q, s in ids.items():
            row = dfa.table[q].copy()
            if cut_to is not None and row[CUT]:
                self.eps[s].append(cut_to)
                row[CUT] = 0
            cuts = [0, *(np.flatnonzero(np.diff(row)) + 1).tolist(), 256]
            for lo, hi in zip(cuts, cuts[1:]):
                target = int(row[lo])
                if target:
                    self.edges[s].append((lo, hi - 1, ids[target]))
            if dfa.accepting[q]:
                self.eps[s].append(end)


def _cut_marker() -> ByteDFA:
    table = np.zeros((3, 256), dtype=np.int32)
    table[1, CUT] = 2
    return ByteDFA(table=table, accepting=np.array([False, False, True]), initial=1)


def _compile(node: Node) -> ByteDFA:
    nfa = _NFA()
    start, accept = nfa.add_state(), nfa.add_state()
    nfa.build(node, start, accept)
    return minimize(determinize(nfa, start, accept))


def _components(g: Grammar) -> list[int]:
    """Strongly connected component id of each nonterminal (Tarjan, iterative)."""
    n = len(g.nonterminals)
    succ: list[set[int]] = [set() for _ in range(n)]
    for lhs, rhs in g.rules:
        succ[lhs].update(x for x in rhs if x >= 0)
    index, low, comp = [-1] * n, [0] * n, [-1] * n
    stack: list[int] = []
    on_stack = [False] * n
    counter = [0, 0]
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    while True:
                        x = stack.pop()
                        on_stack[x] = False
                        comp[x] = counter[1]
                        if x == v:
                            break
                    counter[1] += 1
            elif index[w] < 0:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on_stack[w] = True
                work.append((w, iter(sorted(succ[w]))))
            elif on_stack[w]:
                low[v] = min(low[v], index[w])
    return comp


class Unroller:
    """``lang(A, levels left)`` as a minimal byte DFA, memoised (module docstring)."""

    def __init__(self, g: Grammar):
        self.g = g
        self.rules_of = g.rules_of()
        self.comp = _components(g)
        self.recursive = self._recursive()
        self.memo: dict[tuple, ByteDFA] = {}
        self.levels = 0
        self.size = np.bincount(self.comp)
        self.marker = Embedded(_cut_marker())

    def _recursive(self) -> list[bool]:
        """Nonterminals in a cycle (their component has ≥ 2 members or a self-reference)."""
        size = np.bincount(self.comp, minlength=max(self.comp, default=-1) + 1)
        out = [bool(size[self.comp[a]] > 1) for a in range(len(self.g.nonterminals))]
        for lhs, rhs in self.g.rules:
            if lhs in rhs:
                out[lhs] = True
        return out

    def lang(self, a: int, left: int, run: int = 0) -> ByteDFA:
        """``a``'s language with ``left`` levels before the cut, after ``run``
        non-self-embedding references in a row."""
        if run > self.size[self.comp[a]]:         # a chain round the component: one level
            left, run = left - 1, 0
        key = (a, max(left, 0), run, self.levels) if self.recursive[a] else (a, self.levels)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = _compile(self._node(a, max(left, 0), run))
        return got

    def _node(self, a: int, left: int, run: int) -> Node:
        if self.recursive[a] and left <= 0:
            return self.marker
        loop = self._linear(a)
        if loop is not None:
            side, base, step = loop
            body = [self._sequence(rhs, a, left, run) for rhs in base]
            rep = Repeat(Alternation(tuple(self._sequence(rhs, a, left, run) for rhs in step)),
                         0, None)
            alt = Alternation(tuple(body))
            return Concat((alt, rep)) if side == "left" else Concat((rep, alt))
        return Alternation(tuple(self._sequence(self.g.rules[r][1], a, left, run)
                                 for r in self.rules_of[a]))

    def _linear(self, a: int):
        """("left", αs, βs) when every rule of ``a`` is ``a → α`` or ``a → a β`` (α, β free of
        a), ("right", αs, βs) for ``a → α`` / ``a → β a``; None otherwise."""
        rules = [self.g.rules[r][1] for r in self.rules_of[a]]
        for side in ("left", "right"):
            base, step = [], []
            for rhs in rules:
                if a not in rhs:
                    base.append(rhs)
                elif side == "left" and rhs[0] == a and a not in rhs[1:]:
                    step.append(rhs[1:])
                elif side == "right" and rhs[-1] == a and a not in rhs[:-1]:
                    step.append(rhs[:-1])
                else:
                    break
            else:
                if step:
                    return side, base, step
        return None

    def _sequence(self, rhs, a: int, left: int, run: int) -> Node:
        items = []
        for k, x in enumerate(rhs):
            if x < 0:
                items.append(self.g.terminals[terminal_of(x)].node)
            elif not (self.comp[x] == self.comp[a] and self.recursive[x]):
                items.append(Embedded(self.lang(x, self.levels)))
            elif 0 < k < len(rhs) - 1:
                items.append(Embedded(self.lang(x, left - 1)))
            else:
                items.append(Embedded(self.lang(x, left, run + 1)))
        return Concat(tuple(items))

    def top(self, depth: int) -> tuple[ByteDFA, bool]:
        """(the byte DFA of ``R_depth``, whether it is exact: no cut was reached). Every
        nonterminal is compiled first in the order of its component (Tarjan's order: the
        components a rule refers to come first), so that ``lang`` finds what it refers to in
        the memo and never recurses along a chain of rules (a chain of 1,000 rules overflowed
        Python's stack); the non-recursive ones only (a recursive one is compiled per depth
        left, as the unrolling reaches it)."""
        self.levels = int(depth)
        for a in sorted(range(len(self.g.nonterminals)), key=lambda x: self.comp[x]):
            if not self.recursive[a]:
                self.lang(a, self.levels)
        top = self.lang(self.g.start, self.levels)
        if not (top.table[:, CUT] != 0).any():
            return top, True
        nfa = _NFA()
        start, accept, escape = nfa.add_state(), nfa.add_state(), nfa.add_state()
        anything = Repeat(Alternation(tuple(t.node for t in self.g.terminals)), 0, None)
        nfa.build(anything, escape, accept)
        nfa.embed(top, start, accept, cut_to=escape)
        return minimize(determinize(nfa, start, accept)), False


#: the most character positions a grammar may expand to (:func:`grammar_positions`)
MAX_GRAMMAR_POSITIONS = 10_000


def grammar_positions(g: Grammar) -> tuple[int, int]:
    """``(estimate, nonterminal)``: how many character positions the grammar's regular
    unrolling has at depth 1 — every rule's symbols summed, a terminal counting its regex
    positions with repetitions expanded (:func:`~ctrlg.dfa.regex_syntax.positions`), a
    nonterminal of another component its own estimate and one of the same component 1 — and
    the nonterminal with the largest one. The automata built from the grammar (terminal DFAs,
    the regular superset, the token tables) grow with it. Components in Tarjan's order (those
    referred to first), so one pass: O(grammar size)."""

    comp = _components(g)
    term = [positions(t.node) for t in g.terminals]
    size = [0] * len(g.nonterminals)
    rules_of = g.rules_of()
    for a in sorted(range(len(g.nonterminals)), key=lambda x: comp[x]):
        total = 0
        for r in rules_of[a]:
            for x in g.rules[r][1]:
                total += term[terminal_of(x)] if x < 0 else (1 if comp[x] == comp[a] else size[x])
        size[a] = max(total, 1)
    worst = max(range(len(size)), key=size.__getitem__) if size else 0
    return (max(size) if size else 0), worst


def check_grammar_size(g: Grammar, what: str = "the grammar",
                       limit: int | None = None) -> None:
    """ConstraintError, before any automaton is built, when :func:`grammar_positions` exceeds
    ``limit`` (default :data:`MAX_GRAMMAR_POSITIONS`), naming the estimate, the nonterminal and
    the bound."""
    limit = MAX_GRAMMAR_POSITIONS if limit is None else limit
    estimate, worst = grammar_positions(g)
    if estimate > limit:
        raise ConstraintError(
            f"{what} expands to about {estimate:,} character positions (rule "
            f"{g.nonterminals[worst]!r}, with its repetitions and literals counted out), more "
            f"than the bound of {limit:,} (ctrlg.dfa.cfg.approximation.MAX_GRAMMAR_POSITIONS): its "
            f"automata would take minutes to build; use smaller repetition counts or literals, "
            f"or an unbounded repetition ('x*' instead of 'x ~ 0..100000')")


def regular_superset(g: Grammar, depth: int | str = "auto") -> tuple[ByteDFA, int, bool]:
    """``(byte DFA of R_d ⊇ L(g), d, exact)`` (module docstring) for ``g`` as given to the
    recogniser (:func:`~ctrlg.dfa.cfg.grammar_ir.with_ignored`); ``exact``: ``R_d = L(g)``.
    ``depth="auto"``: the deepest d ≤ :data:`MAX_AUTO_DEPTH` whose byte DFA has at most
    :data:`AUTO_STATES` states (depth 1 at least), stopping early once exact, or when the growth
    from the last level predicts the next one would exceed the bound."""
    unroller = Unroller(g)

    def too_large(d):
        return ConstraintError(
            f"the grammar unrolled to depth {d} needs a byte automaton of more than "
            f"{MAX_DFA_STATES} states; use a smaller depth or depth='auto' (ambiguous "
            f"repetition such as 'x: x x' grows fastest: write it as 'x: item+')")

    if depth != "auto":
        if int(depth) < 1:
            raise ConstraintError(f"depth must be ≥ 1 (or 'auto'), got {depth!r}")
        try:
            bdfa, exact = unroller.top(int(depth))
        except RegexError:
            raise too_large(depth) from None
        return bdfa, int(depth), exact
    best = None
    for d in range(1, MAX_AUTO_DEPTH + 1):
        try:
            bdfa, exact = unroller.top(d)
        except RegexError:            # this level explodes: keep the last one that did not
            if best is None:
                raise too_large(d) from None
            break
        if best is not None and bdfa.num_states > AUTO_STATES:
            break
        growth = bdfa.num_states / best[0].num_states if best is not None else 1.0
        best = (bdfa, d, exact)
        if exact or bdfa.num_states * growth > AUTO_STATES:
            break
    return best
