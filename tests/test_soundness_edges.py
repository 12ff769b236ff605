"""Soundness at the edges of regex, grammars and JSON Schema: each constraint is exactly the
language its reference reads (Python ``re``, ``lark``, ``jsonschema``) or a clear error.

Regex brace quantifiers and octal escapes as ``re`` reads them; Lark anchors, flags, imports
and deep rules; GBNF surrogates and out-of-range escapes; JSON Schema numeric keywords at the
extremes of floating point and bare self-references; size bounds checked before the work; and
partition refinement that is not quadratic in a chain's length. Property tests compare against
the references on generated edge inputs."""

from __future__ import annotations

import itertools
import json
import math
import re
import time

import jsonschema
import lark
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa.bytes_dfa import compile_bytes_dfa
from ctrlg.errors import (ConstraintError, GrammarError, RegexError, SchemaError,
                          UnsupportedGrammarError, UnsupportedRegexError)

BYTES = [bytes([i]) for i in range(256)] + [b""]      # every byte a token; the last one EOS
EOS = 256


def re_language(pattern: str, strings) -> list | str:
    """The strings ``re.fullmatch`` accepts, or "error" when ``re`` refuses the pattern."""
    try:
        compiled = re.compile(pattern)
    except (re.error, OverflowError):
        return "error"
    return [s for s in strings if compiled.fullmatch(s)]


def ctrlg_language(pattern: str, strings) -> list | str:
    try:
        d = compile_bytes_dfa(pattern)
    except RegexError:
        return "error"
    return [s for s in strings if d.fullmatch(s.encode("utf-8"))]


# ------------------------------------------------------------------ regex: braces, octal
BRACE_STRINGS = ["", "a", "aa", "aaa", "aaaa", "a{}", "a{,", "a{1,2", "a{ 1}", "a{1,x}", "{",
                 "a{,}", "x", "ax"]


@pytest.mark.parametrize("pattern, expected", [
    ("a{,}", ["", "a", "aa", "aaa", "aaaa"]),          # was read as the literal text "a{,}"
    ("a{,}?", ["", "a", "aa", "aaa", "aaaa"]),
    ("a{,2}", ["", "a", "aa"]),
    ("a{2,}", ["aa", "aaa", "aaaa"]),
    ("a{}", ["a{}"]), ("a{,", ["a{,"]), ("a{1,2", ["a{1,2"]), ("a{ 1}", ["a{ 1}"]),
    ("a{1,x}", ["a{1,x}"]), ("{", ["{"]),
])
def test_brace_quantifiers_as_re_reads_them(pattern, expected):
    assert re_language(pattern, BRACE_STRINGS) == expected
    assert ctrlg_language(pattern, BRACE_STRINGS) == expected


@pytest.mark.parametrize("pattern", ["{,}", "a|{,}", "a{,}{2}", "a{,}*"])
def test_brace_quantifier_errors_as_re(pattern):
    assert re_language(pattern, BRACE_STRINGS) == "error"
    with pytest.raises(RegexError):
        compile_bytes_dfa(pattern)


OCTAL_STRINGS = ["A", "\x00", "\x01", "\n", "\n3", "\x018", "\xff", "\t", "8", "\x08", "S"]


@pytest.mark.parametrize("pattern, expected", [
    (r"\101", ["A"]),                 # was refused as a backreference
    (r"\0", ["\x00"]), (r"\01", ["\x01"]), (r"\012", ["\n"]), (r"\0123", ["\n3"]),
    (r"\377", ["\xff"]), (r"[\101]", ["A"]), (r"[\1]", ["\x01"]), (r"[\18]", ["\x01", "8"]),
    (r"[\11]", ["\t"]), (r"\123", ["S"]),
])
def test_octal_escapes_as_re_reads_them(pattern, expected):
    assert re_language(pattern, OCTAL_STRINGS) == expected
    assert ctrlg_language(pattern, OCTAL_STRINGS) == expected


