"""Row bookkeeping of the processor: states and priors equal a replay from the start, whatever
the reordering and duplication of rows between calls; the guided log-probs function is pure."""

import numpy as np
import torch
import pytest

from ctrlg.guide.guidance import apply_guidance, guided_log_probs
from ctrlg.guide import build_tables, forward_update
from ctrlg.guide.priors import HMMFilterPrior, PriorSource
from ctrlg.guide.row_state import RowStates
from helpers import random_dfa, random_hmm


def _replayed(dfa, hmm, row):
    state, prior = dfa.initial, hmm.initial.float()[None]
    B_t = hmm.emission.float().T.contiguous()
    for tok in row:
        state = dfa.step(state, int(tok))
        prior = forward_update(prior, torch.tensor([int(tok)]), hmm.transition.float(), B_t)
    return state, prior[0]


def test_row_states_match_replay_under_reordering_and_duplication():
    V, h = 5, 3
    dfas = [random_dfa(6, V, 1), random_dfa(4, V, 2)]
    hmm = random_hmm(h, V, 0)
    rows = RowStates(dfas, HMMFilterPrior(hmm))
    assert isinstance(rows.prior, PriorSource)
    rng = np.random.default_rng(0)
    B = 6
    dfa_index = torch.tensor([0, 0, 0, 1, 1, 1])
    generated = torch.zeros(B, 0, dtype=torch.long)
    for step in range(6):
        states, priors = rows.update(generated, dfa_index)
        for i in range(B):
            want_state, want_prior = _replayed(dfas[int(dfa_index[i])], hmm, generated[i].tolist())
            assert states[i] == want_state
            torch.testing.assert_close(priors[i], want_prior, rtol=1e-5, atol=1e-6)
        # beam-search-like: each new row continues a random row of the same DFA (or keeps order)
        if step % 2:
            parents = torch.arange(B)
        else:
            parents = torch.tensor([int(rng.integers(0, 3)) for _ in range(3)]
                                   + [int(rng.integers(3, 6)) for _ in range(3)])
        new = torch.tensor(rng.integers(0, V, size=(B, 1)))
        generated = torch.cat([generated[parents], new], 1)


def test_rows_without_parent_are_replayed():
    V = 4
    dfa, hmm = random_dfa(5, V, 3), random_hmm(2, V, 1)
    rows = RowStates([dfa], HMMFilterPrior(hmm))
    generated = torch.tensor([[1, 2, 3], [0, 0, 1]])
    states, priors = rows.update(generated, torch.zeros(2, dtype=torch.long))  # no previous call
    for i in range(2):
        state, prior = _replayed(dfa, hmm, generated[i].tolist())
        assert states[i] == state
        torch.testing.assert_close(priors[i], prior, rtol=1e-5, atol=1e-6)
    # one row continues, one is new
    nxt = torch.tensor([[1, 2, 3, 0], [3, 3, 3, 3]])
    states, priors = rows.update(nxt, torch.zeros(2, dtype=torch.long))
    for i in range(2):
        state, prior = _replayed(dfa, hmm, nxt[i].tolist())
        assert states[i] == state
        torch.testing.assert_close(priors[i], prior, rtol=1e-5, atol=1e-6)


def test_logical_rows_have_no_priors():
    dfa = random_dfa(5, 4, 4)
    rows = RowStates([dfa])
    states, priors = rows.update(torch.tensor([[1, 2]]), torch.zeros(1, dtype=torch.long))
    assert priors is None and states[0] == dfa.run([1, 2])


def test_guided_log_probs_is_pure_and_is_log_softmax_of_lm_plus_guidance():
    V, n = 5, 4
    dfa, hmm = random_dfa(6, V, 5), random_hmm(3, V, 2)
    tables = build_tables(hmm, dfa, n)
    states = np.array([dfa.initial, dfa.initial])
    priors = hmm.initial.float().expand(2, -1).clone()
    scores = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    table_of_row = np.zeros(2, dtype=np.int64)
    first = guided_log_probs(scores, [tables], table_of_row, states, priors, n)
    second = guided_log_probs(scores.clone(), [tables], table_of_row, states, priors.clone(), n)
    torch.testing.assert_close(first, second)
    ratio = tables.log_ratio(states, priors, n)
    want = torch.log_softmax(scores + ratio, -1)
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(apply_guidance(scores, ratio), want)
    # an LM that rules out every feasible token: the guidance alone decides
    dead_lm = torch.where(torch.isfinite(ratio), -torch.inf, scores)
    fallback = apply_guidance(dead_lm, ratio)
    torch.testing.assert_close(fallback, torch.log_softmax(ratio, -1))


@pytest.mark.parametrize("strength", [0.0, 0.5, 1.0, 2.0])
def test_guided_log_probs_strength_fallback_and_shift(strength):
    V, n = 6, 4
    dfa, hmm = random_dfa(7, V, 3), random_hmm(4, V, 5)
    tables = build_tables(hmm, dfa, n)
    states = np.array([dfa.initial] * 3)
    priors = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(1)), -1)
    ratio = tables.log_ratio(states, priors, n)
    shifted = tables.log_ratio(states, priors, n, shifted=True)
    finite = torch.isfinite(ratio)
    assert torch.equal(finite, torch.isfinite(shifted))
    offset = torch.where(finite, ratio - shifted, torch.nan)
    for row in offset:   # the shift is one constant per row
        vals = row[~torch.isnan(row)]
        torch.testing.assert_close(vals, vals[:1].expand_as(vals))
    scores = torch.randn(3, V, generator=torch.Generator().manual_seed(2))
    scores[1] = torch.where(finite[1], -torch.inf, scores[1])    # row 1: the LM rules out all feasible tokens
    before = scores.clone()
    got = guided_log_probs(scores, [tables], np.zeros(3, dtype=np.int64), states, priors, n, strength)
    assert torch.equal(scores, before)                           # inputs untouched
    term = torch.where(finite, strength * ratio, -torch.inf)
    want = torch.log_softmax(scores + term, -1)
    want[1] = torch.log_softmax(term[1], -1)                      # the fallback: guidance alone
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(apply_guidance(scores, ratio, strength), want)
