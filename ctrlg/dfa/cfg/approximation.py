"""A regular superset of a grammar's language: the grammar unrolled to a nesting depth d.

Ctrl-G's look-ahead needs a DFA (the HMM's backward tables are built over one); a context-free
language has none. This module builds the byte DFA of a regular language ``R_d ⊇ L(G)``:

* a nonterminal A that occurs in its own rules only at their ends — ``A → α``, ``A → A β``,
  ``A → β A``, ``A → A β A`` (β free of A; α free of A at its ends) — is the loop
  ``β_r* α (β_l | β_a β_r* α)*``: exact, no depth spent (Lark's ``x*`` / ``x+``, and the
  ambiguous ``s: s s | "a"`` or ``s: s "," s | …``, whose language is ``α (β α)*``);
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
sentences that go deeper (``R_d = L(G)`` when the grammar's only recursion is such loops). Each
``(nonterminal, depth)`` referenced more than once is compiled once into a minimal byte DFA
(Thompson, subset construction, Moore; :mod:`ctrlg.dfa.bytes_dfa`) and embedded as a
sub-automaton where it is referenced; one referenced once is expanded in place (a chain of
parentheses 1,000 deep is one subset construction, not 1,000). A cut is compiled as the byte
0xFF (never part of UTF-8 text) and, at the top, every 0xFF edge becomes an ε-move into U that
ends the sentence: the automaton never has to guess how many levels a closing bracket inside U
closed, which keeps it small. Since U swallows whatever followed a cut, every string is cut
short after its first 0xFF already where a sub-automaton is compiled (the same ``R_d``).

Everything runs on explicit work stacks (no Python recursion, whatever the depth) and within
a :class:`~ctrlg.dfa.bytes_dfa.Budget` of DFA states and subset entries fixed before the
construction starts: past it, a given depth is a clear ConstraintError and ``"auto"`` keeps
the deepest level it could afford, so time and memory are bounded for every grammar.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctrlg.dfa.cfg.grammar_ir import Grammar, terminal_of
from ctrlg.dfa.cfg.earley import terminal_dfa
from ctrlg.dfa.bytes_dfa import (AutomatonTooLarge, Budget, ByteDFA, ByteNFA, determinize,
                                  minimize)
from ctrlg.dfa.lazy_nfa import Reference
from ctrlg.dfa.regex_syntax import Alternation, CharSet, Concat, Node, Repeat, positions
from ctrlg.errors import ConstraintError

__all__ = ["regular_superset", "nesting_subset", "Unroller", "MAX_AUTO_DEPTH",
           "AUTO_STATES", "grammar_positions",
           "check_grammar_size", "MAX_GRAMMAR_POSITIONS", "SUPERSET_BUDGET", "AUTO_BUDGET"]

#: ``depth="auto"`` unrolls at most this deep ...
MAX_AUTO_DEPTH = 12
#: ... and stops before the byte DFA exceeds this many states (JSON-like grammars, whose DFA
#: must remember the kind of every open bracket, double per level).
AUTO_STATES = 1024
#: what one construction at a given depth may spend, in all its subset constructions: DFA
#: states and NFA-state entries of their subsets (:class:`~ctrlg.dfa.bytes_dfa.Budget`)
SUPERSET_BUDGET = Budget(states=50_000, work=1_500_000)
#: what ``depth="auto"`` may spend on all the levels it tries together
AUTO_BUDGET = Budget(states=20_000, work=600_000)


@dataclass(frozen=True, eq=False)
class Embedded(Node):
    """A compiled byte DFA used as a regex AST node."""

    dfa: ByteDFA


#: The byte that stands for a cut (module docstring); UTF-8 text never contains it.
CUT = 0xFF


@dataclass
class Loop:
    """A nonterminal's rule bodies by where it occurs in them (:meth:`Unroller._loop`): the
    ``base`` bodies α and the steps β of ``a → a β`` (``left``), ``a → β a`` (``right``) and
    ``a → a β a`` (``assoc``), each β without ``a``'s occurrences at the ends."""

    base: tuple = ()
    left: tuple = ()
    right: tuple = ()
    assoc: tuple = ()


