"""TokenDFA core type: validation, queries, trimming, token classes, array round trips."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg.dfa import DFABuilder, TokenDFA, token_classes
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from dfa_strategies import all_sequences, language, token_dfas


def _arrays(**overrides):
    base = dict(vocab_size=3, initial=0, accepting=np.array([False, True]),
                default=np.array([0, 1]), exc_ptr=np.array([0, 1, 1]),
                exc_tokens=np.array([2]), exc_next=np.array([1]))
    base.update(overrides)
    return base


def test_valid_construction_and_step():
    d = TokenDFA(**_arrays())
    assert d.num_states == 2 and d.num_exceptions == 1 and d.vocab_size == 3
    assert d.step(0, 2) == 1 and d.step(0, 1) == 0 and d.step(1, 0) == 1
    assert d.accepts([0, 1, 2]) and not d.accepts([0, 1])
    assert d.is_accepting(1) and not d.is_accepting(0)


@pytest.mark.parametrize("overrides, message", [
    (dict(vocab_size=0), "vocab_size"),
    (dict(initial=2), "initial state"),
    (dict(default=np.array([0, 5])), "default"),
    (dict(exc_tokens=np.array([3])), "exc_tokens"),
    (dict(exc_next=np.array([-1])), "exc_next"),
    (dict(exc_ptr=np.array([0, 2, 1])), "exc_ptr"),
    (dict(exc_next=np.array([0])), "default successor"),
    (dict(exc_ptr=np.array([0, 2, 2]), exc_tokens=np.array([2, 1]), exc_next=np.array([1, 1])),
     "sorted"),
    (dict(exc_ptr=np.array([0, 2, 2]), exc_tokens=np.array([1, 1]), exc_next=np.array([1, 1])),
     "sorted"),
    (dict(accepting=np.array([True])), "shapes"),
])
def test_invalid_construction_names_the_problem(overrides, message):
    with pytest.raises(ConstraintError, match=message):
        TokenDFA(**_arrays(**overrides))


def test_step_rejects_bad_token_and_state():
    d = TokenDFA(**_arrays())
    with pytest.raises(ConstraintError, match="token id 3"):
        d.step(0, 3)
    with pytest.raises(ConstraintError, match="token id -1"):
        d.accepts([-1])
    with pytest.raises(ConstraintError, match="state 7"):
        d.step(7, 0)


def test_builder_rejects_out_of_range_tokens():
    b = DFABuilder(4)
    b.add_state()
    with pytest.raises(ConstraintError, match="token id 4"):
        b.set_edge(0, 4, 0)
    with pytest.raises(ConstraintError, match="vocab_size"):
        DFABuilder(0)


def test_builder_drops_exceptions_equal_to_default():
    b = DFABuilder(5)
    s = b.add_state()
    t = b.add_state(accepting=True)
    b.set_transitions(s, t, {0: t, 1: s, 4: s})
    d = b.build()
    assert d.exceptions(0)[0].tolist() == [1, 4]
    assert d.successors(0).tolist() == [1, 0, 1, 1, 0]


@settings(max_examples=60, deadline=None)
@given(token_dfas(max_states=6))
def test_step_agrees_with_dense_table(d):
    table = d.dense()
    for s in range(d.num_states):
        for v in range(d.vocab_size):
            assert d.step(s, v) == table[s, v]
    for seq in all_sequences(d.vocab_size, 3):
        expected = d.initial
        for v in seq:
            expected = table[expected, v]
        assert d.accepts(seq) == bool(d.accepting[expected])


@settings(max_examples=60, deadline=None)
@given(token_dfas(max_states=6))
def test_live_reachable_and_dead_states_match_brute_force(d):
    table = d.dense()
    S = d.num_states
    reach = np.zeros((S, S), dtype=bool)   # reach[p, q]: q reachable from p in ≥ 0 steps
    reach[np.arange(S), np.arange(S)] = True
    for _ in range(S):
        reach = reach | (reach.astype(int) @ np.eye(S, dtype=int)[table].any(axis=1).astype(int) > 0)
    live = reach[:, d.accepting].any(axis=1)
    assert (d.live_states() == live).all()
    assert (d.dead_states() == ~live).all()
    assert (d.reachable_states() == reach[d.initial]).all()
    assert d.is_empty() == (not reach[d.initial][d.accepting].any())


@settings(max_examples=80, deadline=None)
@given(token_dfas(max_states=6))
def test_trim_keeps_language_and_leaves_one_dead_state(d):
    t = d.trim()
    assert (language(t, 5) == language(d, 5)).all()
    assert t.reachable_states().all()
    dead = np.nonzero(t.dead_states())[0]
    assert len(dead) <= 1
    if len(dead) == 1 and t.num_states > 1:
        s = int(dead[0])
        assert (t.successors(s) == s).all() and not t.is_accepting(s)
    assert t.num_states <= d.num_states + 1


def test_require_nonempty():
    b = DFABuilder(2)
    b.add_state()
    empty = b.build()
    assert empty.is_empty()
    with pytest.raises(UnsatisfiableConstraintError, match="accepts no token sequence"):
        empty.require_nonempty("test constraint")
    assert empty.trim().num_states == 1


@settings(max_examples=40, deadline=None)
@given(token_dfas(max_states=5))
def test_array_round_trip(tmp_path_factory, d):
    again = TokenDFA.from_arrays(d.to_arrays())
    for key, value in d.to_arrays().items():
        assert np.array_equal(again.to_arrays()[key], value)
    path = tmp_path_factory.mktemp("dfa") / "d.npz"
    np.savez(path, **d.to_arrays())
    with np.load(path) as loaded:
        assert np.array_equal(TokenDFA.from_arrays(loaded).dense(), d.dense())


def test_array_round_trip_safetensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    b = DFABuilder(7)
    for _ in range(3):
        b.add_state()
    b.set_transitions(0, 1, {3: 2, 5: 0})
    b.set_accepting(2)
    d = b.build()
    save_file(d.to_arrays(), str(tmp_path / "d.safetensors"))
    again = TokenDFA.from_arrays(load_file(str(tmp_path / "d.safetensors")))
    assert np.array_equal(again.dense(), d.dense()) and again.initial == d.initial


def test_from_arrays_reports_missing_field():
    arrays = TokenDFA(**_arrays()).to_arrays()
    del arrays["exc_next"]
    with pytest.raises(ConstraintError, match="exc_next"):
        TokenDFA.from_arrays(arrays)


@settings(max_examples=60, deadline=None)
@given(st.lists(token_dfas(vocab_size=4, max_states=4), min_size=1, max_size=3))
def test_token_classes_are_the_distinct_joint_columns(dfas):
    classes = token_classes(*dfas)
    columns = np.concatenate([d.dense() for d in dfas], axis=0).T      # [V, ΣS]
    for u, v in itertools.combinations(range(4), 2):
        same = classes.class_of_token[u] == classes.class_of_token[v]
        assert same == bool((columns[u] == columns[v]).all())
    assert classes.sizes.sum() == 4
    for c in range(classes.num_classes):
        assert (classes.class_of_token[classes.tokens(c)] == c).all()
    for d in dfas:
        table = d.class_table(classes)
        assert (table[:, classes.class_of_token] == d.dense()).all()
        again = TokenDFA.from_class_table(table, d.accepting, classes, d.initial)
        assert (again.dense() == d.dense()).all()


def test_from_class_table_chooses_the_largest_class_as_default():
    b = DFABuilder(10)
    b.add_state()
    b.add_state(accepting=True)
    b.set_transitions(0, 0, {v: 1 for v in range(7)})   # 7 tokens go to 1: 1 should be default
    d = b.build()
    classes = token_classes(d)
    again = TokenDFA.from_class_table(d.class_table(classes), d.accepting, classes)
    assert again.default[0] == 1 and again.exceptions(0)[0].tolist() == [7, 8, 9]


def test_token_classes_vocab_mismatch():
    a = TokenDFA(**_arrays())
    b = DFABuilder(5)
    b.add_state()
    with pytest.raises(VocabularyMismatchError, match=r"\[3, 5\]"):
        token_classes(a, b.build())


# ---------------------------------------------------------------------- letters
from dfa_strategies import lettered_dfas  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(lettered_dfas())
def test_lettered_dfa_per_token_view(d):
    table = d.dense()
    letter_table = d.letter_table()
    assert (table == letter_table[:, d.letter_of_token]).all()
    # the lazily materialised per-token CSR arrays describe the same transition function
    for s in range(d.num_states):
        row = np.full(d.vocab_size, d.default[s])
        lo, hi = d.exc_ptr[s], d.exc_ptr[s + 1]
        assert (np.diff(d.exc_tokens[lo:hi]) > 0).all()
        row[d.exc_tokens[lo:hi]] = d.exc_next[lo:hi]
        assert (row == table[s]).all()
        tokens, nxt = d.exceptions(s)
        assert tokens.tolist() == d.exc_tokens[lo:hi].tolist()
        assert (nxt != d.default[s]).all()
        for v in range(d.vocab_size):
            assert d.step(s, v) == table[s, v]
    assert d.num_exceptions == len(d.exc_tokens) == len(d.exception_states())
    plain = d.without_letters()
    assert not plain.has_letters and (plain.dense() == table).all()
    assert (language(d.trim(), 4) == language(d, 4)).all()
    assert d.trim().has_letters or d.is_empty()


@settings(max_examples=40, deadline=None)
@given(lettered_dfas(), st.data())
def test_lettered_round_trip_and_classes(d, data):
    again = TokenDFA.from_arrays(d.to_arrays())
    assert again.has_letters and (again.dense() == d.dense()).all()
    other = data.draw(token_dfas(vocab_size=d.vocab_size, max_states=3))
    classes = token_classes(d, other)
    columns = np.concatenate([d.dense(), other.dense()], axis=0).T
    for u in range(d.vocab_size):
        for v in range(d.vocab_size):
            same = classes.class_of_token[u] == classes.class_of_token[v]
            assert same == bool((columns[u] == columns[v]).all())
    assert (d.class_table(classes)[:, classes.class_of_token] == d.dense()).all()


def test_lettered_validation():
    with pytest.raises(ConstraintError, match="one entry per token"):
        TokenDFA(**_arrays(letter_of_token=np.array([0, 1])))
    with pytest.raises(ConstraintError, match="exception letters"):
        TokenDFA(**_arrays(letter_of_token=np.array([0, 1, 1])))   # letter 2 does not exist
    d = TokenDFA(**_arrays(exc_tokens=np.array([1]), letter_of_token=np.array([0, 1, 1])))
    assert d.accepts([2]) and d.accepts([1]) and not d.accepts([0])
    assert d.num_exceptions == 2 and d.num_stored_exceptions == 1
