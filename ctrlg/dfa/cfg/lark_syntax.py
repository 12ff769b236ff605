"""Lark grammar text → :class:`~ctrlg.dfa.cfg.grammar_ir.Grammar`, read by the ``lark`` library itself.

Lark (``lark.Lark(text, parser="earley")``) parses the grammar, resolves ``%import`` (e.g.
``common.WS``, ``common.NUMBER``), templates, ``%override`` / ``%extend``, and expands EBNF —
``?rule`` inlining, ``|``, ``*``, ``+``, ``?``, ``[ ]``, ``~ m..n`` — into BNF rules; each terminal
is then one regular expression (strings and regexes joined). This module turns that BNF into
ours: every terminal's pattern through ctrlg's regex parser (:mod:`ctrlg.dfa.regex_syntax`), the
``i`` flag as ASCII case folding.

Unsupported, with :class:`~ctrlg.errors.UnsupportedGrammarError` naming the terminal and its
line: lookaround and backreferences in terminals (not regular), regex flags other than ``i``,
``%declare``-d terminals (no pattern: a lexer callback would produce them), terminals that match
the empty string. Anchors (``^ $ \\A \\Z``) at the edges of a terminal's pattern are read as
Lark reads them (:mod:`ctrlg.dfa.cfg.anchors`), others refused. Lark's ``common.ESCAPED_STRING`` (a lookbehind) is read as its regular
equivalent ``"(?:[^"\\\\\\n]|\\\\[^\\n])*"``: a double-quoted string whose quotes inside are escaped.
Terminal priorities and tree-shaping (``?``, ``_``, ``->`` aliases) do not change the language
and are ignored.
"""

from __future__ import annotations

import re

import lark

from ctrlg.dfa.cfg.anchors import Branch, check_branches, has_anchor, terminal_branches
from ctrlg.dfa.cfg.grammar_ir import Grammar, Terminal, terminal_symbol
from ctrlg.dfa.regex_syntax import (Alternation, CharSet, Concat, Node, map_charsets,
                                    matches_empty, normalize_ranges, parse)
from ctrlg.errors import GrammarError, RegexError, UnsupportedGrammarError

__all__ = ["from_lark", "fold_case", "line_of"]

try:                     # Lark measures a terminal's width with the `regex` module when present
    import regex as _regex_module
    _REGEX_ERRORS: tuple = (re.error, _regex_module.error)
except ImportError:      # pragma: no cover - regex is optional for Lark
    _REGEX_ERRORS = (re.error,)

# Lark's common.ESCAPED_STRING after its templates are joined, and its regular reading.
_ESCAPED_INNER = r".*?(?<!\\)(\\\\)*?"
_ESCAPED_REGULAR = r'(?:[^"\\\n]|\\[^\n])*'


def line_of(text: str, needle: str) -> str:
    """`` (line n)`` of the first line of ``text`` that defines or contains ``needle``, or ``""``
    (imported from Lark's library, or not found)."""
    definition = re.compile(rf"^\s*[?!]?{re.escape(needle)}\s*(\.\s*-?\d+\s*)?:", re.M)
    m = definition.search(text) or (re.search(re.escape(needle), text) if needle else None)
    return f" (line {text.count(chr(10), 0, m.start()) + 1})" if m else ""


def fold_case(node: Node) -> Node:
    """``node`` with every ASCII letter matching both cases (Lark's ``i`` flag)."""
    def both_cases(charset: CharSet) -> CharSet:
        extra = []
        for lo, hi in charset.ranges:
            for a, b, shift in ((65, 90, 32), (97, 122, -32)):
                x, y = max(lo, a), min(hi, b)
                if x <= y:
                    extra.append((x + shift, y + shift))
        return CharSet(normalize_ranges(list(charset.ranges) + extra))
    return map_charsets(node, both_cases)


def _literal(value: str) -> Node:
    return Concat(tuple(CharSet(((ord(c), ord(c)),)) for c in value))


