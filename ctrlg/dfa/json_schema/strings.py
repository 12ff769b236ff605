"""Strings of a JSON Schema as regexes: ``pattern``, length bounds, ``format``, property names.

* A JSON string literal's characters are :data:`STRING_CHAR` (no ``\\uXXXX`` escapes, no control
  or U+007F–U+009F characters); lengths count decoded characters.
* ``pattern`` has ``re.search`` semantics (as ``jsonschema`` checks it): unanchored ends get
  ``[^"\\\\…]*``; characters a JSON string would have to escape are removed from its classes, so
  the literal's characters are the decoded string's.
* ``pattern`` (or a format) **with** ``minLength``/``maxLength``: :func:`fit_length` rewrites
  the pattern's AST into a sub-language whose every string has a length in the bounds (a sound
  subset: the slack above the minimum lengths goes to the leftmost parts, loops are cut to the
  counts that fit, an item of a loop keeps one length) — no automaton intersection needed.
* ``format``: :data:`FORMATS`, each a subset of the format's strings that the format's checker
  accepts (e.g. dates with days that exist, RFC 3339 date-times with an offset, ``https``
  URIs); unknown formats are annotations (ignored).
* :func:`names_except` is the regex of the strings outside a finite set (a trie walk), for
  additional property names that must differ from the declared ones.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache

from ctrlg.dfa.lazy import LazyByteDFA
from ctrlg.dfa.lazy_nfa import lazy_thompson
from ctrlg.dfa.regex_syntax import (Alternation, Anchor, CharSet, Concat, Node, Repeat, parse,
                                    search_language)
from ctrlg.errors import RegexError, UnsupportedSchemaError

__all__ = ["STRING_CHAR", "STRING", "FORMATS", "escape", "pattern_ast", "fit_length",
           "ast_to_regex", "names_except", "length_range"]

#: one character of a JSON string literal: an unescaped character or a two-character escape
STRING_CHAR = r'(?:[^"\\\x00-\x1f\x7f-\x9f]|\\["\\/bfnrt])'
STRING = f'"{STRING_CHAR}*"'
#: a character of a generated property name (no escapes: names compare as written)
NAME_CHAR = r'[^"\\\x00-\x1f\x7f-\x9f]'
_FREE = r'[^"\\\x00-\x1f\x7f-\x9f]'
_SPECIAL = "\\.^$*+?{}[]|()-/"
_D = "[0-9]"
_LABEL = "[a-z](?:[a-z0-9-]{0,20}[a-z0-9])?"
_DATE = (r"[1-9][0-9]{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
         r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
         r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_IPV4_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_HEX4 = "[0-9a-f]{1,4}"
_HOST = rf"{_LABEL}(?:\.{_LABEL}){{0,3}}"
_PATH = r"(?:/[a-zA-Z0-9._~-]{1,20}){0,4}"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": rf"[a-zA-Z0-9._+-]{{1,30}}@{_LABEL}(?:\.{_LABEL}){{1,3}}",
    "hostname": _HOST,
    "ipv4": rf"{_IPV4_OCTET}(?:\.{_IPV4_OCTET}){{3}}",
    "ipv6": rf"{_HEX4}(?::{_HEX4}){{7}}",
    "uri": rf"https?://{_HOST}{_PATH}",
    "uri-reference": rf"(?:https?://{_HOST})?{_PATH}",
    "byte": r"(?:[A-Za-z0-9+/]{4}){0,30}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?",
    "duration": r"P(?:[0-9]{1,4}Y)?(?:[0-9]{1,4}M)?[0-9]{1,4}D(?:T[0-9]{1,4}H)?"
                r"|PT[0-9]{1,4}H(?:[0-9]{1,4}M)?(?:[0-9]{1,4}S)?",
    "json-pointer": r"(?:/(?:[a-zA-Z0-9._-]|~[01]){0,20}){0,4}",
    "int32": r"-?(?:0|[1-9][0-9]{0,8})",
    "int64": r"-?(?:0|[1-9][0-9]{0,17})",
    "regex": r"[a-zA-Z0-9 _]{0,20}",
}
for _alias, _of in {"idn-email": "email", "idn-hostname": "hostname", "iri": "uri",
                    "iri-reference": "uri-reference", "uri-template": "uri-reference"}.items():
    FORMATS[_alias] = FORMATS[_of]


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value, separators=None) -> str:
    """``json.dumps(value, ensure_ascii=False)`` with every lone surrogate in a string written
    as its ``\\udxxx`` escape: the only JSON text of that string that is UTF-8 (a surrogate
    has no UTF-8 encoding); ``json.loads`` reads the escape back as the same value."""
    text = json.dumps(value, ensure_ascii=False, separators=separators)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def escape(text: str) -> str:
    """``text`` as a regex literal (ASCII punctuation and control characters escaped)."""
    out = []
    for ch in text:
        if ch in _SPECIAL:
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def length_range(lo: int, hi: int | None) -> str:
    """Any string content of ``lo`` to ``hi`` characters."""
    if lo == 0 and hi is None:
        return f"{STRING_CHAR}*"
    return f"{STRING_CHAR}{{{lo},{'' if hi is None else hi}}}"


# ---------------------------------------------------------------------- pattern
_FORBIDDEN = ((0x00, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\")), (0x7F, 0x9F))


def pattern_ast(pattern, path: str, *, escapable: bool = False) -> Node:
    """The AST of the (decoded) string contents matched by ``pattern`` under ``re.search``
    semantics. Without ``escapable`` it is restricted to characters that need no escape (for
    property names, which compare as written); with it, characters a JSON literal must escape
    (``"``, ``\\``, U+0000–U+001F) and U+007F–U+009F stay, and :func:`ast_to_regex` with
    ``json_escapes`` writes the sets made only of them as escapes. The unanchored ends take
    unescaped characters only (a sound subset)."""
    if not isinstance(pattern, str):
        raise UnsupportedSchemaError(f"'pattern' at {path} must be a string, got {pattern!r}")
    try:
        ast = parse(pattern, anchors=True)
        return search_language(ast if escapable else _restrict(ast),
                               _restrict(CharSet(((0, 0x10FFFF),))))
    except RegexError as exc:
        raise UnsupportedSchemaError(f"'pattern' {pattern!r} at {path}: {exc}") from None


def _restrict(node: Node) -> Node:
    if isinstance(node, Anchor):
        return node
    if isinstance(node, CharSet):
        out = []
        for lo, hi in node.ranges:
            pieces = [(lo, hi)]
            for f_lo, f_hi in _FORBIDDEN:
                nxt = []
                for a, b in pieces:
                    if b < f_lo or a > f_hi:
                        nxt.append((a, b))
                        continue
                    if a < f_lo:
                        nxt.append((a, f_lo - 1))
                    if b > f_hi:
                        nxt.append((f_hi + 1, b))
                pieces = nxt
            out.extend(pieces)
        return CharSet(tuple(out))
    if isinstance(node, Concat):
        return Concat(tuple(_restrict(n) for n in node.items))
    if isinstance(node, Alternation):
        return Alternation(tuple(_restrict(n) for n in node.items))
    return Repeat(_restrict(node.item), node.min, node.max)


def ast_to_regex(node: Node, *, json_escapes: bool = False) -> str:
    """The regex of an AST of decoded characters; with ``json_escapes``, of their JSON string
    literal, so that every match decodes to a string of ``node``: a character set made only of
    characters that must (or, for U+007F–U+009F, here do) appear escaped — a literal backslash,
    quote or newline in the pattern — is written as their escapes (:func:`_escaped_chars`); a set
    that also has plain characters (``.``, ``\\S``, ``[^/]``) keeps only those (a sound subset:
    their escapes would multiply the automaton's states under counted repetitions)."""
    if isinstance(node, CharSet):
        if json_escapes:
            plain = _restrict(node)
            if not plain.ranges and node.ranges:
                return _escaped_chars(node)
            node = plain
        if not node.ranges:
            return "[^\\x00-\\U0010ffff]"
        if len(node.ranges) == 1 and node.ranges[0][0] == node.ranges[0][1]:
            return _cp(node.ranges[0][0])
        return "[" + "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}"
                             for lo, hi in node.ranges) + "]"
    if isinstance(node, Concat):
        return "".join(f"(?:{ast_to_regex(n, json_escapes=json_escapes)})" if isinstance(n, Alternation)
                       else ast_to_regex(n, json_escapes=json_escapes) for n in node.items)
    if isinstance(node, Alternation):
        return "(?:" + "|".join(ast_to_regex(n, json_escapes=json_escapes) for n in node.items) + ")"
    hi = "" if node.max is None else node.max
    return f"(?:{ast_to_regex(node.item, json_escapes=json_escapes)}){{{node.min},{hi}}}"


_SHORT_ESCAPES = {0x22: r'\\"', 0x5C: r"\\\\", 0x08: r"\\b", 0x0C: r"\\f", 0x0A: r"\\n",
                  0x0D: r"\\r", 0x09: r"\\t"}


def _escaped_chars(node: CharSet) -> str:
    """The regex of the JSON escapes of the characters of ``node`` (at least one) that
    :data:`_FORBIDDEN` keeps out of a literal unescaped: RFC 8259's two-character escapes where
    they exist (``\\"``, ``\\\\``, ``\\n``, …) and ``\\u00XX`` (lower-case hex) for every
    forbidden code point, grouped by its third hex digit."""
    cps = sorted(cp for lo, hi in node.ranges for f_lo, f_hi in _FORBIDDEN
                 for cp in range(max(lo, f_lo), min(hi, f_hi) + 1))
    short = [_SHORT_ESCAPES[cp] for cp in cps if cp in _SHORT_ESCAPES]
    by_high: dict[int, list[int]] = {}
    for cp in cps:
        if cp not in (0x22, 0x5C):
            by_high.setdefault(cp >> 4, []).append(cp & 0xF)
    groups = []
    for high, lows in by_high.items():
        digits = "".join(f"{low:x}" for low in lows)
        groups.append(f"{high:x}" + (digits if len(lows) == 1 else f"[{digits}]"))
    unicode = [r"\\u00(?:" + "|".join(groups) + ")"] if groups else []
    return "(?:" + "|".join(short + unicode) + ")"


def _cp(cp: int) -> str:
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


# ---------------------------------------------------------------------- lengths
def _span(node: Node) -> tuple[int, float]:
    """(shortest, longest) string length of ``node`` (``inf``: unbounded; a CharSet with no
    range matches nothing and reports (1, 1))."""
    if isinstance(node, CharSet):
        return 1, 1
    if isinstance(node, Concat):
        spans = [_span(x) for x in node.items]
        return sum(a for a, _ in spans), sum(b for _, b in spans)
    if isinstance(node, Alternation):
        spans = [_span(x) for x in node.items]
        return min(a for a, _ in spans), max(b for _, b in spans)
    a, b = _span(node.item)
    top = math.inf if node.max is None else node.max
    return a * node.min, (b * top if b else 0)


def fit_length(node: Node, lo: int, hi: float) -> Node | None:
    """A sub-language of ``node`` whose strings all have lengths in ``[lo, hi]``
    (module docstring), or ``None`` when this construction finds none."""
    a, b = _span(node)
    if a > hi or b < lo:
        return None
    if lo <= a and b <= hi:
        return node
    if isinstance(node, CharSet):
        return node
    if isinstance(node, Alternation):
        items = [y for y in (fit_length(x, lo, hi) for x in node.items) if y is not None]
        return Alternation(tuple(items)) if items else None
    if isinstance(node, Concat):
        spans = [_span(x) for x in node.items]
        slack = hi - sum(s for s, _ in spans)
        deficit = lo - sum(s for s, _ in spans)
        out = []
        for x, (s, t) in zip(node.items, spans):
            give = min(t - s, slack)
            slack -= give
            top = s + give
            take = min(top - s, max(deficit, 0))
            deficit -= take
            y = fit_length(x, s + take, top)
            if y is None:
                return None
            out.append(y)
        return Concat(tuple(out)) if deficit <= 0 else None
    ia, ib = _span(node.item)
    item, size = node.item, ia
    if ia != ib:
        size = ia if ia > 0 else 1
        item = fit_length(node.item, size, size)
        if item is None:
            return Concat(()) if node.min == 0 and lo <= 0 else None
    if size == 0:
        return node if lo <= 0 else None
    k_lo = max(node.min, math.ceil(lo / size))
    k_hi = min(math.inf if node.max is None else node.max,
               math.inf if hi == math.inf else math.floor(hi / size))
    if k_lo > k_hi:
        return None
    return Repeat(item, k_lo, None if k_hi == math.inf else int(k_hi))


# ---------------------------------------------------------------------- property names
def names_except(names) -> str:
    """Regex of the property names (characters of :data:`NAME_CHAR`) not in ``names``."""
    trie: dict = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[None] = True
    return _outside(trie)


def _outside(node: dict) -> str:
    chars = [ch for ch in node if ch is not None]
    if not chars:
        return f"{NAME_CHAR}+" if None in node else f"{NAME_CHAR}*"
    other = "[^\"\\\\\\x00-\\x1f\\x7f-\\x9f" + "".join(escape(c) if c in "]^-\\" or c in _SPECIAL
                                                    else c for c in chars) + "]"
    alts = [f"{other}{NAME_CHAR}*"] + [escape(c) + _outside(node[c]) for c in chars]
    body = "(?:" + "|".join(alts) + ")"
    return body if None in node else f"(?:{body})?"


def disjoint(a: Node, b: Node) -> bool:
    """Whether no string matches both ASTs (breadth-first search of the product of their
    byte DFAs)."""
    return not _product_finds(a, b, inside_b=True)


def included(a: Node, b: Node) -> bool:
    """Whether every string of ``a`` matches ``b``."""
    return not _product_finds(a, b, inside_b=False)


def _product_finds(a: Node, b: Node, inside_b: bool) -> bool:
    """Whether some string of ``a`` is (``inside_b``) or is not a string of ``b``: a search of
    the product of their byte DFAs, built lazily (:class:`~ctrlg.dfa.lazy.LazyByteDFA`: only
    the rows of the pairs reached, so two patterns that differ in their first bytes cost a
    few rows; state 0 is dead and every other state can still accept)."""
    da, db = _lazy_dfa(a), _lazy_dfa(b)
    if da.initial == 0 or (inside_b and db.initial == 0):
        return False
    seen = {(da.initial, db.initial)}
    queue = list(seen)
    while queue:
        p, q = queue.pop()
        if da.accepting[p] and bool(db.accepting[q]) == inside_b:
            return True
        for pair in set(zip(da.row(p).tolist(), db.row(q).tolist())):
            if pair[0] and (pair[1] or not inside_b) and pair not in seen:
                seen.add(pair)
                queue.append(pair)
    return False


@lru_cache(maxsize=512)
def _lazy_dfa(node: Node):
    """The lazily determinised byte DFA of ``node`` (kept: a schema's patterns are compared
    pairwise, each many times)."""
    nfa, start, accept = lazy_thompson(node)
    return LazyByteDFA(nfa, start, accept)
