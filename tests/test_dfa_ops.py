"""Boolean operations and minimisation against brute force on random DFAs."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa import token_classes
from ctrlg.dfa.ops import _concat_subsets, accepting_states_lead_only_to_dead
from ctrlg.errors import UnsatisfiableConstraintError, VocabularyMismatchError
from dfa_strategies import (all_sequences, language, lettered_dfas, minimal_state_count,
                            token_dfas)

MAX_LEN = 6


def pair_of_dfas(max_states=4):
    return st.integers(1, 3).flatmap(
        lambda V: st.tuples(token_dfas(vocab_size=V, max_states=max_states),
                            token_dfas(vocab_size=V, max_states=max_states)))


@settings(max_examples=80, deadline=None)
@given(pair_of_dfas())
def test_intersect_and_union(pair):
    a, b = pair
    la, lb = language(a, MAX_LEN), language(b, MAX_LEN)
    inter = dfa.intersect(a, b, allow_empty=True)
    assert (language(inter, MAX_LEN) == (la & lb)).all()
    assert inter.num_states <= a.num_states * b.num_states + 1     # reachable pairs (+ dead)
    assert inter.dead_states().sum() <= 1 and inter.reachable_states().all()
    pairs = dfa.intersect(a, b, allow_empty=True, minimal=False)
    assert (language(pairs, MAX_LEN) == (la & lb)).all() and pairs.dead_states().sum() <= 1
    assert (language(dfa.union(a, b, allow_empty=True), MAX_LEN) == (la | lb)).all()


@settings(max_examples=30, deadline=None)
@given(st.lists(token_dfas(vocab_size=2, max_states=3), min_size=3, max_size=4))
def test_k_ary_operations(ds):
    langs = np.stack([language(d, MAX_LEN) for d in ds])
    assert (language(dfa.intersect(*ds, allow_empty=True), MAX_LEN) == langs.all(0)).all()
    assert (language(dfa.union(*ds, allow_empty=True), MAX_LEN) == langs.any(0)).all()


@settings(max_examples=60, deadline=None)
@given(token_dfas(max_states=5))
def test_complement(d):
    c = dfa.complement(d, allow_empty=True)
    assert (language(c, MAX_LEN) == ~language(d, MAX_LEN)).all()


def accepted_set(d, max_len=MAX_LEN):
    """The set of accepted sequences of length ≤ max_len (from the dense table)."""
    seqs = all_sequences(d.vocab_size, max_len)
    return {s for s, ok in zip(seqs, language(d, max_len)) if ok}


def concat_reference(la, lb, seqs):
    """Brute force: some split s = x·y with x ∈ la and y ∈ lb (la, lb: sets or predicates)."""
    fa = la.__contains__ if isinstance(la, set) else la
    fb = lb.__contains__ if isinstance(lb, set) else lb
    return np.array([any(fa(s[:i]) and fb(s[i:]) for i in range(len(s) + 1)) for s in seqs])


@settings(max_examples=60, deadline=None)
@given(pair_of_dfas())
def test_concat_general(pair):
    a, b = pair
    seqs = all_sequences(a.vocab_size, MAX_LEN)
    want = concat_reference(accepted_set(a), accepted_set(b), seqs)
    got = dfa.concat(a, b, allow_empty=True)
    assert (language(got, MAX_LEN) == want).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=3), token_dfas(vocab_size=3, max_states=4))
def test_concat_fast_path_of_proposition_4_1(p, b):
    a = dfa.exact(p, vocab_size=3)        # accepting state leads only to the dead state
    assert accepting_states_lead_only_to_dead(a)
    seqs = all_sequences(3, MAX_LEN)
    want = concat_reference(accepted_set(a), accepted_set(b), seqs)
    got = dfa.concat(a, b, allow_empty=True, minimal=False)
    assert (language(got, MAX_LEN) == want).all()
    assert got.num_states <= a.num_states + b.num_states + 1
    # the general subset construction agrees
    classes = token_classes(a, b)
    general = _concat_subsets(a, b, a.class_table(classes), b.class_table(classes), classes, True)
    assert (language(general, MAX_LEN) == want).all()


def test_concat_three_and_fast_path_condition():
    V = 4
    a = dfa.intersect(dfa.phrase([1], vocab_size=V), dfa.length(1, 2, vocab_size=V))
    assert not accepting_states_lead_only_to_dead(a)   # "1" may be followed by more tokens
    assert not accepting_states_lead_only_to_dead(dfa.phrase([1], vocab_size=V))
    b, c = dfa.exact([2], vocab_size=V), dfa.length(0, 1, vocab_size=V)
    got = dfa.concat(a, b, c)
    seqs = all_sequences(V, 5)
    ab = lambda s: any(a.accepts(s[:i]) and b.accepts(s[i:]) for i in range(len(s) + 1))
    want = concat_reference(ab, c.accepts, seqs)
    assert (language(got, 5) == want).all()


@settings(max_examples=100, deadline=None)
@given(token_dfas(max_states=6))
def test_minimize_is_equivalent_and_minimal(d):
    m = dfa.minimize(d)
    assert (language(m, MAX_LEN) == language(d, MAX_LEN)).all()
    assert m.num_states == minimal_state_count(d)
    assert dfa.minimize(m).num_states == m.num_states


def test_minimize_merges_redundant_states():
    # two copies of "contains token 1" glued together: minimal is 2 states
    V = 3
    table = np.array([[0, 1, 2], [1, 1, 1], [2, 3, 0], [3, 3, 3]])
    d = dfa.TokenDFA.from_dense(table, [False, True, False, True])
    assert dfa.minimize(d).num_states == 2
    big = dfa.phrase([1, 1, 1], vocab_size=40_000)
    assert dfa.minimize(dfa.intersect(big, dfa.universal(40_000))).num_states == 4


def test_ops_over_a_large_vocabulary_stay_sparse():
    V = 50_000
    a = dfa.phrase([12, 7], vocab_size=V)
    b = dfa.any_phrase([[12, 3], [2, 3]], vocab_size=V)
    both = dfa.intersect(a, b, dfa.length(0, 10, vocab_size=V))
    assert both.num_exceptions < 500
    assert both.accepts([12, 7, 2, 3]) and not both.accepts([12, 7, 2]) \
        and not both.accepts([12, 7, 2, 3] + [0] * 7)


def test_vocab_size_mismatch_is_reported():
    with pytest.raises(VocabularyMismatchError, match=r"\[3, 4\]") as info:
        dfa.intersect(dfa.phrase([1], vocab_size=3), dfa.phrase([1], vocab_size=4))
    assert isinstance(info.value, ValueError)
    with pytest.raises(VocabularyMismatchError):
        dfa.concat(dfa.phrase([1], vocab_size=3), dfa.phrase([1], vocab_size=4))
    with pytest.raises(VocabularyMismatchError):
        dfa.union(dfa.phrase([1], vocab_size=3), dfa.phrase([1], vocab_size=4))


def test_empty_language_is_reported():
    V = 3
    short, long = dfa.length(0, 2, vocab_size=V), dfa.length(4, 5, vocab_size=V)
    with pytest.raises(UnsatisfiableConstraintError, match="intersection is unsatisfiable"):
        dfa.intersect(short, long)
    with pytest.raises(UnsatisfiableConstraintError, match="complement"):
        dfa.complement(dfa.universal(V))
    with pytest.raises(UnsatisfiableConstraintError, match="concatenation"):
        dfa.concat(dfa.intersect(short, long, allow_empty=True), short)
    empty = dfa.intersect(short, long, allow_empty=True)
    assert empty.is_empty() and empty.num_states == 1
    with pytest.raises(ValueError):
        dfa.intersect(dfa.phrase([1], vocab_size=V), dfa.banned_phrases([[1]], vocab_size=V))


def test_intersection_of_keyword_phrases_counts_only_reachable_pairs():
    V = 30
    keywords = [dfa.phrase([2 * i, 2 * i + 1], vocab_size=V) for i in range(6)]
    both = dfa.intersect(*keywords)
    # each keyword: nothing / first token / found; the full product has 3^6 states, reachable
    # subsets of found keywords × at most one partial match: 2^6 · (1 + 6 - ...) ≪ 729
    assert both.num_states < 3 ** 6
    assert both.num_states == dfa.minimize(both).num_states
    seq = list(itertools.chain.from_iterable([2 * i, 2 * i + 1] for i in range(6)))
    assert both.accepts(seq) and not both.accepts(seq[:-1])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4).flatmap(lambda V: st.tuples(lettered_dfas(vocab_size=V),
                                                      token_dfas(vocab_size=V, max_states=3))))
def test_ops_on_operands_with_letters(pair):
    a, b = pair                    # a is stored over letters, b per token
    la, lb = language(a, 5), language(b, 5)
    assert (language(dfa.intersect(a, b, allow_empty=True), 5) == (la & lb)).all()
    assert (language(dfa.union(b, a, allow_empty=True), 5) == (la | lb)).all()
    assert (language(dfa.complement(a, allow_empty=True), 5) == ~la).all()
    m = dfa.minimize(a)
    assert (language(m, 5) == la).all() and m.num_states == minimal_state_count(a)
    seqs = all_sequences(a.vocab_size, 5)
    want = concat_reference(accepted_set(a, 5), accepted_set(b, 5), seqs)
    assert (language(dfa.concat(a, b, allow_empty=True), 5) == want).all()