@pytest.mark.parametrize("pattern, error", [
    (r"\1", UnsupportedRegexError), (r"\10", UnsupportedRegexError),
    (r"\8", UnsupportedRegexError), (r"\11", UnsupportedRegexError),
    (r"\400", RegexError), (r"[\400]", RegexError), (r"[\8]", RegexError),
])
def test_group_references_and_bad_octals_are_refused(pattern, error):
    assert re_language(pattern, OCTAL_STRINGS) in ("error", [])
    with pytest.raises(error, match="backreference|octal|bad escape"):
        compile_bytes_dfa(pattern)


_ATOMS = ["a", "b", ".", "[ab]", "[^a]", r"\d", r"\w", r"\s", r"\101", r"\0", r"\01", r"\x41",
          r"\u00e9", r"\t", r"\n", r"\.", "(a|b)", "(?:ab)", r"\1", r"\8", r"[\1]", "{", "}",
          r"\B", "é", "ab", r"\N{DIGIT ONE}", r"\Z", "^", "$", "(?i)", "(?<n>a)"]
_QUANTS = ["", "*", "+", "?", "{,}", "{,2}", "{2,}", "{1,2}", "{}", "{,", "{2}", "*?", "{,}?",
           "{a}", "*+"]
_EDGE_STRINGS = ["", "a", "b", "aa", "ab", "ba", "A", "AA", "é", "1", "\x00", "\x01", "\t",
                 "\n", ".", "{", "}", "{}", "a{,", "{,", "x", "abab", "\t\t", "11", "aaa"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_ATOMS), st.sampled_from(_QUANTS)), min_size=1,
                max_size=3), st.booleans())
def test_edge_patterns_agree_with_re(parts, alternate):
    """Generated patterns over escapes, braces, octals and anchors: the same language as
    ``re.fullmatch`` on edge strings, or an error where ``re`` refuses (or where the construct
    is not regular: ctrlg refuses, ``re`` may accept)."""
    pattern = "".join(a + q for a, q in parts)
    if alternate:
        pattern = f"{pattern}|b"
    ref = re_language(pattern, _EDGE_STRINGS)
    got = ctrlg_language(pattern, _EDGE_STRINGS)
    if got == "error":
        return                                 # refused: never a silent wrong answer
    assert ref != "error", f"re refuses {pattern!r}, ctrlg accepts it"
    assert got == ref, pattern