class _NFA(ByteNFA):
    """Thompson NFA that also embeds compiled DFAs (:class:`Embedded`) and expands
    :class:`~ctrlg.dfa.lazy_nfa.Reference` leaves (by ``expand(key) -> Node``: a memo key
    referenced exactly once, expanded in place), with an explicit work stack: a
    reference chain 2,000 levels deep uses no Python stack. With ``cut_target``, every
    :data:`CUT` edge of an embedded DFA leads there (the construction's accepting state: what
    follows a cut is never read, module docstring)."""

    def __init__(self, cut_target: int | None = None, expand=None):
        super().__init__()
        self.cut_target = cut_target
        self.expand = expand

    def build(self, node: Node, start: int, end: int) -> None:
        todo = [(node, start, end)]
        push = lambda item: lambda s, e: todo.append((item, s, e))   # noqa: E731
        while todo:
            node, start, end = todo.pop()
            if isinstance(node, Embedded):
                self.embed(node.dfa, start, end)
            elif isinstance(node, Reference):
                todo.append((self.expand(node.key), start, end))
            elif isinstance(node, CharSet):
                self._charset(node, start, end)
            elif isinstance(node, Concat):
                if not node.items:
                    self.eps[start].append(end)
                cur = start
                for k, item in enumerate(node.items):
                    nxt = end if k == len(node.items) - 1 else self.add_state()
                    todo.append((item, cur, nxt))
                    cur = nxt
            elif isinstance(node, Alternation):
                for item in node.items:
                    s, e = self.add_state(), self.add_state()
                    self.eps[start].append(s)
                    self.eps[e].append(end)
                    todo.append((item, s, e))
            elif isinstance(node, Repeat):
                self._repeat(node, start, end, push(node.item))
            else:  # pragma: no cover - the unrolling builds only the node types above
                raise TypeError(f"unknown regex node {node!r}")

    def embed(self, dfa: ByteDFA, start: int, end: int, cut_to: int | None = None) -> None:
        """``dfa`` as a fragment from ``start`` to ``end``; with ``cut_to``, its :data:`CUT`
        edges become ε-moves to that state."""
        ids = {q: self.add_state() for q in range(1, dfa.num_states)}
        if dfa.initial not in ids:
            return                               # the empty language
        self.eps[start].append(ids[dfa.initial])
        for q, s in ids.items():
            row = dfa.table[q].copy()
            if row[CUT]:
                if cut_to is not None:
                    self.eps[s].append(cut_to)
                elif self.cut_target is not None:
                    self.edges[s].append((CUT, CUT, self.cut_target))
                else:
                    self.edges[s].append((CUT, CUT, ids[int(row[CUT])]))
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


