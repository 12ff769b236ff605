"""Anchors in a grammar's regex terminals (``^``, ``\\A``, ``$``, ``\\Z``), read as Lark reads them.

Lark's Earley parser matches a terminal's regex with ``re.match(text, i)`` on the *whole* input
(no MULTILINE flag): ``^``/``\\A`` hold only at position 0; ``\\Z`` only at the end of the input;
``$`` at the end or just before a final ``"\\n"``. A terminal ``/^body/`` therefore matches only
at the start of the sentence, ``/body\\Z/`` only at its end and ``/body$/`` at its end or before
a final newline (``start: /a$/ "b"`` rejects ``ab``; ``start: /a$/ "\\n"`` accepts ``a\\n``).

Supported: anchors at the outer edges of a terminal's pattern or of each top-level alternative
(``^a``, ``a$``, ``\\Aa\\Z``, ``^a|b$``), each alternative a *branch* (needs the start?, end kind,
anchor-free body). Refused with :class:`~ctrlg.errors.UnsupportedGrammarError`:

* anchors elsewhere (``a$b``, ``(a$)*``) and flags that change them (``m``);
* an anchored branch whose strings are proper prefixes of the terminal's strings (``/[0-9]+$/``):
  Lark's ``dynamic_complete`` lexer also tries each shorter match against the *truncated*
  matched text, where ``$`` holds, so the terminal would match digits anywhere (a look-ahead,
  not "digits at the end"). Without prefixes no such shorter match exists and the reading
  above is exact.

The grammar becomes an anchor-free one by the Bar-Hillel product with a four-state automaton
over the terminal *occurrences* (every token is non-empty, so "at position 0" is "first token"):
B (nothing read), M (inside), X (after a ``$`` token: the input may end, or one token that is
exactly ``"\\n"``), E (after an end token: the input must end). Each nonterminal A becomes
(p, A, q) for the state pairs its derivations can take; each terminal occurrence the union of
its branches allowed on that transition. States only move forward (B → M → X → E), so a rule of
k symbols gets at most C(k + 3, 3) variants; grammars without anchors are returned unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctrlg.dfa.bytes_dfa import compile_ast
from ctrlg.dfa.cfg.grammar_ir import Grammar, Terminal, terminal_of, terminal_symbol
from ctrlg.dfa.regex_syntax import Alternation, Anchor, CharSet, Concat, Node, Repeat
from ctrlg.errors import UnsupportedGrammarError

__all__ = ["Branch", "terminal_branches", "has_anchor", "resolve_anchors"]

B, M, X, E = range(4)
NEWLINE = CharSet(((10, 10),))


@dataclass(frozen=True)
class Branch:
    """One alternative of an anchored terminal: whether it needs position 0, how it must end
    (``None``: free, ``"$"``: at the end or before a final newline, ``"\\Z"``: at the end)."""

    start: bool
    end: str | None
    body: Node


def has_anchor(node: Node) -> bool:
    if isinstance(node, Anchor):
        return True
    if isinstance(node, (Concat, Alternation)):
        return any(has_anchor(x) for x in node.items)
    if isinstance(node, Repeat):
        return has_anchor(node.item)
    return False


def _branch(node: Node, where: str) -> Branch:
    items = list(node.items) if isinstance(node, Concat) else [node]
    start = end = None
    if items and isinstance(items[0], Anchor) and items[0].at == "start":
        start = items.pop(0)
    if items and isinstance(items[-1], Anchor) and items[-1].at == "end":
        end = items.pop()
    body = items[0] if len(items) == 1 else Concat(tuple(items))
    if has_anchor(body):
        raise UnsupportedGrammarError(
            f"{where}: an anchor inside the pattern (not at its start or end, or the start or "
            f"end of a top-level alternative) is not supported")
    return Branch(start is not None, None if end is None else ("$" if end.symbol == "$" else "\\Z"),
                  body)


def terminal_branches(node: Node, where: str) -> tuple[Branch, ...]:
    """The branches of a terminal parsed with ``anchors=True`` (module docstring)."""
    alts = node.items if isinstance(node, Alternation) else (node,)
    return tuple(_branch(a, where) for a in alts)


def _dfa(nodes):

    nodes = list(nodes)
    return compile_ast(nodes[0] if len(nodes) == 1 else Alternation(tuple(nodes)))


def _proper_prefix(short, full) -> bool:
    """Whether a non-empty string of ``short``'s language followed by a non-empty string is in
    ``full``'s (a product search over the two byte DFAs)."""
    live = full.live()
    seen = {(short.initial, full.initial)}
    stack = list(seen)
    while stack:
        a, b = stack.pop()
        if short.accepting[a] and (a, b) != (short.initial, full.initial):
            row = full.table[b]
            if live[row[row != 0]].any():
                return True
        ta, tb = short.table[a], full.table[b]
        for pair in set(zip(ta[(ta != 0) & (tb != 0)].tolist(), tb[(ta != 0) & (tb != 0)].tolist())):
            if pair not in seen:
                seen.add(pair)
                stack.append(pair)
    return False