# ------------------------------------------------------------------ partition refinement
def test_refinement_is_not_quadratic_in_a_chain():
    """Hopcroft's refinement of the class-level automaton of a chain of n symbols whose class
    count grows with n (as a literal's token classes do), from {dead, accepting, rejecting}:
    4n costs well under 16× n (quadratic: 16×; the old refinement queued every (block, class)
    pair per split and indexed the edges into the dead state)."""
    from ctrlg.dfa.minimize import hopcroft_refine

    def chain(n, classes):
        rng = np.random.default_rng(0)
        table = np.zeros((n + 2, classes), dtype=np.int64)     # 0 dead, 1..n+1 the chain
        labels = rng.integers(1, classes, size=n)
        table[np.arange(1, n + 1), labels] = np.arange(2, n + 2)
        block = np.full(n + 2, 2)
        block[0], block[n + 1] = 0, 1
        return table, block

    def timed(n):
        table, block = chain(n, n // 40 + 2)
        t = time.perf_counter()
        out = hopcroft_refine(table, block, sink=0)
        assert len(np.unique(out)) == n + 2       # distinct suffixes: every state its own block
        return time.perf_counter() - t

    timed(200)
    small, large = min(timed(2000) for _ in range(3)), min(timed(8000) for _ in range(3))
    assert large < 10 * small, (small, large)


def test_minimize_table_with_a_sink_against_moore():
    """The minimal automaton (sink left out of Hopcroft's index, budgeted Moore rounds) has as
    many states as the plain Moore partition says, on random automata with dead states."""
    from ctrlg.dfa.minimize import minimize_table, moore_partition
    from ctrlg.dfa.core import bfs_order, distinct_edges

    rng = np.random.default_rng(5)
    for _ in range(200):
        S, C = int(rng.integers(1, 30)), int(rng.integers(1, 5))
        table = rng.integers(0, S, size=(S, C))
        table[0] = 0                                           # a dead state, sometimes
        accepting = rng.random(S) < 0.3
        accepting[0] = accepting[0] and rng.random() < 0.5
        start = int(rng.integers(0, S))
        reach = bfs_order(start, *distinct_edges(table), S)
        remap = np.full(S, -1)
        remap[reach] = np.arange(len(reach))
        sub = remap[table[reach]]
        expected = len(np.unique(moore_partition(sub, accepting[reach], max_rounds=None)))
        got, acc = minimize_table(table, accepting, start)
        assert got.shape[0] == expected
        assert moore_partition(got, acc, max_rounds=None).max() + 1 == got.shape[0]  # minimal


@pytest.mark.parametrize("rounds", [0, 1, 3])
def test_byte_refinement_finished_by_hopcroft_is_exact(monkeypatch, rounds):
    """The byte DFA's worklist refinement handed to Hopcroft after a few rounds gives the same
    minimal DFA (same tables) as the refinement alone."""
    from ctrlg.dfa import bytes_dfa as bd

    patterns = ["a{30}", "(ab|ba)*c", "[a-c]{2,4}|x+", r'"([^"\\]|\\.)*"', "(a{3}){4}b?",
                "é{2,5}|[α-ω]+"]
    expected = [compile_bytes_dfa(p) for p in patterns]
    monkeypatch.setattr(bd, "WORKLIST_ROUNDS", rounds)
    for p, e in zip(patterns, expected):
        got = compile_bytes_dfa(p)
        assert np.array_equal(got.table, e.table), p
        assert np.array_equal(got.accepting, e.accepting), p
        assert got.initial == e.initial


def test_a_long_chain_regex_is_fast():
    """``(a{100}){100}`` (10,000 positions) minimises in seconds: the byte refinement no longer
    spends a pass over a whole block per state of the chain (it took 14 s before)."""
    t = time.process_time()
    d = compile_bytes_dfa("(a{100}){100}")
    assert d.num_states == 10_002
    assert d.fullmatch(b"a" * 10_000) and not d.fullmatch(b"a" * 9_999)
    assert time.process_time() - t < 20


# ------------------------------------------------------------------ Lark: anchors, raw errors
LARK_ALPHABET = ["a", "b", "x", "\n", "0"]
LARK_STRINGS = [""] + ["".join(p) for n in range(1, 4)
                       for p in itertools.product(LARK_ALPHABET, repeat=n)]


def lark_accepts(parser, text: str) -> bool:
    try:
        parser.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def assert_lark_language(text: str, strings=LARK_STRINGS):
    """ctrlg's grammar accepts exactly the strings lark's Earley parser (every split:
    ``dynamic_complete``, the fuzz campaign's oracle) accepts."""
    g = dfa.grammar(text, BYTES, eos_token_id=EOS)
    parser = lark.Lark(text, parser="earley", lexer="dynamic_complete")
    wrong = [s for s in strings if g.matches(s) != lark_accepts(parser, s)]
    assert not wrong, (text, wrong[:5])
    return g


@pytest.mark.parametrize("text", [
    'start: /a$/ "\\n"', 'start: /^a/ "b"', 'start: "b" /a$/', 'start: /a$/', 'start: /^a|b$/+',
    'start: "a"+\n%ignore /x$/', 'start: "a"+\n%ignore /^x/', 'start: /a\\Z/', 'start: /\\Aa/ "b"',
    'start: "b"* /a$/', 'start: /a/i /b$/i',
])
def test_lark_anchors_give_lark_language(text):
    assert_lark_language(text)


@pytest.mark.parametrize("text", ['start: /a$/ "b"', 'start: "b" /^a/', 'start: /a\\Z/ "b"',
                                  'start: /a\\Z/ "\\n"'])
def test_lark_anchor_that_rules_out_every_sentence_is_a_clear_error(text):
    """Lark accepts none of these (the anchor ends or starts the input): a clear error, where
    ctrlg used to accept 'ab' and friends."""
    parser = lark.Lark(text, parser="earley", lexer="dynamic_complete")
    assert not any(lark_accepts(parser, s) for s in LARK_STRINGS)
    with pytest.raises(GrammarError, match="anchored terminals"):
        dfa.grammar(text, BYTES, eos_token_id=EOS)


def test_ignored_anchor_only_at_the_end():
    """``%ignore /x$/``: an x is skipped only at the end of the input (ctrlg skipped it
    anywhere)."""
    g = assert_lark_language('start: "a"+\n%ignore /x$/')
    assert g.matches("aax") and not g.matches("axa")


@pytest.mark.parametrize("text, error, match", [
    ("start: /[0-9]+$/", UnsupportedGrammarError, "proper prefix"),
    ("start: /a$b/", UnsupportedGrammarError, "anchor inside"),
    ("start: /(a$)+/", UnsupportedGrammarError, "anchor"),
    ("start: /a/l", GrammarError, "not valid for Python's re"),
    ("%import nosuchmod.X\nstart: X", GrammarError, "nosuchmod"),
    ("start: /a/m", UnsupportedGrammarError, "flag"),
])
def test_lark_raw_exceptions_are_clear_errors(text, error, match):
    with pytest.raises(error, match=match):
        dfa.grammar(text, BYTES, eos_token_id=EOS)


def test_a_chain_of_a_thousand_rules_compiles():
    """``r0: r1 | "a"``, ..., 1,000 deep: the unrolling no longer recurses along the chain
    (RecursionError before)."""
    lines = [f'r{i}: r{i + 1} | "a"' for i in range(1000)] + ['r1000: "b"']
    g = dfa.grammar("start: r0\n" + "\n".join(lines), BYTES, eos_token_id=EOS)
    assert g.matches("a") and g.matches("b") and not g.matches("ab")


_LARK_TERMINALS = ["/a$/", "/^a/", "/a\\Z/", "/\\Aa/", "/^b$/", "/a|b$/", "/^a|b/", "/[ab]$/",
                   '"a"', '"b"', '"\\n"', "/0/", "/a/i", "/^ab/", "/ba$/"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_LARK_TERMINALS), st.sampled_from(["", "*", "+", "?"])),
                min_size=1, max_size=3),
       st.sampled_from(["", '\n%ignore "x"', "\n%ignore /x$/", "\n%ignore /^x/"]),
       st.sampled_from(["", " | /b$/", ' | "a"']))
