"""Regular-expression parser: pattern string → abstract syntax tree over Unicode code points.

A small recursive-descent parser for the *regular* subset of Python's ``re`` syntax. Python's
``re`` module compiles to a backtracking program and cannot give an automaton, and
``interegular`` rejects several constructs we need (and is an extra dependency), so the parser
is hand-written; it produces an AST that :mod:`ctrlg.dfa.bytes_dfa` turns into a byte-level DFA.

Grammar (precedence from loosest to tightest)::

    alternation := concat ('|' concat)*
    concat      := repeat*
    repeat      := atom quantifier?          quantifier := (* | + | ? | {m} | {m,} | {,n} | {m,n}) '?'?
    atom        := literal | escape | '.' | class | '(' alternation ')' | '(?:' alternation ')'
                 | '(?P<name>' alternation ')'

Supported syntax (the language is what Python's ``re.fullmatch`` matches, with flags 0):

* literals (any code point), ``.`` (any code point except ``\\n``);
* escapes ``\\d \\D \\w \\W \\s \\S`` (Unicode semantics, as Python's ``re`` on ``str``),
  ``\\t \\n \\r \\f \\v \\a``, octal escapes as ``re`` reads them (``\\0``, ``\\01``,
  ``\\012``, ``\\101``; in a class also ``[\\1]``), ``\\xhh``, ``\\uhhhh``, ``\\Uhhhhhhhh``,
  ``\\N{NAME}``, and any escaped punctuation (``\\. \\* \\[`` ...);
* classes ``[...]`` with ranges, negation ``[^...]`` and the escapes above inside;
* groups ``(...)``, ``(?:...)``, ``(?P<name>...)``, comments ``(?#...)`` and the scoped flag
  groups ``(?i:...)`` / ``(?-i:...)`` (case-insensitive as ``re.IGNORECASE`` reads it,
  :func:`ignore_case`; how Lark joins a terminal's parts with different flags);
* alternation ``|`` (a true union: ``a|ab`` matches both ``a`` and ``ab``);
* quantifiers ``* + ? {m} {m,} {,n} {m,n} {,}`` (``{,}`` is ``{0,}``, as in ``re``; a brace that
  is not a quantifier, such as ``{}``, ``{,`` or ``{1,x}``, is literal text); lazy variants
  (``*?`` ...) denote the same language;
* anchors ``^``/``\\A`` at the very start and ``$``/``\\Z`` at the very end (no-ops under the
  full-match semantics); with ``parse(..., anchors=True)`` anchors anywhere (``^a$|^b$``,
  ``^(x$|y)``) are kept as :class:`Anchor` nodes and :func:`search_language` gives the strings
  ``re.search`` finds a match in (JSON Schema's ``pattern``).

Rejected with :class:`~ctrlg.errors.UnsupportedRegexError` naming the construct (they are not
regular, or need context the automaton does not see): backreferences (``\\1``, ``(?P=name)``,
``\\k<name>``), lookahead/lookbehind (``(?=``, ``(?!``, ``(?<=``, ``(?<!``), atomic groups
``(?>``, possessive quantifiers (``*+`` ...), conditionals ``(?(``, word boundaries ``\\b \\B``,
other inline flags (``(?i)``, ``(?s:...)`` ...), Unicode properties ``\\p{..}`` and anchors in the middle of a pattern.
Syntax errors and empty patterns raise :class:`~ctrlg.errors.RegexError`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ctrlg.errors import RegexError, UnsupportedRegexError

__all__ = [
    "Node", "CharSet", "Concat", "Alternation", "Repeat", "EMPTY", "Anchor",
    "parse", "search_language", "MAX_CODE_POINT", "class_ranges", "matches_empty", "positions",
    "repeat_copies", "ignore_case", "surrogate_hint"
]

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # not encodable in UTF-8; never part of a match
MAX_REPEAT = 1000              # larger bounds would blow the automaton up


# ---------------------------------------------------------------------- AST
class Node:
    """Base class of AST nodes."""


@dataclass(frozen=True)
class CharSet(Node):
    """One code point from a union of inclusive ranges ``((lo, hi), ...)``, sorted, disjoint.
    Never a surrogate (U+D800–U+DFFF: no UTF-8 encoding, so never part of a match): ranges
    given with one are stored without it, wherever the set was built (a pattern character, an
    escape, a class, a JSON Schema value, a grammar literal)."""
    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self):
        if any(lo <= SURROGATES[1] and hi >= SURROGATES[0] for lo, hi in self.ranges):
            object.__setattr__(self, "ranges", normalize_ranges(self.ranges))


@dataclass(frozen=True)
class Concat(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alternation(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat(Node):
    """``item`` repeated between ``min`` and ``max`` times (``max=None``: unbounded)."""
    item: Node
    min: int
    max: int | None


EMPTY = Concat(())  # the empty string


@dataclass(frozen=True)
class Anchor(Node):
    """A zero-width anchor kept by ``parse(..., anchors=True)``: ``start`` (``^``, ``\\A``) or
    ``end`` (``$``, ``\\Z``); :func:`search_language` removes them. ``symbol``: how it was
    written (``$`` also matches before a final newline, ``\\Z`` only at the very end)."""
    at: str
    symbol: str = ""


def positions(node: Node) -> int:
    """The number of character positions of the regex with counted repetitions expanded
    (``X{m,n}`` counts ``X`` ``max(m, n)`` times, ``X*`` once): the size of its Thompson NFA
    up to a constant factor, and the number of states a counter adds to the DFA. A sub-tree
    shared by several parents (a parser that shares groups builds a DAG) is computed once."""
    memo: dict[int, int] = {}

    def go(x: Node) -> int:
        got = memo.get(id(x))
        if got is None:
            if isinstance(x, CharSet):
                got = 1
            elif isinstance(x, (Concat, Alternation)):
                got = sum(go(y) for y in x.items)
            else:
                got = go(x.item) * repeat_copies(x.min, x.max)
            memo[id(x)] = got
        return got

    return go(node)


def repeat_copies(low: int, high: int | None) -> int:
    """How many copies of its item a repetition ``{low,high}`` expands to (``high=None``: one
    loop)."""
    return max(low, high if high is not None else 1, 1)


def matches_empty(node: Node) -> bool:
    """Whether the regex ``node`` matches the empty string (nullability, by structural recursion)."""
    if isinstance(node, CharSet):
        return False
    if isinstance(node, Concat):
        return all(matches_empty(x) for x in node.items)
    if isinstance(node, Alternation):
        return any(matches_empty(x) for x in node.items)
    return node.min == 0 or matches_empty(node.item)


# ---------------------------------------------------------------------- code-point ranges
def normalize_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sort, merge and remove surrogates from a list of inclusive code-point ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    cleaned = []
    s_lo, s_hi = SURROGATES
    for lo, hi in out:
        if hi < s_lo or lo > s_hi:
            cleaned.append((lo, hi))
        else:
            if lo < s_lo:
                cleaned.append((lo, s_lo - 1))
            if hi > s_hi:
                cleaned.append((s_hi + 1, hi))
    return tuple(cleaned)


def complement_ranges(ranges) -> tuple[tuple[int, int], ...]:
    out = []
    nxt = 0
    for lo, hi in normalize_ranges(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return normalize_ranges(out)


def _mask_to_ranges(mask: np.ndarray) -> tuple[tuple[int, int], ...]:
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.diff(padded)
    starts = np.nonzero(edges == 1)[0]
    ends = np.nonzero(edges == -1)[0] - 1
    return normalize_ranges(zip(starts.tolist(), ends.tolist()))


@lru_cache(maxsize=None)
def class_ranges(letter: str) -> tuple[tuple[int, int], ...]:
    """Code-point ranges of ``\\d``, ``\\w`` or ``\\s`` exactly as Python's ``re`` defines them
    for ``str`` patterns: ``str.isdecimal``, ``str.isalnum() or '_'``, ``str.isspace`` (the
    predicates ``re`` uses; the tests check them against ``re``), vectorised with ``np.char``."""
    code_points = np.arange(MAX_CODE_POINT + 1, dtype=np.uint32)
    code_points[SURROGATES[0]:SURROGATES[1] + 1] = ord("!")  # removed by normalize_ranges
    chars = code_points.view("<U1")
    if letter == "d":
        mask = np.char.isdecimal(chars)
    elif letter == "s":
        mask = np.char.isspace(chars)
    elif letter == "w":
        mask = np.char.isalnum(chars) | (chars == "_")
    else:
        raise KeyError(letter)
    return _mask_to_ranges(np.asarray(mask, dtype=bool))


def _class_escape(letter: str) -> tuple[tuple[int, int], ...] | None:
    if letter in "dws":
        return class_ranges(letter)
    if letter in "DWS":
        return complement_ranges(class_ranges(letter.lower()))
    return None


@lru_cache(maxsize=1)
def _case_related() -> tuple[int, ...]:
    """Every code point whose matching under ``re.IGNORECASE`` can differ from plain matching:
    the cased ones (a lower, upper or folded form other than themselves) and every code point of
    those forms. ``re`` relates a character only to its simple lower case, that form's upper
    case and its own table of extra equivalences (``ſ``/``s``, ``K``/Kelvin sign, ...), all
    cased, so any other code point matches an atom under IGNORECASE iff it does without.
    Computed by ``str.lower`` / ``upper`` / ``casefold`` over blocks of 4,096 code points (one
    character at a time in a block where a form is longer than its character)."""
    out: set[int] = set()
    block = 4096
    for base in range(0, MAX_CODE_POINT + 1, block):
        cps = [cp for cp in range(base, min(base + block, MAX_CODE_POINT + 1))
               if not SURROGATES[0] <= cp <= SURROGATES[1]]
        if not cps:
            continue
        text = "".join(map(chr, cps))
        forms = (text.lower(), text.upper(), text.casefold())
        if all(len(f) == len(text) for f in forms):
            plain = np.array(cps, dtype=np.uint32)
            for f in forms:
                mapped = np.frombuffer(f.encode("utf-32-le"), dtype=np.uint32)
                differ = mapped != plain
                out.update(plain[differ].tolist())
                out.update(mapped[differ].tolist())
            continue
        for cp in cps:
            c = chr(cp)
            forms_of_c = c.lower() + c.upper() + c.casefold()
            if forms_of_c != c * 3:
                out.add(cp)
                out.update(map(ord, forms_of_c))
    return tuple(sorted(out))


@lru_cache(maxsize=4096)
def ignore_case(ranges: tuple[tuple[int, int], ...], source: str) -> tuple[tuple[int, int], ...]:
    """The code points Python's ``re`` matches, under ``re.IGNORECASE``, at one atom whose
    source text is ``source`` (a character, an escape, a class or ``.``) and whose plain set is
    ``ranges``: Unicode case-insensitive matching as Lark's ``"…"i`` / ``/…/i`` (and so
    ``re``) reads it — ``"é"i`` matches ``É``, ``"s"i`` the long s ``ſ``, ``/k/i`` the Kelvin
    sign. ``re`` itself decides every case-related code point (:func:`_case_related`, ~3,000:
    exact, quirks of its classes included); every other one keeps its plain membership."""
    related = _case_related()
    compiled = re.compile(source, re.IGNORECASE)
    keep, k = [], 0
    for lo, hi in ranges:                    # ranges minus the case-related points
        while k < len(related) and related[k] < lo:
            k += 1
        start = lo
        while k < len(related) and related[k] <= hi:
            if related[k] > start:
                keep.append((start, related[k] - 1))
            start = related[k] + 1
            k += 1
        if start <= hi:
            keep.append((start, hi))
    keep += [(cp, cp) for cp in related if compiled.fullmatch(chr(cp))]
    return normalize_ranges(keep)


DOT_RANGES = complement_ranges([(ord("\n"), ord("\n"))])
_BRACES = re.compile(r"\{(\d*)(,(\d*))?\}")   # a brace quantifier, as Python's re reads one
_GROUP_NAME = re.compile(r"\?P<([A-Za-z_]\w*)>")
_CHAR_NAME = re.compile(r"\{([^}]*)\}")
#: characters atom() reads as themselves (not '|' or ')', which end a concatenation)
_LITERAL_RUN = re.compile(r"[^()\[.^$*+?{\\|]+")
_DIGITS = "0123456789"                         # re's DIGITS (ASCII only)
_OCTAL = "01234567"
SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


# ---------------------------------------------------------------------- parser
class _Parser:
    def __init__(self, pattern: str, anchors: bool = False, ignore_case: bool = False):
        self.p = pattern
        self.i = 0
        self.anchors = anchors   # keep every anchor as an Anchor node (search_language)
        self.ignore_case = ignore_case   # every atom as re.IGNORECASE reads it
        self.group_names: set[str] = set()

    def _atom_set(self, ranges: tuple[tuple[int, int], ...], start: int) -> CharSet:
        """The CharSet of the atom ``self.p[start:self.i]`` whose plain set is ``ranges``."""
        if self.ignore_case:
            ranges = ignore_case(ranges, self.p[start:self.i])
        return CharSet(ranges)

    # -- helpers
    def error(self, message: str, cls=RegexError):
        raise cls(f"{message} at position {self.i} in regex {self.p!r}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < len(self.p) else ""

    def startswith(self, s: str) -> bool:
        return self.p.startswith(s, self.i)

    # -- grammar
    def parse(self) -> Node:
        node = self.alternation(top=True)
        if self.i != len(self.p):
            if self.peek() == ")":
                self.error("unbalanced parenthesis ')'")
            self.error(f"unexpected {self.peek()!r}")
        return node

    def alternation(self, top: bool = False) -> Node:
        branches = [self.concat(top)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.concat(top))
        return branches[0] if len(branches) == 1 else Alternation(tuple(branches))

    def concat(self, top: bool) -> Node:
        items: list[Node] = []
        p, n = self.p, len(self.p)
        while self.i < n and p[self.i] not in "|)":
            m = _LITERAL_RUN.match(p, self.i)
            if m is not None:     # plain characters, as atom() reads them, one node each
                end = m.end()
                if end < n and p[end] in "*+?{":
                    end -= 1      # the last one may carry a quantifier: repeat() reads it
                if self.ignore_case:
                    items.extend([CharSet(ignore_case(_point(ord(c)), re.escape(c)))
                                  for c in p[self.i:end]])
                else:
                    items.extend([_literal(c) for c in p[self.i:end]])
                self.i = end
                if self.i >= n or p[self.i] in "|)":
                    break
            node = self.repeat(top)
            if node is not None:
                items.append(node)
        return items[0] if len(items) == 1 else Concat(tuple(items))

    def repeat(self, top: bool) -> Node | None:
        start = self.i
        atom = self.atom(top)
        if atom is None:
            if self.peek() in ("*", "+", "?") or self._quantifier_ahead():
                self.i = start if self.i == start else self.i
                self.error("nothing to repeat")
            return None
        if isinstance(atom, Anchor) and (self.peek() in ("*", "+", "?") or self._quantifier_ahead()):
            self.error("a quantified anchor is not supported", UnsupportedRegexError)
        quantified = False
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.i += 1
            elif c == "{" and self._quantifier_ahead():
                lo, hi = self._braces()
            else:
                return atom
            if quantified:
                self.i -= 1
                self.error("multiple repeat")
            quantified = True
            if self.peek() == "?":        # lazy: same language
                self.i += 1
            elif self.peek() == "+":
                self.error("possessive quantifier (e.g. '*+') is not supported",
                           UnsupportedRegexError)
            atom = Repeat(atom, lo, hi)

    def _quantifier_ahead(self) -> bool:
        """Whether a brace quantifier starts here, by Python's rule: ``{`` digits* (``,``
        digits*)? ``}`` except ``{}`` (so ``{,}`` is ``{0,}``, ``{,n}`` is ``{0,n}``, and a
        malformed brace such as ``{}``, ``{,`` or ``{1,x}`` is literal text)."""
        return _BRACES.match(self.p, self.i) is not None and not self.startswith("{}")

    def _braces(self) -> tuple[int, int | None]:
        m = _BRACES.match(self.p, self.i)
        assert m is not None
        lo = int(m.group(1)) if m.group(1) else 0
        if m.group(2) is None:
            hi: int | None = lo
        else:
            hi = int(m.group(3)) if m.group(3) else None
        if hi is not None and hi < lo:
            self.error(f"min repeat greater than max repeat in {m.group(0)!r}")
        if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
            self.error(f"repetition bound {m.group(0)!r} exceeds {MAX_REPEAT}")
        self.i = m.end()
        return lo, hi

    def atom(self, top: bool) -> Node | None:
        c = self.peek()
        start = self.i
        if c == "(":
            return self.group()
        if c == "[":
            return self._atom_set(self.char_class(), start)
        if c == ".":
            self.i += 1
            return self._atom_set(DOT_RANGES, start)
        if c in "^$" and self.anchors:
            self.i += 1
            return Anchor("start" if c == "^" else "end", c)
        if self.anchors and (self.startswith("\\A") or self.startswith("\\Z")):
            self.i += 2
            return Anchor("start" if self.p[self.i - 1] == "A" else "end", self.p[self.i - 2:self.i])
        if c == "^":
            if not (top and self.i == 0):
                self.error("anchor '^' is only supported at the start of the pattern",
                           UnsupportedRegexError)
            self.i += 1
            return None
        if c == "$":
            if not (top and self.i == len(self.p) - 1):
                self.error("anchor '$' is only supported at the end of the pattern",
                           UnsupportedRegexError)
            self.i += 1
            return None
        if c in ("*", "+", "?"):
            self.error("nothing to repeat")
        if c == "{" and self._quantifier_ahead():
            self.error("nothing to repeat")
        if c == "\\":
            if self.startswith("\\A"):
                if not (top and self.i == 0):
                    self.error("anchor '\\A' is only supported at the start of the pattern",
                               UnsupportedRegexError)
                self.i += 2
                return None
            if self.startswith("\\Z"):
                if not (top and self.i == len(self.p) - 2):
                    self.error("anchor '\\Z' is only supported at the end of the pattern",
                               UnsupportedRegexError)
                self.i += 2
                return None
            return self._atom_set(self.escape(in_class=False), start)
        self.i += 1
        return self._atom_set(_point(ord(c)), start)

    def group(self) -> Node | None:
        start = self.i
        self.i += 1
        if self.peek() == "?":
            p, i = self.p, self.i      # (no slice of the rest: O(1) per group, not O(pattern))
            unsupported = [("?=", "lookahead '(?='"), ("?!", "negative lookahead '(?!'"),
                           ("?<=", "lookbehind '(?<='"), ("?<!", "negative lookbehind '(?<!'"),
                           ("?>", "atomic group '(?>'"), ("?(", "conditional '(?('"),
                           ("?P=", "backreference '(?P='")]
            for prefix, name in unsupported:
                if p.startswith(prefix, i):
                    self.i = start
                    self.error(f"{name} is not supported (not a regular construct)",
                               UnsupportedRegexError)
            scoped = next((f for f in ("?i:", "?-i:") if p.startswith(f, i)), None)
            if p.startswith("?:", i):
                self.i += 2
            elif scoped is not None:     # (?i:...) / (?-i:...): Lark joins terminals so
                self.i += len(scoped)
                outer, self.ignore_case = self.ignore_case, scoped == "?i:"
                try:
                    node = self.alternation()
                finally:
                    self.ignore_case = outer
                if self.peek() != ")":
                    self.i = start
                    self.error("missing ), unterminated subpattern")
                self.i += 1
                return node
            elif p.startswith("?#", i):
                end = self.p.find(")", self.i)
                if end < 0:
                    self.error("missing ), unterminated comment")
                self.i = end + 1
                return None
            elif p.startswith("?<", i):   # ECMAScript's named group; Python's re refuses it
                self.i = start
                self.error("unknown extension '(?<' (a named group is written '(?P<name>...)' "
                           "in Python's re)")
            elif p.startswith("?P<", i):
                m = _GROUP_NAME.match(p, i)
                if m is None:
                    self.error("bad group name")
                name = m.group(1)
                if name in self.group_names:
                    self.i = start
                    self.error(f"redefinition of group name {name!r} (a name may name one "
                               f"group only, as in Python's re)")
                self.group_names.add(name)
                self.i = m.end()
            else:
                self.i = start
                self.error("inline flags and other '(?...' extensions are not supported",
                           UnsupportedRegexError)
        node = self.alternation()
        if self.peek() != ")":
            self.i = start
            self.error("missing ), unterminated subpattern")
        self.i += 1
        return node

    def escape(self, in_class: bool) -> tuple[tuple[int, int], ...]:
        """Parse an escape starting at a backslash; return its code-point ranges."""
        self.i += 1
        c = self.peek()
        if c == "":
            self.error("bad escape (end of pattern)")
        self.i += 1
        cls = _class_escape(c)
        if cls is not None:
            return cls
        if c in SIMPLE_ESCAPES:
            return _point(ord(SIMPLE_ESCAPES[c]))
        if c == "b" and in_class:
            return _point(8)
        if c in "bB":
            self.i -= 2
            self.error(f"word boundary '\\{c}' is not supported", UnsupportedRegexError)
        if c in _DIGITS:
            return self._octal_or_group(c, in_class)
        if c == "k" and self.peek() == "<":
            self.i -= 2
            self.error("backreference '\\k<...>' is not supported", UnsupportedRegexError)
        if c in "pP":
            self.i -= 2
            self.error(f"Unicode property '\\{c}{{...}}' is not supported", UnsupportedRegexError)
        if c in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[c]
            digits = self.p[self.i:self.i + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                self.i -= 2
                self.error(f"incomplete escape '\\{c}{digits}'")
            self.i += width
            value = int(digits, 16)
            if value > MAX_CODE_POINT:
                self.error(f"bad escape '\\{c}{digits}' (beyond U+10FFFF)")
            return _point(value)
        if c == "N":
            m = _CHAR_NAME.match(self.p, self.i)
            if m is None:
                self.error("missing '{' after \\N")
            try:
                value = ord(unicodedata.lookup(m.group(1)))
            except KeyError:
                self.error(f"undefined character name {m.group(1)!r}")
            self.i = m.end()
            return _point(value)
        if c.isascii() and c.isalnum():
            self.i -= 2
            self.error(f"bad escape '\\{c}'")
        return _point(ord(c))

    def _octal_or_group(self, c: str, in_class: bool) -> tuple[tuple[int, int], ...]:
        """A backslash followed by the digit ``c``, read as Python's ``re`` reads it: ``\\0``
        and up to two more octal digits is an octal escape; in a class any ``\\`` + octal
        digit starts an octal escape of up to three digits (``\\8``, ``\\9``: bad escape);
        outside one, three octal digits (``\\101``) are an octal escape and any other ``\\`` +
        one or two digits a group reference (a backreference: not regular). An octal value
        above 0o377 (``\\400``) is an error, as in ``re``."""
        start = self.i - 2
        if c == "0" or (in_class and c in _OCTAL):
            m = re.compile(r"[0-7]{0,2}").match(self.p, self.i)
        elif c in _OCTAL and re.compile(r"[0-7]{2}").match(self.p, self.i):
            m = re.compile(r"[0-7]{2}").match(self.p, self.i)
        elif in_class:
            self.i = start
            self.error(f"bad escape '\\{c}'")
        else:
            digits = re.compile(r"\d?").match(self.p, self.i).group(0)   # re reads \1 .. \99
            self.i = start
            self.error(f"backreference '\\{c}{digits}' is not supported (not a regular "
                       f"construct); write an octal escape with three digits (\\101) or "
                       f"\\x41 for a character", UnsupportedRegexError)
        self.i = m.end()
        value = int(c + m.group(0), 8)
        if value > 0o377:
            self.i = start
            self.error(f"octal escape value '\\{c}{m.group(0)}' outside of range 0-0o377")
        return _point(value)

    def char_class(self) -> tuple[tuple[int, int], ...]:
        start = self.i
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c == "":
                self.i = start
                self.error("unterminated character set")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo_ranges = self._class_item()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                if len(lo_ranges) != 1 or lo_ranges[0][0] != lo_ranges[0][1]:
                    self.error("bad character range (a class escape cannot start a range)")
                self.i += 1
                hi_ranges = self._class_item()
                if len(hi_ranges) != 1 or hi_ranges[0][0] != hi_ranges[0][1]:
                    self.error("bad character range (a class escape cannot end a range)")
                lo, hi = lo_ranges[0][0], hi_ranges[0][0]
                if hi < lo:
                    self.error(f"bad character range {chr(lo)!r}-{chr(hi)!r} (its end comes "
                               f"before its start)")
                ranges.append((lo, hi))
            else:
                ranges.extend(lo_ranges)
        result = normalize_ranges(ranges)
        return complement_ranges(result) if negate else result

    def _class_item(self) -> tuple[tuple[int, int], ...]:
        c = self.peek()
        if c == "\\":
            return self.escape(in_class=True)
        self.i += 1
        return _point(ord(c))


@lru_cache(maxsize=4096)
def _literal(c: str) -> CharSet:
    """The CharSet of one plain character (shared: the AST is immutable)."""
    return CharSet(((ord(c), ord(c)),))


def _point(cp: int) -> tuple[tuple[int, int], ...]:
    """The one code point ``cp`` as written (a surrogate too: a class range may start or end
    at one; :class:`CharSet` and :func:`normalize_ranges` leave surrogates out)."""
    return ((cp, cp),)


_SURROGATE_ESCAPE = re.compile(r"\\[uU]0{0,4}[dD][89a-fA-F][0-9a-fA-F]{2}")


def surrogate_hint(text: str) -> str:
    """A note for a message about ``text`` (a pattern, or its ``repr``) that names a
    surrogate, as a character or an escape: surrogates never match (:class:`CharSet`)."""
    if any(SURROGATES[0] <= ord(c) <= SURROGATES[1] for c in text) or \
            _SURROGATE_ESCAPE.search(text):
        return (" (it names surrogate code points U+D800-U+DFFF, which UTF-8 text never "
                "contains, so they match nothing)")
    return ""


def parse(pattern: str, *, anchors: bool = False, ignore_case: bool = False) -> Node:
    """Parse ``pattern`` into an AST (see the module docstring for the supported syntax). With
    ``anchors``, every ``^ $ \\A \\Z`` (anywhere) becomes an :class:`Anchor` node, for
    :func:`search_language`; with ``ignore_case``, every atom matches what it matches under
    ``re.IGNORECASE`` (:func:`ignore_case`).

    Raises:
        RegexError: the pattern is empty, not a string, or syntactically invalid.
        UnsupportedRegexError: the pattern uses a non-regular construct (named in the message).
    """
    if not isinstance(pattern, str):
        raise RegexError(f"regex pattern must be a str, got {type(pattern).__name__}")
    if pattern == "":
        raise RegexError("regex pattern is empty")
    return _Parser(pattern, anchors, ignore_case).parse()


def search_language(node: Node, free: Node) -> Node:
    """The strings in which ``re.search`` finds a match of ``node`` (an AST with
    :class:`Anchor` nodes from ``parse(..., anchors=True)``), with ``free`` the characters a
    match may have around it: ``free* · match · free*``, where a branch that passed a start
    anchor has no prefix and one that passed an end anchor no suffix.

    Anchors are eliminated by structural recursion over *branches* (start?, end?, AST): a start
    anchor after a part of a concatenation keeps only that part's empty match, an end anchor
    before a part likewise, and branches with the same flags are merged, so a node has at most
    four. ``$`` is taken as the end of the string (Python's also matches before a final
    newline: those strings are left out, a subset). Cost: linear in the AST. Anchors inside a
    repetition raise :class:`~ctrlg.errors.UnsupportedRegexError`."""
    parts = []
    for (start, end), body in _anchor_branches(node).items():
        items = ([] if start else [Repeat(free, 0, None)]) + [body] + ([] if end else [Repeat(free, 0, None)])
        parts.append(Concat(tuple(items)))
    if not parts:
        return CharSet(())
    return parts[0] if len(parts) == 1 else Alternation(tuple(parts))


def _anchor_branches(node: Node) -> dict[tuple[bool, bool], Node]:
    """{(passed a start anchor, passed an end anchor): anchor-free AST} (see search_language)."""
    if isinstance(node, Anchor):
        return {(node.at == "start", node.at == "end"): EMPTY}
    if isinstance(node, CharSet):
        return {(False, False): node}
    if isinstance(node, Alternation):
        out: dict[tuple[bool, bool], list[Node]] = {}
        for item in node.items:
            for flags, body in _anchor_branches(item).items():
                out.setdefault(flags, []).append(body)
        return {f: b[0] if len(b) == 1 else Alternation(tuple(b)) for f, b in out.items()}
    if isinstance(node, Concat):
        acc: dict[tuple[bool, bool], Node] = {(False, False): EMPTY}
        for item in node.items:
            nxt: dict[tuple[bool, bool], list[Node]] = {}
            branches = _anchor_branches(item)
            for (s1, e1), left in acc.items():
                for (s2, e2), right in branches.items():
                    if s2 and not matches_empty(left) or e1 and not matches_empty(right):
                        continue         # nothing may come before a start / after an end anchor
                    before = EMPTY if s2 else left
                    after = EMPTY if e1 else right
                    body = Concat(tuple(x for x in (before, after) if x != EMPTY))
                    nxt.setdefault((s1 or s2, e1 or e2), []).append(body)
            acc = {f: b[0] if len(b) == 1 else Alternation(tuple(b)) for f, b in nxt.items()}
        return acc
    inner = _anchor_branches(node.item)
    if any(flags != (False, False) for flags in inner):
        raise UnsupportedRegexError("an anchor inside a repetition is not supported")
    return {(False, False): Repeat(inner[(False, False)], node.min, node.max)}
