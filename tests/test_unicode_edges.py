"""Unicode at the edges of each reference: surrogates (U+D800–U+DFFF, no UTF-8 encoding) never
match on any path — regexes eager and lazy, JSON Schema values and property names, Lark literals
and regexes — and Lark's case-insensitive ``"…"i`` / ``/…/i`` read as Python's ``re`` reads
``re.IGNORECASE`` (Unicode), checked against ``re`` over every code point and against lark on
enumerated strings over non-ASCII alphabets."""

import itertools
import json
import re

import jsonschema
import lark
import pytest

from ctrlg import dfa
from ctrlg.dfa.bytes_dfa import compile_ast
from ctrlg.dfa.regex_syntax import MAX_CODE_POINT, SURROGATES, CharSet, ignore_case, parse
from ctrlg.errors import RegexError, UnsatisfiableConstraintError

SURROGATE_BYTES = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xb0\x80"]    # U+D800, U+DFFF, U+DC00
# a vocabulary whose tokens spell surrogates' UTF-8-like bytes, JSON punctuation and escapes
TOKENS = [b"a", b"b", b'"', b"{", b"}", b":", b"\\", b"u", b"d", b"8", b"0", b"c",
          *SURROGATE_BYTES, b"\xed", b"\xa0", b"\x80", b""]
EOS = len(TOKENS) - 1


def spells(constraint, data: bytes) -> bool:
    """Whether a token sequence of single bytes / whole surrogate tokens spelling ``data`` is
    accepted (tries the surrogate tokens and the byte tokens)."""
    whole = {t: i for i, t in enumerate(TOKENS) if t}
    paths = [[]]
    rest = [data]
    out = False
    while paths:
        path, tail = paths.pop(), rest.pop()
        if not tail:
            out = out or constraint.accepts(path + [EOS])
            continue
        for t, i in whole.items():
            if tail.startswith(t):
                paths.append(path + [i])
                rest.append(tail[len(t):])
    return out


@pytest.mark.parametrize("build", [
    lambda: dfa.regex("a\ud800|a", TOKENS, eos_token_id=EOS),
    lambda: dfa.regex("a[\ud800-\udfff]?", TOKENS, eos_token_id=EOS),
    lambda: dfa.regex("a(\ud800|\udfff)*", TOKENS, eos_token_id=EOS),
    lambda: dfa.regex("a[^b]?", TOKENS, eos_token_id=EOS),
    lambda: dfa.regex("a.?", TOKENS, eos_token_id=EOS),
    lambda: dfa.regex("a[\ud7ff-\ue000]?", TOKENS, eos_token_id=EOS),
    lambda: dfa.lazy_regex("a\ud800|a", TOKENS, eos_token_id=EOS),
    lambda: dfa.lazy_regex("a[\udc00-\udfff]*", TOKENS, eos_token_id=EOS),
    # Lark reads the escapes of its literals and regexes into the surrogates themselves
    lambda: dfa.grammar('start: "a" /[\\ud800-\\udfff]/?', TOKENS, eos_token_id=EOS),
    lambda: dfa.grammar('start: "a" ("\\ud800" | "b")?', TOKENS, eos_token_id=EOS),
    lambda: dfa.grammar('start: "a" ("\\udfff"i | /b\\udc00/)?', TOKENS, eos_token_id=EOS),
])
def test_surrogates_never_match(build):
    """Before, ``a\\ud800`` written as characters compiled to an automaton that accepted
    ``a`` + ED A0 80 (not UTF-8); now no path accepts a surrogate's bytes, and the rest of the
    language is kept (``a`` still matches)."""
    constraint = build()
    assert spells(constraint, b"a")
    for raw in SURROGATE_BYTES:
        assert not spells(constraint, b"a" + raw)
        assert not spells(constraint, b"a" + raw + raw)


@pytest.mark.parametrize("pattern", ["\ud800", "[\ud800-\udfff]", r"[\ud800-\udfff]",
                                     "\udc00+", "(?:\ud800|\udbff)"])
def test_a_pattern_of_surrogates_only_is_named_as_such(pattern):
    """``[\\ud800-\\udfff]`` said 'a class escape cannot start a range'; now a pattern that
    only names surrogates matches nothing, and the error says why."""
    for build in (dfa.regex, dfa.lazy_regex):
        with pytest.raises(UnsatisfiableConstraintError, match="surrogate code points"):
            build(pattern, TOKENS, eos_token_id=EOS)


def test_charsets_never_hold_surrogates_however_built():
    assert CharSet(((0xD800, 0xD800),)).ranges == ()
    assert CharSet(((0xD000, 0xE000),)).ranges == ((0xD000, 0xD7FF), (0xE000, 0xE000))
    node = parse("[\ud7ff-\ue000]x")
    assert not compile_ast(node).fullmatch("\ud800x".encode("utf-8", "surrogatepass"))
    assert compile_ast(node).fullmatch("\ue000x".encode())