def test_generated_anchored_grammars_agree_with_lark(items, ignore, alternative):
    text = "start: " + " ".join(t + q for t, q in items) + alternative + ignore
    try:
        assert_lark_language(text, LARK_STRINGS[:200])
    except GrammarError as err:             # refused clearly (or lark's language is empty)
        if "anchored terminals" in str(err):
            parser = lark.Lark(text, parser="earley", lexer="dynamic_complete")
            assert not any(lark_accepts(parser, s) for s in LARK_STRINGS)


# ------------------------------------------------------------------ GBNF
def test_gbnf_surrogate_literal_is_refused():
    """``"\\ud800"`` accepted the bytes ED A0 80 (not UTF-8); no UTF-8 text holds a surrogate."""
    with pytest.raises(GrammarError, match="surrogate U\\+D800"):
        dfa.grammar('root ::= "\\ud800"', BYTES, syntax="gbnf", eos_token_id=EOS)
    with pytest.raises(GrammarError, match="no encodable"):
        dfa.grammar("root ::= [\\ud800-\\udfff]", BYTES, syntax="gbnf", eos_token_id=EOS)
    g = dfa.grammar("root ::= [\\ud7ff-\\ue000]", BYTES, syntax="gbnf", eos_token_id=EOS)
    assert g.matches("\ud7ff") and g.matches("\ue000")
    assert not g.matches(b"\xed\xa0\x80")


