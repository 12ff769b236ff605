"""Thompson's construction on demand: an ε-NFA whose fragments are wired when first reached.

:class:`~ctrlg.dfa.template_nfa.TemplateNFA` builds the whole Thompson NFA of a pattern before the first
token; for a JSON schema with ``$ref`` definitions inlined hundreds of times and ``{0,128}``
counters that is hundreds of thousands of states (seconds in Python), nearly all of which a
generation never visits. :class:`LazyThompsonNFA` builds the same kind of automaton one level at
a time:

* ``build(node, start, end)`` only *defers* the fragment: ``pending[start]`` records
  ``(node, end)``.
* The first time the subset construction asks for the edges of a state ``s`` (``edges_of`` /
  ``eps_of``), every fragment deferred at ``s`` is expanded by one level of Thompson's
  construction — a concatenation ``x·rest`` into ``x`` deferred at ``s`` and ``rest`` at a fresh
  state; an alternation into its branches, each from ``s`` to ``end`` (Thompson's fresh
  ``(a_i, b_i)`` pair per branch is not needed: see below); ``x{m,n}`` into one copy of ``x``
  and ``x{m-1,n-1}`` (or the optional copy and ``ε``, or the loop of ``x*``); a char set into
  its shared UTF-8 byte-range template — until no fragment is deferred at ``s``.

This is exact because Thompson fragments never add an edge *into* their start state nor *out of*
their end state: once ``s`` has been expanded nothing adds an edge out of ``s`` again, so the
edges read are the final ones. The same property lets an alternation's branches share its start
and end states: no branch can re-enter ``s`` (so no path runs from inside one branch into
another) nor leave ``end`` on its own, so the language from ``s`` to ``end`` is the union of the
branches'. The automaton reached therefore has the eager construction's language from every
state the two share (its minimal DFA is the eager one's, ``tests/test_lazy_nesting.py``), with
two states fewer per branch of every alternation met. Compile cost: O(1) plus the states the
initial ε-closure reaches; each DFA row then costs the expansion of the NFA states it meets.

Every NFA state must reach acceptance (the lazy subset construction has no liveness pass), so
the only source of dead states, an empty char set, is removed from the AST first
(:func:`prune_empty`: an empty branch is dropped, an empty concatenation / mandatory repetition
makes its parent empty, ``x{0,n}`` of an empty ``x`` is ``ε``). Every fragment of a non-empty
language then reaches its end state, so every NFA state reaches acceptance.

A :class:`Reference` is a named sub-expression that the NFA's ``resolve(key)`` returns when the
construction first reaches it (a grammar's nonterminal unrolled to a depth,
:mod:`ctrlg.dfa.cfg.lazy_nesting`): the AST may then be exponentially large as a tree, or
infinite, and only the parts a generation reaches are ever built. ``resolve`` must return an AST
of non-empty language whose own empty sub-expressions are pruned (a :class:`Reference` counts
as non-empty here), so the invariant above holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctrlg.dfa.template_nfa import MAX_LAZY_NFA_STATES, TemplateNFA, _item_class
from ctrlg.dfa.regex_syntax import EMPTY, Alternation, CharSet, Concat, Node, Repeat, positions
from ctrlg.errors import RegexError

__all__ = ["LazyThompsonNFA", "Reference", "lazy_thompson", "prune_empty", "has_empty_charset"]


@dataclass(frozen=True, eq=False)
class Reference(Node):
    """A sub-expression named by ``key``, built by the automaton builder's callback when its
    construction reaches it: ``LazyThompsonNFA``'s ``resolve`` (module docstring; its language
    must then be non-empty), or the eager unrolling's ``expand``
    (:mod:`ctrlg.dfa.cfg.approximation`)."""

    key: object


class _Tail:
    """``items[i:]`` of a concatenation, without copying the tuple."""
    __slots__ = ("items", "i")

    def __init__(self, items: tuple, i: int):
        self.items, self.i = items, i


def prune_empty(node: Node) -> Node | None:
    """``node`` with every sub-expression of empty language removed (module docstring); ``None``
    when the whole language is empty. Shared sub-trees (the AST is a DAG when groups are shared)
    are visited once, and a sub-tree without an empty char set is returned as is (identity
    kept)."""
    memo: dict[int, object] = {}
    _NONE = memo            # a sentinel distinct from every node

    def go(x: Node):
        key = id(x)
        got = memo.get(key)
        if got is not None:
            return None if got is _NONE else got
        if isinstance(x, CharSet):
            out = x if x.ranges else None
        elif isinstance(x, Concat):
            items = []
            out = x
            for y in x.items:
                z = go(y)
                if z is None:
                    out = None
                    break
                items.append(z)
            if out is not None and any(a is not b for a, b in zip(items, x.items)):
                out = Concat(tuple(items))
        elif isinstance(x, Alternation):
            items = [z for z in (go(y) for y in x.items) if z is not None]
            if not items:
                out = None
            elif len(items) == len(x.items) and all(a is b for a, b in zip(items, x.items)):
                out = x
            else:
                out = items[0] if len(items) == 1 else Alternation(tuple(items))
        elif isinstance(x, Repeat):
            z = go(x.item)
            if z is None:
                out = EMPTY if x.min == 0 else None
            else:
                out = x if z is x.item else Repeat(z, x.min, x.max)
        elif isinstance(x, Reference):          # non-empty by contract
            out = x
        else:  # pragma: no cover - the parser produces only the node types above
            raise TypeError(f"unknown regex node {x!r}")
        memo[key] = _NONE if out is None else out
        return out

    return go(node)


def has_empty_charset(node: Node) -> bool:
    """Whether an empty char set occurs in ``node`` (each shared sub-tree visited once)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, CharSet):
            if not x.ranges:
                return True
        elif isinstance(x, (Concat, Alternation)):
            stack.extend(x.items)
        elif isinstance(x, Repeat):
            stack.append(x.item)
    return False


