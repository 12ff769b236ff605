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
from hypothesis import given, settings
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
        table, block = chain(n, n // 4 + 2)
        t = time.perf_counter()
        out = hopcroft_refine(table, block, sink=0)
        assert len(np.unique(out)) == n + 2       # distinct suffixes: every state its own block
        return time.perf_counter() - t

    timed(200)
    small, large = min(timed(2000) for _ in range(2)), min(timed(8000) for _ in range(2))
    assert large < 8 * small, (small, large)


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
    t = time.perf_counter()
    d = compile_bytes_dfa("(a{100}){100}")
    assert d.num_states == 10_002
    assert d.fullmatch(b"a" * 10_000) and not d.fullmatch(b"a" * 9_999)
    assert time.perf_counter() - t < 20
