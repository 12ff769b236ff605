"""The lazy guide's shared completion weights β against enumeration over hidden-state paths."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import random_hmm

from ctrlg.dfa.lazy import lazy_regex
from ctrlg.guide.completion_memo import CompletionMemo
from ctrlg.guide.emission_operands import completion_memo
from ctrlg.guide.horizon import HorizonGuide

H, V = 3, 5


def _brute_beta(hmm, tokens, eos_ids):
    """β(y)[z] = Σ over hidden paths z → z_1 → … → z_{L+1} of Π A · Π B[z_i, y_i] ·
    Σ_e B[z_{L+1}, e] (without EOS: the path stops after y_L), by enumerating every path."""
    A, B = hmm.transition.double().numpy(), hmm.emission.double().numpy()
    h = A.shape[0]
    steps = len(tokens) + (1 if eos_ids else 0)
    out = np.zeros(h)
    for z in range(h):
        for path in itertools.product(range(h), repeat=steps):
            w, prev = 1.0, z
            for i, zi in enumerate(path):
                w *= A[prev, zi]
                w *= B[zi, tokens[i]] if i < len(tokens) else B[zi, list(eos_ids)].sum()
                prev = zi
            out[z] += w
    return out


def _memo(hmm, **kwargs):
    A = hmm.transition.float().numpy()
    Bt = hmm.emission.float().T.contiguous().numpy()
    return CompletionMemo(A, Bt, **kwargs), Bt


def _beta(memo, Bt, tokens, eos_ids):
    eos_column = Bt[list(eos_ids)].sum(0) if eos_ids else None
    node, vec, scale = memo.base(tuple(eos_ids), eos_column)
    for token in reversed(tokens):
        node, vec, scale = memo.extend(node, vec, scale, token)
    return vec.astype(np.float64) * math.exp(scale) if scale > -math.inf else np.zeros_like(vec)


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(0, V - 2), min_size=0, max_size=3),
       eos=st.sampled_from([(), (V - 1,), (0, V - 1)]), seed=st.integers(0, 5))
def test_beta_is_the_probability_of_the_completion_then_eos(tokens, eos, seed):
    hmm = random_hmm(H, V, seed=seed)
    memo, Bt = _memo(hmm)
    got = _beta(memo, Bt, tokens, eos)
    want = _brute_beta(hmm, tokens, eos)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.max(_beta(memo, Bt, tokens, eos)) > 0


def test_a_suffix_met_before_is_read_back_not_recomputed():
    """Two completions that share their last tokens: the second computes only its own first
    token; the values are those of a memo that never saw the first."""
    hmm = random_hmm(H, V, seed=1)
    memo, Bt = _memo(hmm)
    _beta(memo, Bt, [0, 2, 3], (V - 1,))
    computed = memo.computed
    got = _beta(memo, Bt, [1, 2, 3], (V - 1,))
    assert memo.computed == computed + 1 and memo.hits == 3      # the base, then 3, then 2
    fresh, _ = _memo(hmm)
    np.testing.assert_array_equal(got, _beta(fresh, Bt, [1, 2, 3], (V - 1,)))


def test_a_full_memo_drops_the_least_recently_used_and_stays_right():
    hmm = random_hmm(H, V, seed=2)
    memo, Bt = _memo(hmm, max_bytes=4 * H * 4)         # four vectors at most
    for tokens in itertools.product(range(V - 1), repeat=3):
        got = _beta(memo, Bt, list(tokens), (V - 1,))
        np.testing.assert_allclose(got, _brute_beta(hmm, list(tokens), (V - 1,)), rtol=1e-5)
        assert len(memo) <= 4


def test_an_unreachable_completion_is_zero_at_minus_infinity():
    """A token no hidden state emits: β is 0 (log scale −inf), and so is every longer
    completion ending with it."""
    hmm = random_hmm(H, V, seed=3)
    with torch.no_grad():
        hmm.emission[:, 2] = 0.0
    memo, Bt = _memo(hmm)
    node, vec, scale = memo.base((V - 1,), Bt[[V - 1]].sum(0))
    node, vec, scale = memo.extend(node, vec, scale, 2)
    assert scale == -math.inf and not vec.any()
    node, vec, scale = memo.extend(node, vec, scale, 0)
    assert scale == -math.inf and not vec.any()


def test_guides_of_one_hmm_share_the_memo_until_the_hmm_changes():
    tokens = [b"a", b"b", b"c", b"\x00"]
    d = lazy_regex(r"(a|b)c{6}", tokens, eos_token_id=3)
    hmm = random_hmm(H, len(tokens), seed=4)
    first = HorizonGuide(d, hmm, 12, horizon=2)
    first.log_ratio(d.initial, first.initial_prior(), 12)
    memo = first._completions
    assert memo.computed > 0
    computed = memo.computed
    second = HorizonGuide(d, hmm, 12, horizon=2)
    assert second._completions is memo
    again = second.log_ratio(d.initial, second.initial_prior(), 12)
    assert memo.computed == computed and memo.hits > 0
    assert torch.equal(again, first.log_ratio(d.initial, first.initial_prior(), 12))
    with torch.no_grad():
        hmm.emission.mul_(1.0)                 # an in-place write: a new version of B
    third = HorizonGuide(d, hmm, 12, horizon=2)
    assert third._completions is not memo
    A = hmm.transition.float().numpy()
    assert completion_memo(hmm, A, third._emission_np) is third._completions


@pytest.mark.parametrize("eos", [True, False])
def test_the_guides_beta_is_the_enumerated_one(eos):
    """β(s) of every state along a forced completion equals the enumeration's."""
    tokens = [b"a", b"b", b"c", b"\x00"]
    d = lazy_regex(r"ab?c", tokens, eos_token_id=3 if eos else None)
    hmm = random_hmm(H, len(tokens), seed=5)
    guide = HorizonGuide(d, hmm, 6, horizon=1)
    q = d.initial
    assert guide.feasibility.upper_bound(q) < math.inf
    vec, scale = guide.completion_weight(q)
    completion, s = [], q
    while (step := guide.feasibility.completion_step(s)) is not None:
        completion.append(step[0])
        s = step[1]
    want = _brute_beta(hmm, completion, (3,) if eos else ())
    np.testing.assert_allclose(vec.astype(np.float64) * math.exp(scale), want, rtol=1e-5)
