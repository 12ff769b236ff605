"""A context-free grammar over regular terminals, in plain BNF: what every syntax compiles to.

``G = (N, T, R, S, I)``: nonterminals ``N`` (ids ``0..|N|-1``), terminals ``T`` whose languages
are regular (a regex AST of :mod:`ctrlg.dfa.regex_syntax`, never matching the empty string),
rules ``A → X_1 … X_k`` (``k ≥ 0``), the start ``S`` and the *ignored* terminals ``I`` (Lark's
``%ignore``), which may occur between any two terminals and at both ends of a sentence.

The language is the context-free one: a byte string is a sentence iff it splits into terminal
matches (and ignored ones) whose terminal sequence ``S`` derives — the split is *not* the greedy
longest match of a separate lexer (Lark's ``lexer="dynamic_complete"``). A rule's symbol is
encoded as an int: ``≥ 0`` a nonterminal id, ``< 0`` the terminal ``-1 - x``.

:func:`with_ignored` rewrites ``G`` so that ignoring is explicit — each terminal occurrence ``t``
becomes ``t W`` and the start ``S' → W S``, with ``W → ε | W i`` for every ``i ∈ I`` — which is
what the recogniser and the regular approximation consume. :func:`reduce` drops the rules that
derive no string. Cost: linear in the grammar's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ctrlg.dfa.regex_syntax import Node
from ctrlg.errors import GrammarError

__all__ = ["Terminal", "Grammar", "terminal_symbol", "terminal_of", "with_ignored", "reduce",
           "derives"]


@dataclass(frozen=True)
class Terminal:
    """A terminal: its name, its regular language (regex AST) and its source, for messages."""

    name: str
    node: Node
    source: str = ""
    #: anchored alternatives (:class:`ctrlg.dfa.cfg.anchors.Branch`), empty for a plain terminal;
    #: ``node`` is then the union of their bodies
    branches: tuple = ()


def terminal_symbol(t: int) -> int:
    """The rule-symbol encoding of terminal ``t``."""
    return -1 - t


def terminal_of(symbol: int) -> int:
    """The terminal id of a (negative) rule symbol."""
    return -1 - symbol


@dataclass(frozen=True)
class Grammar:
    """A BNF grammar (module docstring). ``rules[k] = (lhs, rhs)``."""

    nonterminals: tuple[str, ...]
    terminals: tuple[Terminal, ...]
    rules: tuple[tuple[int, tuple[int, ...]], ...]
    start: int
    ignore: tuple[int, ...] = ()
    source: str = field(default="", compare=False)

    def rules_of(self) -> list[list[int]]:
        """Rule ids of each nonterminal."""
        out: list[list[int]] = [[] for _ in self.nonterminals]
        for k, (lhs, _) in enumerate(self.rules):
            out[lhs].append(k)
        return out

    def describe(self, symbol: int) -> str:
        return self.terminals[terminal_of(symbol)].name if symbol < 0 else self.nonterminals[symbol]


def with_ignored(g: Grammar) -> Grammar:
    """``g`` with ignoring made explicit (module docstring); ``g`` itself when nothing is ignored
    (the start still gets its own rule ``S' → S``, whose completion means acceptance)."""
    names = list(g.nonterminals)
    rules: list[tuple[int, tuple[int, ...]]] = []
    if not g.ignore:
        start = len(names)
        names.append("<start>")
        rules = list(g.rules) + [(start, (g.start,))]
        return Grammar(tuple(names), g.terminals, tuple(rules), start, (), g.source)
    ws = len(names)
    names.append("<ignored>")
    followed: dict[int, int] = {}            # terminal symbol → nonterminal "t W"
    for lhs, rhs in g.rules:
        new = []
        for x in rhs:
            if x < 0:
                if x not in followed:
                    followed[x] = len(names)
                    names.append(f"<{g.describe(x)}>")
                x = followed[x]
            new.append(x)
        rules.append((lhs, tuple(new)))
    for x, nt in followed.items():
        rules.append((nt, (x, ws)))
    rules.append((ws, ()))
    rules += [(ws, (ws, terminal_symbol(i))) for i in g.ignore]
    start = len(names)
    names.append("<start>")
    rules.append((start, (ws, g.start)))
    return Grammar(tuple(names), g.terminals, tuple(rules), start, (), g.source)


def derives(g: Grammar, *, empty: bool) -> list[bool]:
    """Nonterminals that derive some terminal string (``empty=False``: the productive ones) or
    the empty string (``empty=True``: the nullable ones), by fixed point over the rules."""
    ok = [False] * len(g.nonterminals)
    changed = True
    while changed:
        changed = False
        for lhs, rhs in g.rules:
            if not ok[lhs] and all((x >= 0 or not empty) and (x < 0 or ok[x]) for x in rhs):
                ok[lhs] = changed = True
    return ok


def reduce(g: Grammar) -> Grammar:
    """``g`` without the rules that mention a nonterminal deriving nothing; GrammarError when
    the start derives nothing."""
    ok = derives(g, empty=False)
    if not ok[g.start]:
        raise GrammarError(f"the grammar generates no sentence: its start rule "
                           f"{g.nonterminals[g.start]!r} never derives a finite string (every "
                           f"alternative recurses forever)")
    rules = tuple((lhs, rhs) for lhs, rhs in g.rules if ok[lhs] and all(x < 0 or ok[x] for x in rhs))
    return Grammar(g.nonterminals, g.terminals, rules, g.start, g.ignore, g.source)
