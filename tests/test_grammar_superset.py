"""The regular superset of a grammar (``ctrlg.dfa.cfg.approximation``) under hostile grammars:
ambiguous and empty rules get small supersets within a budget fixed before the construction
starts, deep nesting uses no Python stack, and a grammar past the budget gets a clear error.
Every superset is checked against lark on enumerated strings (it must contain every sentence)."""

import itertools
import sys

import lark
import pytest

from ctrlg import dfa
from ctrlg.dfa.bytes_dfa import Budget
from ctrlg.dfa.cfg import approximation
from ctrlg.dfa.cfg.approximation import regular_superset
from ctrlg.dfa.cfg.grammar_ir import reduce, with_ignored
from ctrlg.dfa.cfg.lark_syntax import from_lark
from ctrlg.errors import ConstraintError

TOKENS = [b"a", b"b", b"(", b")", b",", b"aa", b"(a", b""]
EOS = len(TOKENS) - 1


def sentences(text, alphabet, longest):
    """Every string over ``alphabet`` of at most ``longest`` characters that lark parses (the
    every-split lexer: ctrlg's semantics), and every other one."""
    parser = lark.Lark(text, parser="earley", lexer="dynamic_complete")
    yes, no = [], []
    for k in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=k):
            s = "".join(chars)
            try:
                parser.parse(s)
                yes.append(s)
            except lark.exceptions.LarkError:
                no.append(s)
    return yes, no


# ambiguous repetition, empty alternatives, both, mutual recursion, nested repetition
HOSTILE = [
    'start: s\ns: s s | "a" | ',
    'start: s\ns: s s | "a"',
    'start: s\ns: s s s | "a" | "b"',
    'start: s\ns: s "," s | "a" | ',
    'start: s\ns: s s | "(" s ")" | ',
    'start: s\ns: (s s)* | "a"',
    'start: x\nx: y y | "a" | \ny: x x | "b"',
    'start: s\ns: s s | s | "a" | ',
    'start: s\ns: s? s? "a"?',
]


@pytest.mark.parametrize("text", HOSTILE)
def test_ambiguous_and_empty_rules_get_small_supersets_within_the_budget(text, monkeypatch):
    """Before, ``s: s s | "a" | `` had not answered after 110 s (6 GB, determinising the
    unrolled copies), and without the empty alternative depth 3 failed at 200,000 states. Now
    ``auto`` answers within a small budget with a small automaton that contains every sentence."""
    monkeypatch.setattr(approximation, "AUTO_BUDGET", Budget(states=4_000, work=200_000))
    g = dfa.grammar(text, TOKENS, eos_token_id=EOS)
    assert g.dfa.num_states <= 64
    yes, _ = sentences(text, "ab(),", 4)
    bnf = with_ignored(reduce(from_lark(text)))
    superset, _, _ = regular_superset(bnf, g.depth)
    for s in yes:
        assert superset.fullmatch(s.encode()), s
        assert g.matches(s), s


def test_a_given_depth_of_an_ambiguous_rule_is_cheap_and_exact_where_it_can_be():
    """``s: s s | "a"`` is ``a+``: at depths 3 and 8 the superset is that (nothing outside it
    over a, b), where depth 3 used to exhaust 200,000 states."""
    text = 'start: s\ns: s s | "a"'
    bnf = with_ignored(reduce(from_lark(text)))
    for depth in (3, 8):
        superset, _, _ = regular_superset(bnf, depth)
        assert superset.num_states <= 4
        yes, no = sentences(text, "ab", 6)
        assert all(superset.fullmatch(s.encode()) for s in yes)
        assert not any(superset.fullmatch(s.encode()) for s in no if s)


def test_deep_nesting_uses_no_python_stack():
    """``depth=1000`` raised RecursionError (each level one Python call chain deeper). The
    unrolling now runs on explicit work stacks: with Python's stack limited to ~150 frames
    beyond the test's own, depth 400 still builds, exact within its depth."""
    text = 'start: "(" start ")" | "b"'
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(_frames()) + 150)
    try:
        bnf = with_ignored(reduce(from_lark(text)))
        superset, depth, exact = regular_superset(bnf, 400)
    finally:
        sys.setrecursionlimit(limit)
    assert (depth, exact) == (400, False)
    assert superset.fullmatch(b"(" * 399 + b"b" + b")" * 399)
    assert not superset.fullmatch(b"(" * 300 + b"b" + b")" * 299)
    assert not superset.fullmatch(b"(b))")


def _frames():
    frame, out = sys._getframe(), []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def test_depth_1000_of_a_nesting_grammar_builds():
    g = dfa.grammar('start: "(" start ")" | "b"', TOKENS, eos_token_id=EOS, depth=1000)
    assert g.depth == 1000 and g.matches("(((b)))") and not g.matches("((b)")
    assert g.dfa.accepts([2, 2, 1, 3, 3, EOS]) and not g.dfa.accepts([2, 1, 3, 3])


def test_past_the_budget_is_a_clear_error_within_the_budget(monkeypatch):
    """Two kinds of brackets double the automaton per level: depth 20 needs about a million
    states. With the budget fixed before the construction starts, it stops once the budget is
    spent (never past it) with an error naming the bound and the fix."""
    spent = []
    real = approximation.Budget

    class Spy(real):
        def charge(self, subset_size, states=1):
            spent.append((subset_size, states))
            super().charge(subset_size, states)

    monkeypatch.setattr(approximation, "SUPERSET_BUDGET", Budget(states=2_000, work=60_000))
    monkeypatch.setattr(approximation, "Budget", Spy)
    bnf = with_ignored(reduce(from_lark('start: x\nx: "a" | "(" x ")" | "[" x "]"')))
    with pytest.raises(ConstraintError, match=r"depth 20 .*2,000 states.*smaller depth"):
        regular_superset(bnf, 20)
    assert sum(s for _, s in spent) <= 2_001 and sum(w for w, _ in spent) <= 60_000 + 20_000


def test_auto_keeps_the_last_level_within_its_budget(monkeypatch):
    """``depth="auto"`` on the doubling grammar with a small budget keeps the deepest level it
    could afford; the superset still contains every sentence."""
    text = 'start: x\nx: "a" | "(" x ")" | "[" x "]"'
    monkeypatch.setattr(approximation, "AUTO_BUDGET", Budget(states=600, work=40_000))
    bnf = with_ignored(reduce(from_lark(text)))
    superset, depth, exact = regular_superset(bnf, "auto")
    assert 1 <= depth < approximation.MAX_AUTO_DEPTH and not exact
    yes, _ = sentences(text, "a()[]", 5)
    assert all(superset.fullmatch(s.encode()) for s in yes)
