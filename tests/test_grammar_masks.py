"""Grammar masks against brute force: on small vocabularies (byte strings that cross terminal
boundaries: ``1)``, ``+(``, ``",``, ...) every token sequence up to the budget is enumerated and
checked with the ``lark`` library itself (Earley, ``lexer="dynamic_complete"``: every split into
terminals, the semantics of ctrlg's grammars); the exact mask of every reachable prefix under
every remaining budget must equal the brute-force one, and so must the satisfiability verdict.
Each self-embedding case runs twice: over ``dfa.grammar``'s constraint and over
``dfa.lazy_grammar``'s (superset R_1, the token index's runs computed on first use)."""

import functools
import itertools

import lark
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa.cfg.constraint import GrammarConstraint
from ctrlg.dfa.vocab_trie import VocabTrie
from ctrlg.errors import UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility
from ctrlg.guide.masks import GrammarMask, token_mask
from ctrlg.dfa.cfg.examples import ARITHMETIC, LISTS

JSON_REGULAR_STRINGS = r"""
start: value
?value: object | array | STRING | NUMBER | "true"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: STRING ":" value
STRING: /"([^"\\]|\\.)*"/
NUMBER: /-?[0-9]+/
%ignore " "
"""

SQL_SMALL = r"""
start: "SELECT " NAME (", " NAME)* " FROM " NAME
NAME: /[ab]+/
"""

# (grammar, vocabulary of byte strings — the last one is EOS —, budget)
CASES = {
    "arithmetic": (ARITHMETIC, [b"(", b")", b"1", b"2", b"+", b"*", b" ", b"((", b"1)", b"+(",
                                b"12", b") "], 4),
    "lists": (LISTS, [b"[", b"]", b"a", b"b", b",", b" ", b"[]", b"a,", b"],", b"[a"], 4),
    "json": (JSON_REGULAR_STRINGS, [b"{", b"}", b"[", b"]", b'"', b"a", b":", b",", b"1",
                                    b'":', b'"a"', b"[1", b"1]", b" ", b"tr", b"ue"], 4),
    "sql": (SQL_SMALL, [b"SELECT ", b"SELECT a", b"a", b"b", b" FROM ", b" FROM", b" ", b"FROM ",
                        b", ", b"ab", b",", b"a FROM b"], 4),
}


#: (case, how the constraint is built): the regular SQL case has no lazy grammar constraint
BUILDS = [(case, build) for case in sorted(CASES) for build in ("eager", "lazy")
          if (case, build) != ("sql", "lazy")]


def _constraint(case, build="eager", **kw):
    text, tokens, _ = CASES[case]
    trie = VocabTrie.from_token_bytes(tokens + [b""], eos_token_id=len(tokens))
    if build == "eager":
        return dfa.grammar(text, trie, **kw), len(tokens)
    g = dfa.lazy_grammar(text, trie, **kw)
    assert isinstance(g, GrammarConstraint) and (g.depth, g.exact) == (1, False)
    return g, len(tokens)


@functools.lru_cache(maxsize=None)
def _oracle(case):
    text, tokens, n = CASES[case]
    parser = lark.Lark(text, parser="earley", lexer="dynamic_complete")

    @functools.lru_cache(maxsize=None)
    def parses(s: bytes) -> bool:
        try:
            parser.parse(s.decode())
            return True
        except (lark.exceptions.LarkError, UnicodeDecodeError):
            return False

    accepted = set()
    for k in range(1, n + 1):
        for seq in itertools.product(range(len(tokens)), repeat=k):
            if parses(b"".join(tokens[t] for t in seq)):
                accepted.add(seq)
    return accepted, parses


def _brute_mask(case, prefix, remaining, eos):
    """Tokens v with some w, |w| ≤ remaining − 1, such that prefix·v·w is accepted; EOS iff the
    prefix itself is (the processor's semantics with EOS terminal)."""
    accepted, parses = _oracle(case)
    _, tokens, n = CASES[case]
    mask = np.zeros(eos + 1, dtype=bool)
    mask[eos] = parses(b"".join(tokens[t] for t in prefix))
    for seq in accepted:
        if len(seq) > len(prefix) and seq[:len(prefix)] == prefix \
                and len(seq) - len(prefix) <= remaining:
            mask[seq[len(prefix)]] = True
    return mask


