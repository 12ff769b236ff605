"""GBNF (llama.cpp's grammar format) → :class:`~ctrlg.dfa.cfg.grammar_ir.Grammar`.

Supported: rules ``name ::= …`` (names of letters, digits and ``-``; a rule ends where the next
``name ::=`` begins), alternatives ``|``, grouping ``( )``, string literals ``"…"``, character
classes ``[…]`` / ``[^…]`` with ranges, ``.`` (any character), repetition ``*``, ``+``, ``?``,
``{m}``, ``{m,}``, ``{m,n}``, ``{,n}``, comments ``#…``, and the escapes ``\\n \\r \\t \\\\ \\"
\\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH``. Everything is character-level (GBNF has no lexer and
no ``%ignore``): each literal and class is a terminal of its own. Repetitions become left-linear
helper rules (``N → ε | N x``), which the regular approximation turns back into loops.

Unsupported, with :class:`~ctrlg.errors.UnsupportedGrammarError` naming the construct and its
line: token references ``<…>`` / ``!<…>`` (a specific tokenizer's ids) and anything else.
Cost: linear in the text.
"""

from __future__ import annotations

import re

from ctrlg.dfa.cfg.grammar_ir import Grammar, Terminal, terminal_symbol
from ctrlg.dfa.regex_syntax import (MAX_CODE_POINT, SURROGATES, CharSet, Concat, complement_ranges,
                                    normalize_ranges)
from ctrlg.errors import GrammarError, UnsupportedGrammarError

__all__ = ["from_gbnf"]

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+|\#[^\n]*)
  | (?P<define>::=)
  | (?P<name>[A-Za-z0-9_-]+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<cls>\[(?:[^\]\\]|\\.)*\])
  | (?P<braces>\{\s*\d*\s*(?:,\s*\d*\s*)?\})
  | (?P<op>[|()*+?.])