class LazyThompsonNFA(TemplateNFA):
    """:class:`~ctrlg.dfa.template_nfa.TemplateNFA` with fragments expanded on first use (module
    docstring). ``build`` must be given an AST without empty char sets (:func:`prune_empty`);
    ``has_empty`` is False, so :class:`~ctrlg.dfa.lazy.LazyByteDFA` reads the edges through
    :meth:`edges_of` / :meth:`eps_of` and skips its liveness pass."""

    grows_on_demand = True   # states and counted regions appear as the subset construction goes

    def __init__(self, resolve=None):
        super().__init__()
        # the fragment deferred at a state: its node and its end state, in two dicts so that
        # a deferred state adds no container the garbage collector would track; further
        # fragments deferred at the same state (none today) wait in ``_more``
        self._pending: dict[int, object] = {}
        self._pending_end: dict[int, int] = {}
        self._more: dict[int, list] = {}
        self.resolve = resolve      # key -> Node, for the Reference nodes of the AST

    def add_state(self) -> int:
        """A fresh state (no bound here: :func:`lazy_thompson` bounds the pattern's size). Its
        edges and ε-targets are tuples, added to by concatenation (a state has few): a walk
        over a grammar adds tens of thousands of states, and lists would be tracked by the
        garbage collector, whose full collections then cost hundreds of milliseconds a step."""
        self.edges.append(())
        self.eps.append(())
        return len(self.edges) - 1

    def build(self, node, start: int, end: int) -> None:
        self._defer(start, node, end)

    def _block_starts(self) -> list:
        """The first inner state of each template copy, extended as copies are added (they
        are interleaved with look-ups here)."""
        st = self._starts
        if len(st) != len(self._blocks):
            st.extend(b[0] for b in self._blocks[len(st):])
        return st

    def edges_of(self, s: int) -> Sequence[tuple[int, int, int]]:
        if s in self._pending:
            self._expand(s)
        e = self.edges[s]
        if e is None:
            self._resolve(s)
            e = self.edges[s]
        return e

    def eps_of(self, s: int) -> Sequence[int]:
        if s in self._pending:
            self._expand(s)
        e = self.eps[s]
        if e is None:
            self._resolve(s)
            e = self.eps[s]
        return e

    def resolve_all(self) -> None:
        """Expand every fragment and fill in every template state (the whole automaton)."""
        while self._pending:
            self._expand(next(iter(self._pending)))
        super().resolve_all()

    def _expand(self, s: int) -> None:
        """Expand the fragments deferred at ``s`` until none is left (module docstring)."""
        todo = self._deferred_at(s)
        eps_s = self.eps[s] = list(self.eps[s])    # a list while s is expanded (alternations
        #                                            may add thousands), then a tuple again
        while todo:
            node, end = todo.pop()
            if isinstance(node, CharSet):
                self._class(node, s, end)
            elif isinstance(node, Reference):
                todo.append((self.resolve(node.key), end))
            elif isinstance(node, (Concat, _Tail)):
                items, i = (node.items, 0) if isinstance(node, Concat) else (node.items, node.i)
                if i == len(items):
                    eps_s.append(end)
                elif i == len(items) - 1:
                    todo.append((items[i], end))
                else:
                    t = self.add_state()
                    todo.append((items[i], t))
                    self._defer(t, _Tail(items, i + 1), end)
            elif isinstance(node, Alternation):   # every branch from s to end (docstring)
                todo.extend([(item, end) for item in node.items])
            elif isinstance(node, Repeat) and _counter_of_small_item(node):
                TemplateNFA.build(self, node, s, end)   # copies of one template at a fixed
                #                                         stride: counted slices + translated masks
            elif isinstance(node, Repeat):
                lo, hi = node.min, node.max
                cls = _item_class(node.item) if hi is None or hi else None
                if hi is None and lo == 0:          # x*: a loop between fresh states
                    a, b = self.add_state(), self.add_state()
                    eps_s.append(a)
                    self._defer(a, node.item, b)
                    if cls is not None:             # a copy starts at a, unboundedly many follow
                        self.counted.setdefault(a, []).append((cls, None))
                    self.eps[b] += (a,)
                    self.eps[a] += (end,)
                elif hi == 0:
                    eps_s.append(end)
                else:                               # one copy of x, then x{lo-1,hi-1}
                    if lo == 0:
                        eps_s.append(end)
                    if cls is not None:             # a copy starts at s, hi copies in all from s
                        self.counted.setdefault(s, []).append((cls, hi))
                    t = self.add_state()
                    todo.append((node.item, t))
                    rest = Repeat(node.item, max(lo - 1, 0), None if hi is None else hi - 1)
                    if rest.max == 0:
                        self.eps[t] += (end,)
                    else:
                        self._defer(t, rest, end)
            else:  # pragma: no cover - the parser produces only the node types above
                raise TypeError(f"unknown regex node {node!r}")
            if s in self._pending:                # a fragment deferred at s again (none today)
                todo.extend(self._deferred_at(s))
        self.eps[s] = tuple(eps_s)

    def _defer(self, s: int, node, end: int) -> None:
        if s in self._pending:
            self._more.setdefault(s, []).append((node, end))
        else:
            self._pending[s] = node
            self._pending_end[s] = end

    def _deferred_at(self, s: int) -> list:
        """The fragments ``(node, end)`` deferred at ``s``, no longer deferred."""
        return [(self._pending.pop(s), self._pending_end.pop(s)), *self._more.pop(s, ())]