def test_gbnf_escape_beyond_unicode_is_a_clear_error():
    with pytest.raises(GrammarError, match="beyond U\\+10FFFF"):
        dfa.grammar('root ::= "\\U00110000"', BYTES, syntax="gbnf", eos_token_id=EOS)
    g = dfa.grammar('root ::= "\\U0001F600"', BYTES, syntax="gbnf", eos_token_id=EOS)
    assert g.matches("\U0001F600")


@pytest.mark.parametrize("count, lo, hi", [("{3}", 3, 3), ("{0,3}", 0, 3), ("{2,}", 2, None),
                                           ("{,2}", 0, 2)])
def test_gbnf_counts_by_enumeration(count, lo, hi):
    g = dfa.grammar(f'root ::= "a"{count} "b"', BYTES, syntax="gbnf", eos_token_id=EOS)
    for k in range(7):
        assert g.matches("a" * k + "b") == (k >= lo and (hi is None or k <= hi)), k


# ------------------------------------------------------------------ size bounds, before the work
@pytest.mark.parametrize("build, match", [
    (lambda: dfa.grammar('start: "a" ~ 0..100000', BYTES, eos_token_id=EOS), "10,000"),
    (lambda: dfa.grammar('root ::= "a"{20000}', BYTES, syntax="gbnf", eos_token_id=EOS),
     "10,000"),
    (lambda: dfa.grammar('start: "%s"' % ("ab" * 10_000), BYTES, eos_token_id=EOS), "10,000"),
    (lambda: dfa.regex("(a{1000}){1000}", BYTES, eos_token_id=EOS), "20,000"),
    (lambda: dfa.regex("a" * 20_001, BYTES, eos_token_id=EOS), "20,000"),
])
def test_size_bounds_are_checked_before_the_work(build, match):
    """Each was minutes of work (or no answer in 60 s); now a ValueError naming the bound,
    at once. Timed in this process's CPU seconds, which other jobs on the machine do not inflate."""
    t = time.process_time()
    with pytest.raises(ConstraintError if "grammar" in str(build.__code__.co_names) else ValueError,
                       match=match):
        build()
    assert time.process_time() - t < 2.0


def test_within_the_bounds_it_finishes():
    t = time.process_time()
    g = dfa.grammar("start: /(a{100}){20}/", BYTES, eos_token_id=EOS)
    assert g.matches("a" * 2000) and not g.matches("a" * 1999)
    d = dfa.regex("((ab){1000}){2}", BYTES, eos_token_id=EOS)
    assert d.accepts(list(b"ab" * 2000)) and not d.accepts(list(b"ab" * 1999))
    assert time.process_time() - t < 30


# ------------------------------------------------------------------ JSON Schema numbers
JSON_DOCS = ["0", "5", "-5", "1.5", "1e308", "-1e308", "1e400", "-1e400", "2", "10", "0.5",
             "179769313486231570" + "0" * 291]


def json_language(schema):
    d = dfa.json_schema(schema, BYTES, eos_token_id=EOS)
    return [doc for doc in JSON_DOCS if d.accepts(list(doc.encode()))]


@pytest.mark.parametrize("text", ['{"type":"integer","minimum":1e400}',
                                  '{"type":"number","minimum":1e400}',
                                  '{"type":"integer","maximum":-1e400}',
                                  '{"type":"number","exclusiveMinimum":1e400}'])
def test_a_bound_beyond_every_finite_number_is_a_clear_error(text):
    """The bound overflows to ±inf; the old code dropped it and accepted 5."""
    schema = json.loads(text)
    assert not any(jsonschema.Draft202012Validator(schema).is_valid(json.loads(d))
                   for d in JSON_DOCS if "e400" not in d)
    with pytest.raises(SchemaError, match="overflows to infinity"):
        dfa.json_schema(schema, BYTES, eos_token_id=EOS)