def _compile(node: Node, budget: Budget | None = None, expand=None) -> ByteDFA:
    """The minimal byte DFA of ``node`` with every string cut short after its first
    :data:`CUT` (``w CUT x`` becomes ``w CUT``): at the top a cut becomes ``U``, which
    swallows whatever followed it, so nothing after a cut matters, and keeping it out keeps
    the automata of ambiguous rules (``s: s s | "a"``) linear in the depth instead of
    exponential."""
    nfa = _NFA(expand=expand)
    start, accept = nfa.add_state(), nfa.add_state()
    nfa.cut_target = accept
    nfa.build(node, start, accept)
    if budget is not None:
        budget.charge(len(nfa.edges), states=0)      # the NFA's states: memory and time too
    return minimize(determinize(nfa, start, accept, budget))


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
    """``lang(A, levels left)`` as a minimal byte DFA, memoised (module docstring). The memo is
    filled bottom-up by an explicit work stack (:meth:`lang`), never by Python recursion, so
    the depth is bounded by the budget, not by Python's stack."""

    def __init__(self, g: Grammar, budget: Budget | None = None):
        self.g = g
        self.budget = budget
        self.rules_of = g.rules_of()
        self.comp = _components(g)
        self.recursive = self._recursive()
        self.memo: dict[tuple, ByteDFA] = {}
        self.levels = 0
        self.size = np.bincount(self.comp)
        self.marker = Embedded(_cut_marker())
        self.linear = [self._loop(a) for a in range(len(g.nonterminals))]
        self.cut_free = self._cut_free()
        self.depends = self._depends_on_levels()
        #: references to each key from the keys reachable from the last root (:meth:`_count`)
        self.uses: dict[tuple, int] = {}
        self.embeds: dict[tuple, list[tuple]] = {}
        self._terminals: dict[int, Embedded] = {}

    def terminal(self, t: int) -> Embedded:
        """Terminal t as its compiled minimal DFA (:func:`~ctrlg.dfa.cfg.earley.terminal_dfa`,
        shared with the recogniser), embedded where a rule reads it (looked up once per
        unrolling: the memo's key is the terminal's whole AST)."""
        got = self._terminals.get(t)
        if got is None:
            got = self._terminals[t] = Embedded(terminal_dfa(self.g.terminals[t].node))
        return got

    def _cut_free(self) -> list[bool]:
        """Nonterminals whose unrolling never reaches a cut: a non-recursive one, or a linear
        loop alone in its component (``W → ε | W i``: exact at any depth), that refers only
        to such nonterminals. Their automata do not depend on any depth."""
        out = [not self.recursive[a] or (self.linear[a] is not None
                                         and self.size[self.comp[a]] == 1
                                         and not any(a in rhs for rhs in self.linear[a].base))
               for a in range(len(self.g.nonterminals))]
        changed = True
        while changed:
            changed = False
            for lhs, rhs in self.g.rules:
                if out[lhs] and any(x >= 0 and x != lhs and not out[x] for x in rhs):
                    out[lhs] = False
                    changed = True
        return out

    def _depends_on_levels(self) -> list[bool]:
        """Nonterminals whose unrolled language depends on the depth of the whole unrolling
        (they refer, maybe through others, to a recursive nonterminal of another component,
        which starts its own count at that depth); the others' automata are shared by every
        depth (``depth="auto"`` compiles each once)."""
        out = [False] * len(self.g.nonterminals)
        changed = True
        while changed:
            changed = False
            for lhs, rhs in self.g.rules:
                if not out[lhs] and any(
                        x >= 0 and (out[x] or (self.recursive[x] and not self.cut_free[x]
                                               and self.comp[x] != self.comp[lhs]))
                        for x in rhs):
                    out[lhs] = changed = True
        return out

    def _recursive(self) -> list[bool]:
        """Nonterminals in a cycle (their component has ≥ 2 members or a self-reference)."""
        size = np.bincount(self.comp, minlength=max(self.comp, default=-1) + 1)
        out = [bool(size[self.comp[a]] > 1) for a in range(len(self.g.nonterminals))]
        for lhs, rhs in self.g.rules:
            if lhs in rhs:
                out[lhs] = True
        return out

    def key(self, a: int, left: int, run: int = 0) -> tuple:
        """The memo key of ``a`` with ``left`` levels before the cut after ``run``
        non-self-embedding references in a row (a chain round the component costs a level)."""
        if self.cut_free[a]:
            return (a, None, None, None)
        levels = self.levels if self.depends[a] else None
        if not self.recursive[a]:
            return (a, None, None, levels)
        if run > self.size[self.comp[a]]:
            left, run = left - 1, 0
        left = max(left, 0)
        return (a, left, run if left > 0 else 0, levels)

    def lang(self, a: int, left: int, run: int = 0) -> ByteDFA:
        """``a``'s language (:meth:`key`) as a minimal byte DFA. Every key reachable from it is
        counted (:meth:`_count`); one referenced exactly once is expanded in place (a
        :class:`~ctrlg.dfa.lazy_nfa.Reference`) into the automaton that refers to it, every
        other one compiled once and embedded, those it needs first, by a work stack (no Python
        recursion)."""
        root = self.key(a, left, run)
        if root in self.memo:
            return self.memo[root]
        self.uses, self.embeds = {}, {}
        self._count(root)
        stack = [root]
        while stack:
            key = stack[-1]
            if key in self.memo:
                stack.pop()
                continue
            missing = [k for k in self._compiled_references(key) if k not in self.memo]
            if missing:
                stack.extend(missing)
                continue
            self.memo[key] = _compile(self._node(key), self.budget, self._node)
            stack.pop()
        return self.memo[root]

    def _count(self, root: tuple) -> None:
        """How often each key reachable from ``root`` is referenced (``self.uses``)."""
        seen, todo = {root}, [root]
        while todo:
            for ref in self._references(todo.pop()):
                self.uses[ref] = self.uses.get(ref, 0) + 1
                if ref not in seen and ref not in self.memo:
                    seen.add(ref)
                    todo.append(ref)

    def _inlined(self, key: tuple) -> bool:
        return self.uses.get(key, 0) == 1 and key not in self.memo

    def _compiled_references(self, key: tuple) -> list[tuple]:
        """The compiled keys ``key``'s automaton embeds: its references, through the inlined
        ones (each inlined key has one referrer, so it is walked once)."""
        got = self.embeds.get(key)
        if got is None:
            got, todo = [], list(self._references(key))
            while todo:
                ref = todo.pop()
                if self._inlined(ref):
                    todo.extend(self._references(ref))
                else:
                    got.append(ref)
            self.embeds[key] = got
        return got

    def _bodies(self, a: int) -> Loop:
        """``a``'s rules as a :class:`Loop` (:meth:`_loop`), or all of them as its bases."""
        loop = self.linear[a]
        if loop is not None:
            return loop
        return Loop(base=tuple(self.g.rules[r][1] for r in self.rules_of[a]))

    def _references(self, key: tuple) -> list[tuple]:
        a, left, run, _ = key
        if self._cut(a, left):
            return []
        loop = self._bodies(a)
        twice = 1 + len(loop.assoc)              # Z = r* α is written once per use (_node)
        return [self._ref(x, k, rhs, a, left, run)
                for rhs in (*loop.base * twice, *loop.right * twice, *loop.left, *loop.assoc)
                for k, x in enumerate(rhs) if x >= 0]

    def _ref(self, x: int, k: int, rhs, a: int, left, run) -> tuple:
        """The memo key of the reference to ``x`` at position ``k`` of ``rhs`` in ``a``'s rule."""
        if not (self.comp[x] == self.comp[a] and self.recursive[x]):
            return self.key(x, self.levels)
        if 0 < k < len(rhs) - 1:
            return self.key(x, left - 1)
        return self.key(x, left, run + 1)

    def _cut(self, a: int, left) -> bool:
        return self.recursive[a] and left is not None and left <= 0

    def _node(self, key: tuple) -> Node:
        """``Y = r* α (l | β r* α)*`` of ``a``'s :class:`Loop` (module docstring)."""
        a, left, run, _ = key
        if self._cut(a, left):
            return self.marker

        def alt(bodies):
            return Alternation(tuple(self._sequence(rhs, a, left, run) for rhs in bodies))

        loop = self._bodies(a)
        if not (loop.right or loop.left or loop.assoc):
            return alt(loop.base)

        def head():
            return Concat((Repeat(alt(loop.right), 0, None), alt(loop.base))) if loop.right \
                else alt(loop.base)

        steps = [self._sequence(rhs, a, left, run) for rhs in loop.left]
        steps += [Concat((self._sequence(rhs, a, left, run), head())) for rhs in loop.assoc]
        return Concat((head(), Repeat(Alternation(tuple(steps)), 0, None)))

    def _loop(self, a: int) -> Loop | None:
        """``a``'s rules as a loop when ``a`` occurs in them only at the ends: ``a → α``
        (``a`` nowhere, or only strictly inside: a self-embedding that costs a level),
        ``a → a β`` (left), ``a → β a`` (right), ``a → a β a`` (associative; ``s: s s``,
        ``s: s "," s``), with β free of ``a``. The least solution of
        ``X = α(X) ∪ X β_l ∪ β_r X ∪ X β_a X`` is ``Y = β_r* α (β_l | β_a β_r* α)*`` (Y
        contains every α and is closed under the three steps; every derivation tree rotates
        into that form), so the loop is exact and spends no depth. None when some rule has
        ``a`` at an end and inside, or no rule is a step."""
        loop = Loop()
        for r in self.rules_of[a]:
            rhs = self.g.rules[r][1]
            inner = a in rhs[1:-1]
            first, last = bool(rhs) and rhs[0] == a, len(rhs) > 1 and rhs[-1] == a
            if not (first or last):
                loop.base += (rhs,)
            elif inner:
                return None
            elif first and last:
                loop.assoc += (rhs[1:-1],)
            elif first:
                loop.left += (rhs[1:],)
            else:
                loop.right += (rhs[:-1],)
        return loop if (loop.left or loop.right or loop.assoc) else None

    def _sequence(self, rhs, a: int, left: int, run: int) -> Node:
        items = []
        for k, x in enumerate(rhs):
            if x < 0:
                items.append(self.terminal(terminal_of(x)))
                continue
            ref = self._ref(x, k, rhs, a, left, run)
            items.append(Reference(ref) if self._inlined(ref) else Embedded(self.memo[ref]))
        return Concat(tuple(items))

    def unrolled(self, depth: int) -> ByteDFA:
        """The start symbol unrolled to ``depth`` levels: its sentences derivable within them,
        plus a :data:`CUT` byte where a derivation would go deeper (module docstring)."""
        self.levels = int(depth)
        return self.lang(self.g.start, self.levels)

    def top(self, depth: int) -> tuple[ByteDFA, bool]:
        """(the byte DFA of ``R_depth``, whether it is exact: no cut was reached)."""
        top = self.unrolled(depth)
        if not (top.table[:, CUT] != 0).any():
            return top, True
        nfa = _NFA()
        start, accept, escape = nfa.add_state(), nfa.add_state(), nfa.add_state()
        anything = Repeat(Alternation(tuple(self.terminal(t) for t in range(len(self.g.terminals)))),
                          0, None)
        nfa.build(anything, escape, accept)
        nfa.embed(top, start, accept, cut_to=escape)
        return minimize(determinize(nfa, start, accept, self.budget)), False


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

    The whole construction runs within a :class:`~ctrlg.dfa.bytes_dfa.Budget` fixed before it
    starts (:data:`SUPERSET_BUDGET` for a given depth, :data:`AUTO_BUDGET` for all the levels
    ``"auto"`` tries), so its time and memory are bounded whatever the grammar.
    ``depth="auto"``: the deepest d ≤ :data:`MAX_AUTO_DEPTH` whose byte DFA has at most
    :data:`AUTO_STATES` states and fits the budget (depth 1 at least), stopping early once exact,
    once a level gives the same automaton as the one before (``s: s s | "a"``: ``a+`` at every
    depth), or when the growth from the last level predicts the next one would exceed the
    bound. ConstraintError when even that (or the given depth) exceeds the budget."""
    def too_large(d):
        return ConstraintError(
            f"the grammar unrolled to depth {d} needs byte automata beyond the bound of "
            f"{SUPERSET_BUDGET.states:,} states (or {SUPERSET_BUDGET.work:,} subset entries) "
            f"in all; use a smaller depth or depth='auto' (ambiguous repetition such as "
            f"'x: x x' grows fastest: write it as 'x: item+')")

    if depth != "auto":
        if int(depth) < 1:
            raise ConstraintError(f"depth must be ≥ 1 (or 'auto'), got {depth!r}")
        unroller = Unroller(g, Budget(SUPERSET_BUDGET.states, SUPERSET_BUDGET.work))
        try:
            bdfa, exact = unroller.top(int(depth))
        except AutomatonTooLarge:
            raise too_large(depth) from None
        return bdfa, int(depth), exact
    unroller = Unroller(g, Budget(AUTO_BUDGET.states, AUTO_BUDGET.work))
    best = None
    for d in range(1, MAX_AUTO_DEPTH + 1):
        try:
            bdfa, exact = unroller.top(d)
        except AutomatonTooLarge:     # this level explodes: keep the last one that did not
            if best is None:
                raise too_large(d) from None
            break
        if best is not None and bdfa.num_states > AUTO_STATES:
            break
        growth = bdfa.num_states / best[0].num_states if best is not None else 1.0
        same = best is not None and _same_dfa(bdfa, best[0])
        best = (bdfa, d, exact)
        if exact or same or bdfa.num_states * growth > AUTO_STATES:
            break
    return best


def nesting_subset(g: Grammar, levels: int) -> ByteDFA:
    """The byte DFA of ``L_≤n ⊆ L(g)``: the sentences derivable with at most ``levels`` = n
    self-embedded references in a row (n = 0: none; for the arithmetic example, parentheses at
    most n deep) — ``R_{n+1}``'s automaton with its cut edges removed, so every string that
    would need a deeper level is refused instead of let through (module docstring). Within
    :data:`SUPERSET_BUDGET`; ConstraintError past it."""
    unroller = Unroller(g, Budget(SUPERSET_BUDGET.states, SUPERSET_BUDGET.work))
    try:
        top = unroller.unrolled(int(levels) + 1)
    except AutomatonTooLarge:
        raise ConstraintError(
            f"the grammar with {levels} nesting levels needs byte automata beyond the bound of "
            f"{SUPERSET_BUDGET.states:,} states (or {SUPERSET_BUDGET.work:,} subset entries); "
            f"allow fewer levels") from None
    table = top.table.copy()
    table[:, CUT] = 0
    return ByteDFA(table=table, accepting=top.accepting.copy(), initial=top.initial)


def _same_dfa(a: ByteDFA, b: ByteDFA) -> bool:
    """Whether two minimal DFAs numbered by :func:`~ctrlg.dfa.bytes_dfa.minimize` (BFS order,
    a canonical numbering) are the same automaton, i.e. have the same language."""
    return (a.initial == b.initial and np.array_equal(a.accepting, b.accepting)
            and np.array_equal(a.table, b.table))
