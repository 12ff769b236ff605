"""Byte-level Earley recogniser for a grammar whose terminals are byte DFAs (no separate lexer).

Items (Earley 1970) over the BNF of :func:`ctrlg.dfa.cfg.grammar_ir.with_ignored`:

* rule items ``(r, d, o)``: rule r with its dot before ``rhs[d]``, started in set o;
* terminal threads ``(t, q, o)``: terminal t's byte DFA in state q, started in set o.

A set is closed under *prediction* (an item before nonterminal A adds A's rules at dot 0; before
terminal t it starts t's thread once per set) and *completion* (an item at the end of its rule
advances every item of its origin set that waits on the rule's left side), with Aycock &
Horspool's rule for nullable nonterminals (an item before a nullable A also advances at once).
A byte b *scans* every thread: q' = δ_t(q, b) (dropped when dead); a thread entering an
accepting state completes t, advancing the items of its origin that wait on t. The input is a
sentence iff the last set holds the start rule completed from the first set.

Every set keeps references to the sets its items started in, so a parse is the last set alone:
a decoding row's cursor is one :class:`EarleySet` (rows that share a prefix share its sets).
:meth:`Recogniser.complete_terminal` builds the set that follows terminal t's completion without
scanning a byte (the token-mask computation explores those, :mod:`ctrlg.guide.grammar_masks`).

Cost per byte: O(threads) DFA steps plus the closure, O(items · rules predicted) — independent of
the prefix length except through the items that remain open (the nesting depth).
"""

from __future__ import annotations

import numpy as np

from ctrlg.dfa.cfg.grammar_ir import Grammar, derives, terminal_of
from ctrlg.dfa.bytes_dfa import ByteDFA, compile_ast
from ctrlg.dfa.lazy import _bounded_put

__all__ = ["Recogniser", "EarleySet", "DEAD", "completion_effect", "terminal_dfa",
           "forget_terminal_dfas"]

#: compiled terminal DFAs kept by :func:`terminal_dfa` (emptied when full)
MAX_TERMINAL_DFAS = 1024
_TERMINAL_DFAS: dict = {}


def terminal_dfa(node) -> ByteDFA:
    """The minimal byte DFA of a terminal's regex AST (:func:`~ctrlg.dfa.bytes_dfa.compile_ast`),
    memoised by the AST's value: grammars that share terminals (every JSON-like grammar reads
    strings and numbers) compile each once per process. Its table is read-only."""
    got = _TERMINAL_DFAS.get(node)
    if got is None:
        got = compile_ast(node)
        got.table.setflags(write=False)
        got.accepting.setflags(write=False)
        _bounded_put(_TERMINAL_DFAS, node, got, MAX_TERMINAL_DFAS)
    return got


def forget_terminal_dfas() -> None:
    """Empty :func:`terminal_dfa`'s memo (``ctrlg.dfa.cfg.constraint.clear_shared_caches``)."""
    _TERMINAL_DFAS.clear()


class EarleySet:
    """One Earley set (module docstring). ``threads``: terminal threads ``(t, q, origin)``;
    ``waiting[A]`` / ``waiting_t[t]``: the rule items whose dot is before nonterminal A /
    terminal t; ``accepting``: the input so far is a sentence. ``cache``: per-set memo of the
    mask computations (costs to completion), valid because a set never changes once closed."""

    __slots__ = ("threads", "waiting", "waiting_t", "accepting", "cache", "__weakref__")

    def __init__(self):
        self.threads: list[tuple[int, int, EarleySet]] = []
        self.waiting: dict[int, list[tuple[int, int, EarleySet]]] = {}
        self.waiting_t: dict[int, list[tuple[int, int, EarleySet]]] = {}
        self.accepting = False
        self.cache: dict = {}

    @property
    def dead(self) -> bool:
        return not self.threads and not self.accepting


#: The cursor of a rejected prefix.
DEAD = EarleySet()