@pytest.mark.parametrize("text", ['{"type":"integer","maximum":1e400}',
                                  '{"type":"number","minimum":-1e400}',
                                  '{"type":"number","exclusiveMaximum":1e400}',
                                  '{"type":"integer","exclusiveMinimum":-1e400, "maximum": 3}',
                                  '{"type":"integer","minimum":1e308}',
                                  '{"type":"number","maximum":-1e308}'])
def test_infinite_and_extreme_bounds_agree_with_jsonschema(text):
    """Every document generated is valid for jsonschema (on json.loads of its text)."""
    schema = json.loads(text)
    validator = jsonschema.Draft202012Validator(schema)
    accepted = json_language(schema)
    for doc in accepted:
        assert validator.is_valid(json.loads(doc)), (text, doc)
    d = dfa.json_schema(schema, BYTES, eos_token_id=EOS)
    assert not d.is_empty()


@pytest.mark.parametrize("schema, match", [
    ({"type": "number", "maximum": float("nan")}, "NaN"),
    ({"type": "integer", "minimum": float("nan")}, "NaN"),
    ({"type": "number", "multipleOf": float("nan")}, "NaN"),
    ({"type": "number", "multipleOf": float("inf")}, "multipleOf"),
    ({"type": "number", "multipleOf": 1e-400}, "underflows"),
    ({"const": float("nan")}, "strict JSON"),
    ({"enum": [1, float("inf")]}, "strict JSON"),
    ({"const": {"a": [float("-inf")]}}, "strict JSON"),
    ({"$ref": "#"}, "refers to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
     "refers to itself"),
])
def test_numbers_strict_json_cannot_write_and_bare_self_references(schema, match):
    """Raw conversion errors, KeyError '#', or documents 'NaN' / 'Infinity' before."""
    with pytest.raises(SchemaError, match=match):
        dfa.json_schema(schema, BYTES, eos_token_id=EOS)


def test_a_self_reference_with_content_still_compiles():
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}}, "additionalProperties": False}
    g = dfa.json_schema(schema, BYTES, eos_token_id=EOS)
    assert g.matches('{"a": {"a": {}}}') and not g.matches('{"b": 1}')


# 1e308-sized finite bounds compile 309-digit ranges (seconds each): in the parametrized tests
_EXTREMES = ["1e400", "-1e400", "5e-324", "1e-400", "0.5", "-0.0", "2", "0", "-3", "1.5", "3"]


def test_a_quotient_that_overflows_is_checked_exactly():
    """multipleOf 0.5 with a bound of -1e308: the quotient overflows; was a raw OverflowError."""
    schema = {"type": "integer", "minimum": -1e308, "multipleOf": 0.5, "maximum": -1e308 + 1e293}
    d = dfa.json_schema(schema, BYTES, eos_token_id=EOS)
    assert not d.is_empty()


@settings(max_examples=60, deadline=None)
@example("number", {"maximum": "1e400", "exclusiveMaximum": "1e400"})     # found by this test:
@example("number", {"minimum": "-1e400", "exclusiveMinimum": "-1e400"})   # the bound was dropped
@example("integer", {"maximum": "1e400", "exclusiveMaximum": "1e400"})
@given(st.sampled_from(["integer", "number"]),
       st.dictionaries(st.sampled_from(["minimum", "maximum", "exclusiveMinimum",
                                        "exclusiveMaximum", "multipleOf"]),
                       st.sampled_from(_EXTREMES), max_size=3))
def test_generated_extreme_number_schemas_agree_with_jsonschema(kind, keywords):
    """Number schemas with keywords at the extremes of floating point (as JSON text: 1e400
    overflows): every generated document ctrlg accepts among edge documents is valid for
    jsonschema, and a refusal is a SchemaError."""
    text = "{" + ", ".join([f'"type": "{kind}"'] + [f'"{k}": {v}' for k, v in keywords.items()]) + "}"
    schema = json.loads(text)
    try:
        accepted = json_language(schema)
    except SchemaError:
        return
    validator = jsonschema.Draft202012Validator(schema)
    for doc in accepted:
        assert validator.is_valid(json.loads(doc)), (text, doc)
