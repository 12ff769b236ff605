"""Lark grammar text → :class:`~ctrlg.dfa.cfg.grammar_ir.Grammar`, read by the ``lark`` library itself.

Lark (``lark.Lark(text, parser="earley")``) parses the grammar, resolves ``%import`` (e.g.
``common.WS``, ``common.NUMBER``), templates, ``%override`` / ``%extend``, and expands EBNF —
``?rule`` inlining, ``|``, ``*``, ``+``, ``?``, ``[ ]``, ``~ m..n`` — into BNF rules; each terminal
is then one regular expression (strings and regexes joined). This module turns that BNF into
ours: every terminal's pattern through ctrlg's regex parser (:mod:`ctrlg.dfa.regex_syntax`), the
``i`` flag as Python's ``re.IGNORECASE`` reads it (Unicode: ``"é"i`` matches ``É``, ``"s"i`` the
long s ``ſ``, ``/k/i`` the Kelvin sign; :func:`~ctrlg.dfa.regex_syntax.ignore_case`).

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

import functools
import re

import lark

from ctrlg.dfa.cfg.anchors import check_branches, has_anchor, terminal_branches
from ctrlg.dfa.cfg.grammar_ir import Grammar, Terminal, terminal_symbol
from ctrlg.dfa.regex_syntax import (Alternation, CharSet, Concat, Node, ignore_case,
                                    matches_empty, normalize_ranges, parse)
from ctrlg.errors import GrammarError, RegexError, UnsupportedGrammarError

__all__ = ["from_lark", "forget_read_grammars", "line_of"]

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


def _literal(value: str, folded: bool) -> Node:
    """A string terminal: each character, or with Lark's ``i`` flag every character ``re``
    matches it with under ``re.IGNORECASE`` (Unicode: ``"é"i`` also matches ``É``)."""
    return Concat(tuple(CharSet(ignore_case(((ord(c), ord(c)),), re.escape(c)) if folded
                                else normalize_ranges([(ord(c), ord(c))])) for c in value))


def _terminal(defn, text: str) -> Terminal:
    """One Lark TerminalDef as a :class:`Terminal` (module docstring for what is refused)."""
    name, pattern = defn.name, defn.pattern
    where = line_of(text, name if not name.startswith("__") else pattern.value)
    shown = _printable(pattern.value)
    flags = set(pattern.flags) - {"i"}
    if flags:
        raise UnsupportedGrammarError(
            f"terminal {name}{where} uses the regex flag(s) {sorted(flags)}; only 'i' is supported")
    if pattern.type == "str":
        node = _literal(pattern.value, "i" in pattern.flags)
        if not pattern.value:
            raise GrammarError(f"terminal {name}{where} is the empty string")
    else:
        source = pattern.value.replace(_ESCAPED_INNER, _ESCAPED_REGULAR)
        try:
            node = parse(source, anchors=True, ignore_case="i" in pattern.flags)
        except RegexError as err:
            raise UnsupportedGrammarError(
                f"terminal {name}{where}: /{shown}/ is not a supported regular "
                f"expression: {err}") from None
    branches = ()
    if pattern.type == "re" and has_anchor(node):
        what = f"terminal {name}{where} /{shown}/"
        branches = terminal_branches(node, what)
        check_branches(branches, what)
        bodies = [b.body for b in branches]
        node = bodies[0] if len(bodies) == 1 else Alternation(tuple(bodies))
    if matches_empty(node):
        raise UnsupportedGrammarError(
            f"terminal {name}{where} matches the empty string; make it match at least one "
            f"character and write the occurrence as optional ({name}?) in the rules")
    return Terminal(name, node, f"{name}: /{shown}/" if pattern.type == "re"
                    else f'{name}: "{shown}"', branches)


def _printable(value: str) -> str:
    """``value`` for a message: a surrogate (no UTF-8 encoding) as its ``\\udxxx`` escape."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


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


#: grammars read by :func:`from_lark` kept, by (text, start rule)
MAX_READ_GRAMMARS = 64


def from_lark(text: str, start: str = "start") -> Grammar:
    """The BNF grammar of Lark text ``text`` with start rule ``start`` (module docstring).
    The last :data:`MAX_READ_GRAMMARS` texts read are kept (the :class:`Grammar` is immutable):
    Lark's own reading, the modules it imports included, is most of a small grammar's
    compile (≈ 13 ms of the JSON example's).

    Raises GrammarError (syntax, unknown start, nothing generated) or UnsupportedGrammarError.
    """
    if isinstance(text, str) and isinstance(start, str):
        return _read_lark(text, start)
    return _from_lark(text, start)


@functools.lru_cache(maxsize=MAX_READ_GRAMMARS)
def _read_lark(text: str, start: str) -> Grammar:
    return _from_lark(text, start)


def forget_read_grammars() -> None:
    """Empty :func:`from_lark`'s memo (``ctrlg.dfa.cfg.constraint.clear_shared_caches``)."""
    _read_lark.cache_clear()


def _from_lark(text: str, start: str) -> Grammar:
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