@pytest.mark.parametrize("case,build", BUILDS)
def test_masks_equal_brute_force(case, build):
    g, eos = _constraint(case, build)
    n = CASES[case][2]
    table = Feasibility(g.dfa, n, eos_token_id=eos)
    masks = token_mask(g, table)
    assert isinstance(masks, GrammarMask) and masks.refines == (not g.exact)
    masks.check_satisfiable()
    frontier = [((), masks.start(), g.dfa.initial)]
    checked = 0
    for depth in range(n):
        nxt = []
        for prefix, cursor, q in frontier:
            remaining = n - depth
            got = masks.allowed(cursor, q, remaining)
            want = _brute_mask(case, prefix, remaining, eos)
            assert got.tolist() == want.tolist(), (prefix, remaining, np.flatnonzero(got ^ want))
            checked += 1
            for v in np.flatnonzero(got).tolist():
                if v != eos:
                    nxt.append((prefix + (v,), masks.advance(cursor, v), g.dfa.step(q, v)))
        frontier = nxt
    assert checked > 10
    # prefixes that reach one parse configuration share their costs (memoised), and those
    # masks were checked above like the others
    assert masks.masks.memo_hits > 0


@pytest.mark.parametrize("case,build", BUILDS)
def test_accepts_equals_lark(case, build):
    g, eos = _constraint(case, build)
    _, tokens, n = CASES[case]
    accepted, _ = _oracle(case)
    for k in range(1, 4):
        for seq in itertools.product(range(len(tokens)), repeat=k):
            assert g.accepts(list(seq)) == (seq in accepted), seq
            assert g.accepts(list(seq) + [eos]) == (seq in accepted), seq


@pytest.mark.parametrize("case,build", BUILDS)
def test_satisfiability_equals_brute_force(case, build):
    g, eos = _constraint(case, build)
    accepted, _ = _oracle(case)
    shortest = min(len(s) for s in accepted)
    for n in range(1, CASES[case][2] + 1):
        masks = token_mask(g, Feasibility(g.dfa, n, eos_token_id=eos))
        if n >= shortest:
            masks.check_satisfiable()
        else:
            with pytest.raises(UnsatisfiableConstraintError, match="no sentence of at most"):
                masks.check_satisfiable()


STRICT_ESCAPES = r"""
start: value
?value: object | array | STRING | NUMBER
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: STRING ":" value
STRING: /"([^"\\]|\\[n"])*"/
NUMBER: /-?[0-9]+/
"""
ESCAPES = (STRICT_ESCAPES, [b"{", b"}", b"[", b"]", b'"', b"a", b":", b",", b"1", b"\\", b'\\"',
                            b'"a', b'a"', b"n", b"na", b"[1", b"1]", b'":', b'"}', b"]}", b'n"'])


@pytest.mark.parametrize("build", ["eager", "lazy"])
def test_memoised_costs_give_the_masks_computed_afresh(build, monkeypatch):
    """Random walks over a vocabulary with string escapes (only ``\\n`` and ``\\"``), each
    run to its budget of 10 tokens (EOS only when nothing else is allowed) from one start set,
    all through one mask provider whose costs are memoised by parse configuration: every mask
    equals the one a provider without the memo computes for the same cursor. Configurations
    that share a memo entry (the inside of a string, the next member) have the same masks; ones
    that must not (after a backslash, the budget's last tokens with fewer candidates) do not
    share one."""
    from ctrlg.guide import grammar_masks

    text, tokens = ESCAPES
    trie = VocabTrie.from_token_bytes(tokens + [b""], eos_token_id=len(tokens))
    g = dfa.grammar(text, trie) if build == "eager" else dfa.lazy_grammar(text, trie)
    eos, n = len(tokens), 10
    monkeypatch.setattr(grammar_masks, "MAX_MEMOISED_COSTS", 10_000)
    memo = token_mask(g, Feasibility(g.dfa, n, eos_token_id=eos))
    rng = np.random.default_rng(5)
    checked = 0
    start = memo.start()           # shared by every walk, as by the rows of one prompt
    for _ in range(30):
        cursor, q = start, g.dfa.initial
        for k in range(n):
            got = memo.allowed(cursor, q, n - k)
            monkeypatch.setattr(grammar_masks, "MAX_MEMOISED_COSTS", 0)
            fresh = token_mask(g, Feasibility(g.dfa, n, eos_token_id=eos))
            want = fresh.allowed(cursor, q, n - k)
            monkeypatch.setattr(grammar_masks, "MAX_MEMOISED_COSTS", 10_000)   # nothing evicted
            assert got.tolist() == want.tolist(), (k, np.flatnonzero(got ^ want))
            checked += 1
            choices = np.flatnonzero(got[:eos])
            if not len(choices):
                break
            v = int(rng.choice(choices))
            cursor, q = memo.advance(cursor, v), g.dfa.step(q, v)
    assert checked > 200 and memo.masks.memo_hits > 20