#: a bounded repetition of an item of at most this many character positions, with 3 copies or
#: more, is wired up front from one template (the copies' edges are still filled in on first use)
_SMALL_ITEM_POSITIONS = 64
_MAX_WIRED_COPIES = 100_000


def _counter_of_small_item(node: Repeat) -> bool:
    """Whether ``node`` is a counter ``x{m,n}`` (3 ≤ n ≤ :data:`_MAX_WIRED_COPIES`) of a small
    item with a char-set alternative (a string's character, a digit): such counters are wired
    by :meth:`TemplateNFA.build`, whose copies sit at a fixed stride, so masks deep inside them
    are translated (:meth:`~ctrlg.dfa.lazy.LazyTokenDFA`) rather than walked."""
    return node.max is not None and 3 <= node.max <= _MAX_WIRED_COPIES \
        and _item_class(node.item) is not None and positions(node.item) <= _SMALL_ITEM_POSITIONS


def lazy_thompson(node: Node, max_positions: int | None = None):
    """``(nfa, start, accept)``: the :class:`LazyThompsonNFA` of the AST ``node`` (empty char
    sets pruned first; an empty language gives an NFA with no edges and ``has_empty`` set, whose
    subset construction starts dead). RegexError when the expanded pattern has more than
    ``max_positions`` (default
    :data:`~ctrlg.dfa.template_nfa.MAX_LAZY_NFA_STATES`) character positions — the bound the eager
    construction put on its states, checked here without building them."""
    limit = MAX_LAZY_NFA_STATES if max_positions is None else max_positions
    size = positions(node)
    if size > limit:
        raise RegexError(f"regex automaton exceeds {limit:,} NFA states ({size:,} character "
                         f"positions with repetitions counted out)")
    nfa = LazyThompsonNFA()
    start, accept = nfa.add_state(), nfa.add_state()
    if has_empty_charset(node):
        node = prune_empty(node)
    if node is not None:
        nfa.build(node, start, accept)
    else:                # no edges: the liveness pass finds start dead (an empty language)
        nfa.has_empty = True
    return nfa, start, accept