def test_duplicate_group_names_are_refused_as_re_refuses_them():
    with pytest.raises(re.error):
        re.compile("(?P<n>a)(?P<n>b)")
    for pattern in ("(?P<n>a)(?P<n>b)", "(?P<x>a|(?P<x>b))"):
        with pytest.raises(RegexError, match="redefinition of group name"):
            dfa.regex(pattern, TOKENS, eos_token_id=EOS)
    assert dfa.regex("(?P<n>a)(?P<m>b)", TOKENS, eos_token_id=EOS).accepts([0, 1])


JSON_TOKENS = [bytes([b]) for b in range(256)] + [b""]      # every byte, then EOS
JSON_EOS = len(JSON_TOKENS) - 1


@pytest.mark.parametrize("schema, instance", [
    ({"enum": ["\ud800"]}, "\ud800"),
    ({"const": "a\udc00"}, "a\udc00"),
    ({"enum": ["a", "\udfff"]}, "\udfff"),
    ({"type": "object", "properties": {"\ud800": {"const": 1}}, "required": ["\ud800"]},
     {"\ud800": 1}),
    ({"const": {"\udc01": "\ud80c"}}, {"\udc01": "\ud80c"}),
])
@pytest.mark.parametrize("build", [dfa.json_schema, dfa.lazy_json_schema])
def test_json_values_with_surrogates_are_written_as_escapes(schema, instance, build):
    """A string value holding a lone surrogate was written raw (ED A0 80, not UTF-8); it is
    now written as its JSON escape, the only UTF-8 spelling, which jsonschema accepts."""
    constraint = build(schema, JSON_TOKENS, eos_token_id=JSON_EOS)
    text = json.dumps(instance, separators=(",", ":"))        # ASCII: surrogates escaped
    jsonschema.validate(json.loads(text), schema)
    assert constraint.accepts(list(text.encode()) + [JSON_EOS])
    raw = json.dumps(instance, ensure_ascii=False, separators=(",", ":"))
    assert not constraint.accepts(list(raw.encode("utf-8", "surrogatepass")) + [JSON_EOS])


# ------------------------------------------------------------------------- case folding
def _all_code_points():
    return (cp for cp in range(MAX_CODE_POINT + 1) if not SURROGATES[0] <= cp <= SURROGATES[1])


@pytest.mark.parametrize("source", ["[a-z]", "[^s]", "[\U00010400a]"])
def test_ignore_case_is_res_ignorecase_on_every_code_point(source):
    """:func:`ignore_case` against ``re.fullmatch(source, c, re.IGNORECASE)`` for every code
    point (the quirks of ``re``'s classes included: an upper-case astral letter in a class
    with others matches nothing)."""
    plain = parse(source)
    ranges = ignore_case(plain.ranges, source)
    compiled = re.compile(source, re.IGNORECASE)
    inside = set()
    for lo, hi in ranges:
        inside.update(range(lo, hi + 1))
    wrong = [cp for cp in _all_code_points() if (cp in inside) != bool(compiled.fullmatch(chr(cp)))]
    assert not wrong, [hex(cp) for cp in wrong[:10]]


ALPHABET = "sSſkKKéÉeEıiIİßẞσςΣµΜ1"
TOKENS_CI = [c.encode() for c in ALPHABET] + [b""]


@pytest.mark.parametrize("text", [
    'start: "é"i', 'start: "s"i', 'start: /k/i', 'start: "i"i', 'start: "İ"i', 'start: /ı/i',
    'start: /[a-z]+/i', 'start: /[^a]/i', 'start: "σ"i "ß"i', 'start: /[à-ÿ]/i',
    'start: /µ|k/i', 'start: WORD\nWORD: /[a-z]/i /s/ | "KE"i',
])
def test_lark_case_insensitive_terminals_match_what_lark_matches(text):
    """Before, the ``i`` flag folded ASCII only: ``"é"i`` did not match ``É``, ``"s"i`` not
    ``ſ``, ``/k/i`` not the Kelvin sign. Every string of ≤ 2 characters over a non-ASCII
    alphabet: ctrlg's grammar accepts it iff lark parses it."""
    g = dfa.grammar(text, TOKENS_CI, eos_token_id=len(TOKENS_CI) - 1)
    parser = lark.Lark(text, parser="earley", lexer="dynamic_complete")
    for k in (1, 2):
        for chars in itertools.product(ALPHABET, repeat=k):
            s = "".join(chars)
            try:
                parser.parse(s)
                expected = True
            except lark.exceptions.LarkError:
                expected = False
            assert g.matches(s) == expected, (text, s)