@pytest.mark.parametrize("build", ["eager", "lazy"])
def test_costs_memo_tells_apart_candidates_and_thread_states(build):
    """The costs memo, called directly: one Earley set with two candidate masks, then two sets
    that differ only in a thread's terminal state (inside a string, and right after a backslash
    in it), each answer against :meth:`GrammarFeasibility.costs` computed afresh. The random walks
    above meet neither collision: there, one signature always came with one candidate mask."""
    text, tokens = ESCAPES
    trie = VocabTrie.from_token_bytes(tokens + [b""], eos_token_id=len(tokens))
    g = dfa.grammar(text, trie) if build == "eager" else dfa.lazy_grammar(text, trie)
    masks = token_mask(g, Feasibility(g.dfa, 6, eos_token_id=len(tokens))).masks
    ids_of = {t: i for i, t in enumerate(tokens)}
    inside = masks.advance(masks.advance(masks.start(), ids_of[b"{"]), ids_of[b'"a'])
    escaped = masks.advance(inside, ids_of[b"\\"])
    assert [(t, o) for t, _, o in inside.threads] == [(t, o) for t, _, o in escaped.threads]
    assert [q for _, q, _ in inside.threads] != [q for _, q, _ in escaped.threads]

    def fresh(s, candidates):
        ids = np.flatnonzero(candidates)
        return (ids, *masks.costs(s, ids, detail=True))

    every = np.ones(len(tokens), dtype=bool)
    some = every.copy()
    some[[ids_of[b"a"], ids_of[b"n"], ids_of[b'a"']]] = False
    calls = [(inside, every), (inside, some), (escaped, every), (escaped, some)]
    answers = []
    for s, candidates in calls:
        got, want = masks.candidate_costs(s, candidates), fresh(s, candidates)
        assert len(got) == len(want) == 5
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        answers.append(want)
    # the two sets' costs differ (after a backslash only `n` and `"` continue the string), so a
    # memo that confused them would fail above
    assert answers[0][1].tolist() != answers[2][1].tolist()
    assert masks.memo_hits == 0
    for s, candidates in calls:                     # asked again: every answer from the memo
        masks.candidate_costs(s, candidates)
    assert masks.memo_hits == len(calls)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.data())
def test_the_compiled_folds_equal_numpy_s_unbuffered_updates(size, data):
    """``fold`` equals ``np.logical_or.at`` + ``np.minimum.at``; ``fold_shorter_first`` equals
    those updates applied one suffix length at a time, shortest first, for pairs that point
    to strictly shorter suffixes (as completion pairs do), repeated targets included."""
    from ctrlg.guide.grammar_masks import fold, fold_shorter_first

    length = np.array(data.draw(st.lists(st.integers(0, 5), min_size=size, max_size=size)))
    viable = np.array(data.draw(st.lists(st.booleans(), min_size=size, max_size=size)))
    cost = np.array(data.draw(st.lists(st.integers(0, 9), min_size=size, max_size=size)),
                    dtype=np.int64)
    n = data.draw(st.integers(0, 15))
    where = np.array(data.draw(st.lists(st.integers(0, size - 1), min_size=n, max_size=n)),
                     dtype=np.int64)
    sub_viable = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    sub_cost = np.array(data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)),
                        dtype=np.int64)
    v1, c1, v2, c2 = viable.copy(), cost.copy(), viable.copy(), cost.copy()
    fold(where, sub_viable, sub_cost, v1, c1)
    np.logical_or.at(v2, where, sub_viable)
    np.minimum.at(c2, where, sub_cost)
    assert v1.tolist() == v2.tolist() and c1.tolist() == c2.tolist()
    # pairs from a suffix to a strictly shorter one
    pairs = [(w, d) for w in range(size) for d in range(size) if length[d] < length[w]]
    chosen = data.draw(st.lists(st.sampled_from(pairs), max_size=12)) if pairs else []
    src = np.array([w for w, _ in chosen], dtype=np.int64)
    dst = np.array([d for _, d in chosen], dtype=np.int64)
    v1, c1, v2, c2 = viable.copy(), cost.copy(), viable.copy(), cost.copy()
    fold_shorter_first(src, dst, length[src].astype(np.int64), v1, c1)
    for L in sorted(set(length[src].tolist())):
        k = length[src] == L
        np.logical_or.at(v2, src[k], v2[dst[k]])
        np.minimum.at(c2, src[k], c2[dst[k]])
    assert v1.tolist() == v2.tolist() and c1.tolist() == c2.tolist()