""", re.X | re.S)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-",
            "/": "/", "'": "'"}


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos, line = [], 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            construct = "a token reference <…>" if text[pos] in "<!" else repr(text[pos:pos + 10])
            raise UnsupportedGrammarError(f"GBNF line {line}: {construct} is not supported")
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return out


def _chars(body: str, line: int) -> list[int]:
    """Code points of a literal's or class's body, escapes resolved."""
    out, k = [], 0
    while k < len(body):
        c = body[k]
        if c != "\\":
            out.append(ord(c))
            k += 1
            continue
        e = body[k + 1:k + 2]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width:
            digits = body[k + 2:k + 2 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise GrammarError(f"GBNF line {line}: bad escape \\{e}{digits}")
            value = int(digits, 16)
            if value > MAX_CODE_POINT:
                raise GrammarError(f"GBNF line {line}: escape \\{e}{digits} is beyond U+10FFFF, "
                                   f"the last Unicode code point")
            out.append(value)
            k += 2 + width
        elif e in _ESCAPES:
            out.append(ord(_ESCAPES[e]))
            k += 2
        else:
            raise GrammarError(f"GBNF line {line}: unknown escape \\{e}")
    return out


def _char_class(text: str, line: int) -> CharSet:
    body = text[1:-1]
    negate = body.startswith("^")
    # ranges a-b are read on the raw items, so that an escaped dash \- stays a character
    raw, ranges, k = body[1:] if negate else body, [], 0
    items = re.findall(r"\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|\\U[0-9a-fA-F]{8}|\\.|.", raw, re.S)
    cps = [_chars(i, line)[0] for i in items]
    while k < len(items):
        if k + 2 < len(items) and items[k + 1] == "-":
            ranges.append((cps[k], cps[k + 2]))
            k += 3
        else:
            ranges.append((cps[k], cps[k]))
            k += 1
    if not ranges and not negate:
        raise GrammarError(f"GBNF line {line}: empty character class {text}")
    rs = normalize_ranges(ranges)                # surrogates removed: no UTF-8 encoding
    result = complement_ranges(rs) if negate else rs
    if not result:
        raise GrammarError(f"GBNF line {line}: the character class {text} matches no encodable "
                           f"character (surrogates U+D800-U+DFFF have no UTF-8 encoding)")
    return CharSet(result)


#: the largest repetition count ``{m,n}`` read (the grammar's size is bounded again as a whole,
#: :func:`ctrlg.dfa.cfg.approximation.check_grammar_size`)
MAX_COUNT = 10_000


class _Reader:
    """Recursive descent over the tokens, emitting BNF rules (module docstring)."""

    def __init__(self, tokens):
        self.tokens, self.pos = tokens, 0
        self.names: list[str] = []
        self.ids: dict[str, int] = {}
        self.rules: list[tuple[int, tuple[int, ...]]] = []
        self.terminals: list[Terminal] = []
        self.term_ids: dict[tuple, int] = {}
        self.defined: dict[str, int] = {}
        self.used: dict[str, int] = {}

    def peek(self, k: int = 0):
        return self.tokens[self.pos + k] if self.pos + k < len(self.tokens) else ("end", "", -1)

    def nonterminal(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.names)
            self.names.append(name)
        return self.ids[name]

    def fresh(self, line: int) -> int:
        return self.nonterminal(f"<group line {line} #{len(self.names)}>")

    def terminal(self, node, label: str) -> int:
        key = (node,)
        if key not in self.term_ids:
            self.term_ids[key] = len(self.terminals)
            self.terminals.append(Terminal(f"GBNF {label}", node, label))
        return terminal_symbol(self.term_ids[key])

    def read(self) -> None:
        while self.peek()[0] != "end":
            kind, name, line = self.peek()
            if kind != "name" or self.peek(1)[0] != "define":
                raise GrammarError(f"GBNF line {line}: expected 'name ::=', got {name!r}")
            self.pos += 2
            self.defined.setdefault(name, line)
            lhs = self.nonterminal(name)
            for seq in self.alternatives(top=True):
                self.rules.append((lhs, seq))

    def alternatives(self, top: bool) -> list[tuple[int, ...]]:
        seqs = [self.sequence(top)]
        while self.peek()[1] == "|" and self.peek()[0] == "op":
            self.pos += 1
            seqs.append(self.sequence(top))
        return seqs

    def sequence(self, top: bool) -> tuple[int, ...]:
        out = []
        while True:
            kind, value, line = self.peek()
            if kind == "end" or (kind == "op" and value in "|)"):
                break
            if top and kind == "name" and self.peek(1)[0] == "define":
                break
            out.extend(self.item())
        return tuple(out)

    def item(self) -> list[int]:
        sym, line = self.atom()
        kind, value, _ = self.peek()
        if kind == "op" and value in "*+?":
            self.pos += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[value]
        elif kind == "braces":
            self.pos += 1
            lo, hi = _bounds(value, line)
        else:
            return [sym]
        return [self.repeat(sym, lo, hi, line)]

    def repeat(self, sym: int, lo: int, hi: int | None, line: int) -> int:
        """N deriving x^lo..x^hi in O(hi) rule symbols (as llama.cpp expands it): N → x^lo T_k
        with T_j → ε | x T_(j-1), T_0 → ε, k = hi − lo; N → x^lo | N x when unbounded. Counts
        beyond :data:`MAX_COUNT` are refused before any rule is built."""
        for count in (lo, hi):
            if count is not None and count > MAX_COUNT:
                raise GrammarError(f"GBNF line {line}: repetition count {count:,} exceeds the "
                                   f"bound of {MAX_COUNT:,} (its automata would take minutes "
                                   f"to build); use '*' or '+' for an unbounded repetition")
        n = self.fresh(line)
        if hi is None:               # N → x^lo | N x
            self.rules.append((n, (sym,) * lo))
            self.rules.append((n, (n, sym)))
            return n
        tail = None
        for _ in range(hi - lo):     # T_j → ε | x T_(j-1)
            t = self.fresh(line)
            self.rules.append((t, ()))
            self.rules.append((t, (sym,) if tail is None else (sym, tail)))
            tail = t
        self.rules.append((n, (sym,) * lo + (() if tail is None else (tail,))))
        return n

    def atom(self) -> tuple[int, int]:
        kind, value, line = self.peek()
        self.pos += 1
        if kind == "name":
            self.used.setdefault(value, line)
            return self.nonterminal(value), line
        if kind == "string":
            cps = _chars(value[1:-1], line)
            if not cps:
                n = self.fresh(line)
                self.rules.append((n, ()))
                return n, line
            surrogate = next((c for c in cps if SURROGATES[0] <= c <= SURROGATES[1]), None)
            if surrogate is not None:
                raise GrammarError(
                    f"GBNF line {line}: the literal {value} holds the surrogate U+{surrogate:04X}, "
                    f"which has no UTF-8 encoding (the bytes it would give are not valid UTF-8); "
                    f"write the character itself or its code point above U+FFFF")
            return self.terminal(Concat(tuple(CharSet(((c, c),)) for c in cps)), value), line
        if kind == "cls":
            return self.terminal(_char_class(value, line), value), line
        if kind == "op" and value == ".":
            return self.terminal(CharSet(((0, MAX_CODE_POINT),)), "."), line
        if kind == "op" and value == "(":
            n = self.fresh(line)
            for seq in self.alternatives(top=False):
                self.rules.append((n, seq))
            if self.peek()[1] != ")":
                raise GrammarError(f"GBNF line {line}: '(' is never closed")
            self.pos += 1
            return n, line
        raise GrammarError(f"GBNF line {line}: unexpected {value or 'end of grammar'!r}")


def _bounds(text: str, line: int) -> tuple[int, int | None]:
    inner = text[1:-1].replace(" ", "")
    lo_s, _, hi_s = inner.partition(",")
    lo = int(lo_s) if lo_s else 0
    hi = lo if "," not in inner else (int(hi_s) if hi_s else None)
    if hi is not None and hi < lo:
        raise GrammarError(f"GBNF line {line}: repetition {text} has max < min")
    return lo, hi


def from_gbnf(text: str, start: str = "root") -> Grammar:
    """The BNF grammar of GBNF ``text`` with start rule ``start`` (module docstring).

    Raises GrammarError (syntax, undefined rule, unknown start) or UnsupportedGrammarError."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("the grammar text is empty; give GBNF rules such as 'root ::= \"a\"+'")
    reader = _Reader(_tokens(text))
    reader.read()
    for name, line in reader.used.items():
        if name not in reader.defined:
            raise GrammarError(f"GBNF line {line}: rule {name!r} is used but never defined")
    if start not in reader.defined:
        raise GrammarError(f"the GBNF grammar has no rule {start!r} (the start rule)")
    return Grammar(tuple(reader.names), tuple(reader.terminals), tuple(reader.rules),
                   reader.ids[start], (), text)