def _terminal(defn, text: str) -> Terminal:
    """One Lark TerminalDef as a :class:`Terminal` (module docstring for what is refused)."""
    name, pattern = defn.name, defn.pattern
    where = line_of(text, name if not name.startswith("__") else pattern.value)
    flags = set(pattern.flags) - {"i"}
    if flags:
        raise UnsupportedGrammarError(
            f"terminal {name}{where} uses the regex flag(s) {sorted(flags)}; only 'i' is supported")
    if pattern.type == "str":
        node = _literal(pattern.value)
        if not pattern.value:
            raise GrammarError(f"terminal {name}{where} is the empty string")
    else:
        source = pattern.value.replace(_ESCAPED_INNER, _ESCAPED_REGULAR)
        try:
            node = parse(source, anchors=True)
        except RegexError as err:
            raise UnsupportedGrammarError(
                f"terminal {name}{where}: /{pattern.value}/ is not a supported regular "
                f"expression: {err}") from None
    branches = ()
    if pattern.type == "re" and has_anchor(node):
        what = f"terminal {name}{where} /{pattern.value}/"
        branches = terminal_branches(node, what)
        if "i" in pattern.flags:
            branches = tuple(Branch(b.start, b.end, fold_case(b.body)) for b in branches)
        check_branches(branches, what)
        bodies = [b.body for b in branches]
        node = bodies[0] if len(bodies) == 1 else Alternation(tuple(bodies))
    elif "i" in pattern.flags:
        node = fold_case(node)
    if matches_empty(node):
        raise UnsupportedGrammarError(
            f"terminal {name}{where} matches the empty string; make it match at least one "
            f"character and write the occurrence as optional ({name}?) in the rules")
    return Terminal(name, node, f"{name}: /{pattern.value}/" if pattern.type == "re"
                    else f'{name}: "{pattern.value}"', branches)


def _load(text: str, start: str) -> lark.Lark:
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("the grammar text is empty; give Lark rules such as 'start: \"a\"+'")
    try:
        return lark.Lark(text, start=start, parser="earley", lexer="dynamic")
    except lark.exceptions.GrammarError as err:
        raise GrammarError(f"invalid Lark grammar: {err}") from None
    except lark.exceptions.LarkError as err:
        raise GrammarError(f"invalid Lark grammar: {str(err).strip()}") from None
    except FileNotFoundError as err:          # %import of a module Lark cannot find
        missing = re.search(r"%import\s+([\w.]+)", text)
        raise GrammarError(f"invalid Lark grammar: %import "
                           f"{missing.group(1) if missing else ''}{line_of(text, '%import')}: "
                           f"no grammar module {err.filename!r} (Lark's own: common, "
                           f"unicode, python, lark)") from None
    except _REGEX_ERRORS as err:              # a terminal's regex (or flag) re refuses
        raise GrammarError(f"invalid Lark grammar: a terminal's regex (with its flags) is not "
                           f"valid for Python's re: {err}") from None
    except RecursionError:
        raise GrammarError("invalid Lark grammar: its rules nest too deeply for Lark to read "
                           "them") from None


def from_lark(text: str, start: str = "start") -> Grammar:
    """The BNF grammar of Lark text ``text`` with start rule ``start`` (module docstring).

    Raises GrammarError (syntax, unknown start, nothing generated) or UnsupportedGrammarError.
    """
    parser = _load(text, start)
    defs = {t.name: t for t in parser.terminals}
    used = {s.name for r in parser.rules for s in r.expansion if s.is_term} | set(parser.ignore_tokens)
    missing = sorted(used - set(defs))
    if missing:
        raise UnsupportedGrammarError(
            f"terminal {missing[0]}{line_of(text, missing[0])} has no pattern (%declare); "
            f"define it with a string or regex")
    names = sorted(used)
    term_id = {n: k for k, n in enumerate(names)}
    terminals = tuple(_terminal(defs[n], text) for n in names)
    nonterminals: list[str] = []
    nt_id: dict[str, int] = {}

    def nonterminal(name: str) -> int:
        if name not in nt_id:
            nt_id[name] = len(nonterminals)
            nonterminals.append(name)
        return nt_id[name]

    nonterminal(start)
    rules = []
    for rule in parser.rules:
        rhs = tuple(terminal_symbol(term_id[s.name]) if s.is_term else nonterminal(s.name)
                    for s in rule.expansion)
        rules.append((nonterminal(rule.origin.name), rhs))
    ignore = tuple(sorted({term_id[n] for n in parser.ignore_tokens}))
    return Grammar(tuple(nonterminals), terminals, tuple(rules), nt_id[start], ignore, text)