def check_branches(branches: tuple[Branch, ...], where: str) -> None:
    """UnsupportedGrammarError when Lark's shorter-match look-ahead could apply (module
    docstring): an anchored branch's string that is a proper prefix of one of the terminal's
    strings (of an unanchored-at-start one, for a start anchor)."""
    every = _dfa(b.body for b in branches)
    ends = [b.body for b in branches if b.end]
    if ends and _proper_prefix(_dfa(ends), every):
        raise UnsupportedGrammarError(
            f"{where}: an end-anchored alternative matches a proper prefix of the terminal's "
            f"matches (e.g. /[0-9]+$/); Lark's dynamic_complete lexer then also accepts shorter "
            f"matches away from the end (it retries the regex on the truncated match, where "
            f"'$' holds): a look-ahead ctrlg does not model. Anchor a terminal whose matches "
            f"are not prefixes of one another, or drop the anchor")
    starts = [b.body for b in branches if b.start]
    free = [b.body for b in branches if not b.start]
    if starts and free and _proper_prefix(_dfa(starts), _dfa(free)):
        raise UnsupportedGrammarError(
            f"{where}: a start-anchored alternative matches a proper prefix of another "
            f"alternative's matches; Lark's dynamic_complete lexer would accept it away from "
            f"the start (a look-ahead ctrlg does not model)")


def _variants(t: Terminal, branches, newline_ok) -> dict[tuple[int, int], Node]:
    """{(p, q): the terminal's language on that transition} (module docstring)."""
    out: dict[tuple[int, int], list[Node]] = {}
    for p in (B, M):
        for br in branches:
            if br.start and p != B:
                continue
            q = {None: M, "$": X, "\\Z": E}[br.end]
            out.setdefault((p, q), []).append(br.body)
    result = {k: v[0] if len(v) == 1 else Alternation(tuple(v)) for k, v in out.items()}
    if newline_ok:
        result[(X, E)] = NEWLINE
    return result


def resolve_anchors(g: Grammar) -> Grammar:
    """An anchor-free grammar with Lark's language of ``g`` (module docstring); ``g`` itself
    when no terminal is anchored. ``g`` as given to the recogniser
    (:func:`~ctrlg.dfa.cfg.grammar_ir.with_ignored`: nothing left in ``ignore``)."""
    if not any(t.branches for t in g.terminals):
        return g

    variants = []
    for t in g.terminals:
        branches = t.branches or (Branch(False, None, t.node),)
        newline = any(not br.start and compile_ast(br.body).fullmatch(b"\n") for br in branches)
        variants.append(_variants(t, branches, newline))
    names: list[str] = []
    ids: dict[tuple[int, int, int], int] = {}
    terms: list[Terminal] = []
    term_ids: dict[tuple[int, int, int], int] = {}
    rules: list[tuple[int, tuple[int, ...]]] = []
    todo: list[tuple[int, int, int]] = []

    def nt(p: int, a: int, q: int) -> int:
        key = (p, a, q)
        if key not in ids:
            ids[key] = len(names)
            names.append(g.nonterminals[a] if (p, q) == (B, M) else f"{g.nonterminals[a]}[{p}{q}]")
            todo.append(key)
        return ids[key]

    def term(p: int, t: int, q: int) -> int | None:
        node = variants[t].get((p, q))
        if node is None:
            return None
        key = (p, t, q)
        if key not in term_ids:
            term_ids[key] = len(terms)
            old = g.terminals[t]
            terms.append(Terminal(old.name, node, old.source))
        return terminal_symbol(term_ids[key])

    start = len(names)
    names.append("<anchored start>")
    for q in (B, M, X, E):
        rules.append((start, (nt(B, g.start, q),)))
    rules_of = g.rules_of()
    while todo:
        p, a, q = todo.pop()
        lhs = ids[(p, a, q)]
        for r in rules_of[a]:
            rhs = g.rules[r][1]
            stack = [(0, p, ())]
            while stack:
                k, state, done = stack.pop()
                if k == len(rhs):
                    if state == q:
                        rules.append((lhs, done))
                    continue
                x = rhs[k]
                last = k == len(rhs) - 1
                for nxt in ((q,) if last else range(state, q + 1)):
                    if nxt < state:
                        continue
                    if x < 0:
                        sym = term(state, terminal_of(x), nxt)
                        if sym is not None:
                            stack.append((k + 1, nxt, done + (sym,)))
                    else:
                        stack.append((k + 1, nxt, done + (nt(state, x, nxt),)))
    return Grammar(tuple(names), tuple(terms), tuple(rules), start, (), g.source)
