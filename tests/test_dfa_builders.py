"""Token-level builders against brute-force predicates over all sequences up to length 6."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.errors import ConstraintError
from dfa_strategies import all_sequences, language, phrases

V, MAX_LEN = 3, 6


def contains(seq, p):
    k = len(p)
    return any(list(seq[i:i + k]) == list(p) for i in range(len(seq) - k + 1))


def expected(predicate, vocab_size=V, max_len=MAX_LEN):
    return np.array([predicate(s) for s in all_sequences(vocab_size, max_len)])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, V - 1), min_size=1, max_size=5))
def test_phrase_matches_substring_search(p):
    d = dfa.phrase(p, vocab_size=V)
    assert d.num_states == len(p) + 1                       # KMP: O(len) states
    assert (language(d, MAX_LEN) == expected(lambda s: contains(s, p))).all()
    # exceptions only on the phrase's own tokens
    assert set(d.exc_tokens.tolist()) <= set(p)


def test_phrase_on_a_large_vocabulary_stores_few_exceptions():
    d = dfa.phrase([12, 7, 12, 7, 3], vocab_size=50_000)
    assert d.num_states == 6 and d.num_exceptions <= 3 * 5
    assert d.accepts([1, 12, 7, 12, 12, 7, 12, 7, 3, 9]) and not d.accepts([12, 7, 12, 3])


@settings(max_examples=60, deadline=None)
@given(phrases(V, max_len=4, max_count=4))
def test_any_phrase_matches_any_substring(ps):
    d = dfa.any_phrase(ps, vocab_size=V)
    want = expected(lambda s: any(contains(s, p) for p in ps))
    assert (language(d, MAX_LEN) == want).all()


def test_any_phrase_keeps_a_pattern_contained_in_another():
    # the published implementation loses [12, 3] when [2, 3] is present
    d = dfa.any_phrase([[12, 3], [2, 3]], vocab_size=20)
    assert d.accepts([12, 3]) and d.accepts([2, 3]) and d.accepts([5, 12, 3, 1])
    assert not d.accepts([12, 2]) and not d.accepts([3, 12])
    # a pattern in the middle of a longer one, found through failure links
    d = dfa.any_phrase([[1, 2, 3], [2]], vocab_size=5)
    assert d.accepts([1, 2]) and d.accepts([2]) and not d.accepts([1, 3, 1])
    d = dfa.any_phrase([[1, 2, 1, 3], [2, 1, 4]], vocab_size=5)
    assert d.accepts([1, 2, 1, 4]) and not d.accepts([1, 2, 1, 1])


@settings(max_examples=60, deadline=None)
@given(phrases(V, max_len=3, max_count=3), st.lists(st.booleans(), min_size=V, max_size=V))
def test_phrases_followed_by_a_boundary(ps, mask):
    boundary = np.array(mask)

    def followed(s, i, p):
        end = i + len(p)
        return tuple(s[i:end]) == tuple(p) and (end == len(s) or boundary[s[end]])

    d = dfa.any_phrase(ps, vocab_size=V, boundary=boundary)
    want = expected(lambda s: any(followed(s, i, p) for p in ps for i in range(len(s))))
    assert (language(d, MAX_LEN) == want).all()
    d = dfa.starts_with(ps, vocab_size=V, boundary=boundary)
    assert (language(d, MAX_LEN) == expected(lambda s: any(followed(s, 0, p) for p in ps))).all()


def test_boundary_mask_is_validated():
    with pytest.raises(ConstraintError, match="boundary"):
        dfa.any_phrase([[1]], vocab_size=V, boundary=np.ones(V + 1, dtype=bool))
    with pytest.raises(ConstraintError, match="boundary"):
        dfa.starts_with([[1]], vocab_size=V, boundary=[1, 0, 1])


@settings(max_examples=40, deadline=None)
@given(phrases(V, max_len=3, max_count=3))
def test_banned_phrases_is_the_complement(ps):
    d = dfa.banned_phrases(ps, vocab_size=V)
    assert (language(d, MAX_LEN) == expected(lambda s: not any(contains(s, p) for p in ps))).all()


@settings(max_examples=40, deadline=None)
@given(phrases(V, max_len=3, max_count=3))
def test_starts_with(ps):
    d = dfa.starts_with(ps, vocab_size=V)
    want = expected(lambda s: any(tuple(s[:len(p)]) == tuple(p) for p in ps))
    assert (language(d, MAX_LEN) == want).all()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, V - 1), min_size=1, max_size=4))
def test_exact(p):
    d = dfa.exact(p, vocab_size=V)
    assert (language(d, MAX_LEN) == expected(lambda s: list(s) == p)).all()


@pytest.mark.parametrize("lo, hi", [(0, 0), (0, 3), (2, 4), (5, 5), (2, None), (0, None)])
def test_length(lo, hi):
    d = dfa.length(lo, hi, vocab_size=V)
    want = expected(lambda s: lo <= len(s) and (hi is None or len(s) <= hi))
    assert (language(d, MAX_LEN) == want).all()


def test_length_accepts_positional_vocab_size():
    assert (language(dfa.length(1, 2, V), 4) == language(dfa.length(1, 2, vocab_size=V), 4)).all()


@pytest.mark.parametrize("required", [False, True])
def test_eos_discipline(required):
    eos = 2
    d = dfa.eos(eos, vocab_size=V, required=required)

    def ok(s):
        if eos in s:
            first = s.index(eos)
            if any(t != eos for t in s[first:]):
                return False
            return True
        return not required

    assert (language(d, MAX_LEN) == expected(ok)).all()


def test_universal():
    assert language(dfa.universal(V), 4).all()


@pytest.mark.parametrize("call, message", [
    (lambda: dfa.phrase([], vocab_size=5), "empty phrase"),
    (lambda: dfa.phrase([1, 5], vocab_size=5), "token id 5 out of range"),
    (lambda: dfa.phrase([-1], vocab_size=5), "token id -1 out of range"),
    (lambda: dfa.phrase("abc", vocab_size=5), "string"),
    (lambda: dfa.phrase([1.5], vocab_size=5), "not a token id"),
    (lambda: dfa.phrase([1], vocab_size=0), "vocab_size"),
    (lambda: dfa.any_phrase([], vocab_size=5), "phrases is empty"),
    (lambda: dfa.any_phrase([[1], []], vocab_size=5), "empty phrase"),
    (lambda: dfa.any_phrase([[1], [9]], vocab_size=5), "token id 9"),
    (lambda: dfa.banned_phrases([[7]], vocab_size=5), "token id 7"),
    (lambda: dfa.length(3, 2, vocab_size=5), "min_tokens=3 > max_tokens=2"),
    (lambda: dfa.length(-1, 2, vocab_size=5), "min_tokens"),
    (lambda: dfa.length(1, 2), "vocab_size"),
    (lambda: dfa.eos(5, vocab_size=5), "eos_token_id 5"),
    (lambda: dfa.exact([], vocab_size=5), "empty sequence"),
])
def test_bad_input_raises_a_clear_value_error(call, message):
    with pytest.raises(ConstraintError, match=message) as info:
        call()
    assert isinstance(info.value, ValueError)


def test_phrases_accept_numpy_and_torch_ids():
    torch = pytest.importorskip("torch")
    assert dfa.phrase(np.array([1, 2]), vocab_size=V).accepts([0, 1, 2])
    assert dfa.any_phrase([torch.tensor([2, 1])], vocab_size=V).accepts([2, 1, 0])
