"""Fragments of the JSON Schema compiler's output: regex text, or a small grammar IR once a
recursive ``$ref`` appears.

The compiler builds every piece with :func:`seq`, :func:`alt` and :func:`rep`. While no piece
mentions a recursive reference, a fragment is plain regex text (``ctrlg.dfa.regex_syntax``
syntax) and the result is a regex. A recursive ``$ref`` yields a :class:`Ref`; the combinators
then build :class:`Seq` / :class:`Alt` / :class:`Rep` nodes around it, and :func:`to_grammar`
turns the fragment, with the definitions of the referenced schemas, into a BNF
:class:`~ctrlg.dfa.cfg.grammar_ir.Grammar` whose terminals are the regex leaves (each leaf that may
match the empty string becomes ``N → ε | T`` with ``T`` its non-empty part). Cost: linear in the
fragment's size.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctrlg.dfa.cfg.grammar_ir import Grammar, Terminal, terminal_symbol
from ctrlg.dfa.lazy import parse as shared_parse
from ctrlg.dfa.regex_syntax import Alternation, Concat, Node, Repeat, matches_empty

__all__ = ["Ref", "Seq", "Alt", "Rep", "seq", "alt", "rep", "is_text", "to_grammar"]


@dataclass(frozen=True)
class Ref:
    """A reference to the definition of a recursive schema (by its ``$ref`` target)."""
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Alt:
    items: tuple


@dataclass(frozen=True)
class Rep:
    item: object
    min: int
    max: int | None


def is_text(frag) -> bool:
    return isinstance(frag, str)


def seq(*parts):
    """Concatenation of fragments (regex text when all parts are text)."""
    parts = [p for p in parts if p != ""]
    if all(isinstance(p, str) for p in parts):
        return "".join(parts)
    return Seq(tuple(parts))


def alt(parts):
    """Union of fragments; ``(?:a|b)`` when all are text."""
    parts = list(dict.fromkeys(parts))
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, str) for p in parts):
        return "(?:" + "|".join(parts) + ")"
    return Alt(tuple(parts))


def rep(part, lo: int, hi: int | None):
    """``part`` repeated ``lo`` to ``hi`` times (``None``: unbounded)."""
    if hi == 0:
        return ""
    if isinstance(part, str):
        if (lo, hi) == (1, 1):
            return part
        bound = "?" if (lo, hi) == (0, 1) else "*" if (lo, hi) == (0, None) else \
            f"{{{lo},{'' if hi is None else hi}}}"
        return f"(?:{part}){bound}"
    return Rep(part, lo, hi)


# ---------------------------------------------------------------------- to a grammar
def _non_empty(node: Node) -> Node | None:
    """An AST of ``L(node) \\ {ε}`` (``None`` when that is empty)."""
    if not matches_empty(node):
        return node
    if isinstance(node, Alternation):
        items = [y for y in (_non_empty(x) for x in node.items) if y is not None]
        return Alternation(tuple(items)) if items else None
    if isinstance(node, Concat):
        # NE(x1 x2..xk) = NE(x1) x2..xk | NE(x2..xk)   (x1 nullable here)
        if not node.items:
            return None
        head, rest = node.items[0], Concat(node.items[1:])
        first = _non_empty(head)
        options = [Concat((first, rest))] if first is not None else []
        later = _non_empty(rest)
        if later is not None:
            options.append(later)
        return Alternation(tuple(options)) if options else None
    item = _non_empty(node.item)
    if item is None or node.max == 0:
        return None
    return Concat((item, Repeat(node.item, 0, None if node.max is None else node.max - 1)))


class _Builder:
    def __init__(self):
        self.names: list[str] = []
        self.terminals: list[Terminal] = []
        self.rules: list[tuple[int, tuple[int, ...]]] = []
        self.ref_ids: dict[str, int] = {}
        self.leaf_ids: dict[str, int] = {}

    def nonterminal(self, name: str) -> int:
        self.names.append(name)
        return len(self.names) - 1

    def symbols(self, frag) -> tuple[int, ...]:
        """Rule symbols deriving exactly ``frag``'s language."""
        if isinstance(frag, str):
            return (self.leaf(frag),) if frag else ()
        if isinstance(frag, Ref):
            return (self.ref_ids[frag.name],)
        if isinstance(frag, Seq):
            return tuple(s for x in frag.items for s in self.symbols(x))
        nt = self.nonterminal(f"<{type(frag).__name__.lower()} {len(self.names)}>")
        if isinstance(frag, Alt):
            for x in frag.items:
                self.rules.append((nt, self.symbols(x)))
            return (nt,)
        # Rep: lo mandatory copies, then either (hi - lo) optional ones or a left-recursive star
        item = self.symbols(frag.item)
        body = item * frag.min
        if frag.max is None:
            star = self.nonterminal(f"<star {len(self.names)}>")
            self.rules += [(star, ()), (star, (star,) + item)]
            self.rules.append((nt, body + (star,)))
        else:
            for k in range(frag.min, frag.max + 1):
                self.rules.append((nt, item * k))
        return (nt,)

    def leaf(self, text: str) -> int:
        if text in self.leaf_ids:
            return self.leaf_ids[text]
        ast = shared_parse(text)        # the parse shares repeated groups (a DAG)
        nt = self.nonterminal(f"<leaf {len(self.leaf_ids)}>")
        self.leaf_ids[text] = nt
        if matches_empty(ast):
            self.rules.append((nt, ()))
        ne = _non_empty(ast)
        if ne is not None:
            self.terminals.append(Terminal(f"/{text[:60]}/", ne, text))
            self.rules.append((nt, (terminal_symbol(len(self.terminals) - 1),)))
        return nt


def to_grammar(start, definitions: dict) -> Grammar:
    """The BNF grammar of fragment ``start`` with ``definitions`` (``$ref`` target → fragment)."""
    b = _Builder()
    for name in definitions:
        b.ref_ids[name] = b.nonterminal(name)
    root = b.nonterminal("<document>")
    b.rules.append((root, b.symbols(start)))
    for name, frag in definitions.items():
        b.rules.append((b.ref_ids[name], b.symbols(frag)))
    return Grammar(tuple(b.names), tuple(b.terminals), tuple(b.rules), root)