class Recogniser:
    """Earley recogniser of ``grammar`` (already :func:`with_ignored`: its start rule's completion
    from the first set means acceptance). ``dfas[t]`` is terminal t's minimal byte DFA."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.lhs = [lhs for lhs, _ in grammar.rules]
        self.rhs = [rhs for _, rhs in grammar.rules]
        self.rules_of = grammar.rules_of()
        self.nullable = derives(grammar, empty=True)
        self.dfas: list[ByteDFA] = [terminal_dfa(t.node) for t in grammar.terminals]
        self.tables = [d.table for d in self.dfas]
        self.accepting = [d.accepting for d in self.dfas]
        self.initial = [d.initial for d in self.dfas]
        self.start_rules = set(self.rules_of[grammar.start])

    # ------------------------------------------------------------------ sets
    def start(self) -> EarleySet:
        """The set before any byte."""
        s = EarleySet()
        self._close(s, [(r, 0, s) for r in self.rules_of[self.grammar.start]])
        return s

    def _close(self, s: EarleySet, kernel: list) -> None:
        """Close ``s`` under prediction and completion, starting from the rule items ``kernel``.
        Only the first set predicts the start rule (no rule mentions it), so its completion
        always means acceptance."""
        seen = set()
        predicted: set[int] = set()
        started: set[int] = set()
        work = list(kernel)
        rhs_of, lhs_of, nullable = self.rhs, self.lhs, self.nullable
        while work:
            item = work.pop()
            if item in seen:
                continue
            seen.add(item)
            r, d, o = item
            rhs = rhs_of[r]
            if d == len(rhs):
                a = lhs_of[r]
                if r in self.start_rules:
                    s.accepting = True
                work.extend((r2, d2 + 1, o2) for r2, d2, o2 in o.waiting.get(a, ()))
                continue
            x = rhs[d]
            if x >= 0:
                s.waiting.setdefault(x, []).append(item)
                if x not in predicted:
                    predicted.add(x)
                    work.extend((r2, 0, s) for r2 in self.rules_of[x])
                if nullable[x]:
                    work.append((r, d + 1, o))
            else:
                t = terminal_of(x)
                s.waiting_t.setdefault(t, []).append(item)
                if t not in started:
                    started.add(t)
                    s.threads.append((t, self.initial[t], s))

    def step(self, s: EarleySet, byte: int) -> EarleySet:
        """The set after scanning ``byte`` from ``s`` (:data:`DEAD` when no thread survives).
        Threads of one terminal in one state whose origins wait on it with the same items have
        the same future (:func:`_effect`): one is kept — a run of k ignored spaces would
        otherwise carry k threads, one per way to split it."""
        threads, kernel, seen = [], [], set()
        for t, q, o in s.threads:
            q2 = int(self.tables[t][q, byte])
            if q2:
                key = (t, q2, completion_effect(o, t))
                if key in seen:
                    continue
                seen.add(key)
                threads.append((t, q2, o))
                if self.accepting[t][q2]:
                    kernel.extend((r, d + 1, o2) for r, d, o2 in o.waiting_t.get(t, ()))
        if not threads:
            return DEAD
        nxt = EarleySet()
        nxt.threads = threads
        self._close(nxt, kernel)
        return nxt

    def complete_terminal(self, t: int, origin: EarleySet) -> EarleySet:
        """The set right after terminal ``t`` (started in ``origin``) completes, with no thread
        carried over (module docstring)."""
        nxt = EarleySet()
        kernel = [(r, d + 1, o2) for r, d, o2 in origin.waiting_t.get(t, ())]
        self._close(nxt, kernel)
        return nxt

    def feed(self, s: EarleySet, data: bytes) -> EarleySet:
        """The set after scanning ``data`` from ``s``."""
        for b in data:
            if s is DEAD:
                return DEAD
            s = self.step(s, b)
        return s

    def accepts(self, data: bytes) -> bool:
        """Whether ``data`` is a sentence."""
        s = self.feed(self.start(), data)
        return s is not DEAD and s.accepting


def completion_effect(origin: EarleySet, t: int):
    """What completing terminal t started in ``origin`` does: the items of ``origin`` that wait
    on t (memoised on the set)."""
    key = ("effect", t)
    got = origin.cache.get(key)
    if got is None:
        got = origin.cache[key] = frozenset((r, d, id(o)) for r, d, o in origin.waiting_t.get(t, ()))
    return got


def single_byte_weights(token_bytes) -> np.ndarray:
    """float64 [256]: 1 for bytes that are a token on their own, ∞ for the others (a completion
    spelled byte by byte uses only the former)."""
    w = np.full(256, np.inf)
    for t in token_bytes:
        if len(t) == 1:
            w[t[0]] = 1.0
    return w
