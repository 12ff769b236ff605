"""The guide's HMM-only operands are built once per HMM (ctrlg.guide.emission_operands), and the
dense products of several tables of one HMM run as one (ctrlg.guide.token_weights.log_ratios):
both must give exactly what each table computes on its own."""

import gc

import numpy as np
import pytest
import torch

from ctrlg import HMM
from ctrlg.guide import build_tables
from ctrlg.guide import emission_operands as operands_module
from ctrlg.guide.guidance import guidance_log_ratio, guided_log_probs
from ctrlg.guide.token_weights import log_ratios
from helpers import random_dfa, random_hmm, random_letter_dfa

V, N = 5, 4


def _rows(dfa, seed, h=3):
    """Every state of ``dfa`` twice, with random priors and budgets 1..N."""
    g = torch.Generator().manual_seed(seed)
    states = np.array([s for s in range(dfa.num_states) for _ in range(2)])
    priors = torch.softmax(torch.randn(len(states), h, generator=g), -1)
    remaining = np.array([1 + i % N for i in range(len(states))])
    return states, priors, remaining


def test_tables_of_one_hmm_share_its_emission_operands():
    hmm, other = random_hmm(3, V, 0), random_hmm(3, V, 1)
    a = build_tables(hmm, random_dfa(4, V, 2), N, eos_token_id=4)
    b = build_tables(hmm, random_letter_dfa(5, V, 3), N, eos_token_id=4)
    c = build_tables(other, random_dfa(4, V, 2), N, eos_token_id=4)
    assert a._emission_product is b._emission_product and a._emission_t is b._emission_t
    assert c._emission_product is not a._emission_product
    torch.testing.assert_close(a._emission_t, hmm.emission.float().T)
    torch.testing.assert_close(a._row_sum, hmm.emission.double().sum(1))


def test_an_emission_changed_in_place_is_seen_by_later_tables():
    """EM updates the emission in place: tables built afterwards must use the new values."""
    hmm, target = random_hmm(3, V, 4), random_hmm(3, V, 5)
    dfa = random_letter_dfa(5, V, 6)
    build_tables(hmm, dfa, N, eos_token_id=4)          # fills the cache with the old emission
    with torch.no_grad():
        hmm.emission.copy_(target.emission)
        hmm.transition.copy_(target.transition)
        hmm.initial.copy_(target.initial)
    states, priors, remaining = _rows(dfa, 7)
    got = build_tables(hmm, dfa, N, eos_token_id=4).log_ratio(states, priors, remaining)
    fresh = HMM.from_params(target.initial, target.transition, target.emission)
    want = build_tables(fresh, dfa, N, eos_token_id=4).log_ratio(states, priors, remaining)
    torch.testing.assert_close(got, want)


def test_the_cache_lets_a_dropped_hmm_go():
    hmm = random_hmm(3, V, 8)
    build_tables(hmm, random_dfa(4, V, 9), N, eos_token_id=4)
    assert hmm in operands_module._CACHE
    before = len(operands_module._CACHE)
    del hmm
    gc.collect()
    assert len(operands_module._CACHE) == before - 1


@pytest.mark.parametrize("inline_rows", [0, 1000])
def test_log_ratios_of_several_tables_equal_each_table_alone(monkeypatch, inline_rows):
    """Tables of one HMM (one stacked product), of another HMM and logical-only ones, mixed."""
    monkeypatch.setattr("ctrlg.guide.tables.BLOCK_LETTER", 1)
    monkeypatch.setattr("ctrlg.guide.token_weights.INLINE_ROWS", inline_rows)
    hmm, other = random_hmm(3, V, 10), random_hmm(3, V, 11)
    dfas = [random_letter_dfa(5, V, 12), random_dfa(4, V, 13), random_letter_dfa(6, V, 14)]
    tables = [build_tables(hmm, d, N, eos_token_id=4) for d in dfas]
    tables += [build_tables(other, dfas[0], N, eos_token_id=4), build_tables(None, dfas[1], N, eos_token_id=4)]
    queries = []
    for i, t in enumerate(tables):
        states, priors, remaining = _rows(t.dfa, 20 + i)
        keep = t.feasible[remaining, states]          # the guide asks only about feasible rows
        queries.append((t, states[keep], None if t.hmm is None else priors[torch.as_tensor(keep)],
                        remaining[keep]))
    for shifted in (False, True):
        together = log_ratios(queries, shifted=shifted)
        for (t, states, priors, remaining), got in zip(queries, together):
            alone = t.log_ratio(states, priors, remaining, shifted=shifted)
            assert torch.equal(torch.isinf(got), torch.isinf(alone))
            torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["mixed", "blocks", "blocks_all_feasible"])
def test_guidance_over_rows_of_several_tables_equals_each_row_alone(monkeypatch, layout):
    """guidance_log_ratio with rows of several DFAs (a batch of items: rows in any order, or one
    block per item as beam search lays them out, written straight into one buffer) gives every
    row what its own table gives it, including −inf rows for infeasible states, and its
    log p_hmm(α | x≤t) equals the sum over tokens of p_hmm(v | x≤t) p_hmm(α | x≤t, v)."""
    monkeypatch.setattr("ctrlg.guide.tables.BLOCK_LETTER", 1)
    hmm = random_hmm(3, V, 30)
    tables = [build_tables(hmm, random_letter_dfa(5, V, 31 + i), N, eos_token_id=4) for i in range(3)]
    rng = np.random.default_rng(0)
    table_of_row = rng.integers(0, 3, size=12) if layout == "mixed" else np.repeat(np.arange(3), 4)
    remaining = 3
    states = np.array([rng.integers(tables[k].dfa.num_states) for k in table_of_row])
    if layout == "blocks_all_feasible":   # table 1 accepts nothing: blocks of tables 0 and 2
        table_of_row = np.repeat([0, 2], 6)
        states = np.array([rng.choice(np.flatnonzero(tables[k].feasible[remaining])) for k in table_of_row])
    priors = torch.softmax(torch.randn(12, 3, generator=torch.Generator().manual_seed(1)), -1)
    accept: list = []
    got = guidance_log_ratio(tables, table_of_row, states, priors, remaining, log_accept=accept)
    for i, k in enumerate(table_of_row):
        if not tables[k].feasible[remaining, states[i]]:
            assert torch.isneginf(got[i]).all() and torch.isneginf(accept[0][i])
            continue
        alone = tables[k].log_ratio([states[i]], priors[i:i + 1], remaining)[0]
        assert torch.equal(torch.isinf(got[i]), torch.isinf(alone))
        torch.testing.assert_close(got[i], alone, rtol=1e-5, atol=1e-5)
        _, log_marginal = tables[k].token_weights([states[i]], priors[i:i + 1], remaining)
        want = torch.logsumexp(log_marginal[0] + alone, 0)
        torch.testing.assert_close(accept[0][i], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shifted", [False, True])
def test_guidance_with_a_budget_per_row_equals_each_budget_alone(shifted):
    """``remaining`` as one count per row (the fast-forward sampler's rows at different budgets in
    one call): every row gets what a call at its own budget gives it, and the guided
    log-probabilities are those of the per-budget calls."""
    hmm = random_hmm(3, V, 40)
    tables = [build_tables(hmm, random_letter_dfa(5, V, 41), N, eos_token_id=4)]
    states, priors, remaining = _rows(tables[0].dfa, 2)
    zeros = np.zeros(len(states), dtype=np.int64)
    got = guidance_log_ratio(tables, zeros, states, priors, remaining, shifted=shifted)
    scores = torch.log_softmax(torch.randn(len(states), V, generator=torch.Generator().manual_seed(3)), -1)
    guided = guided_log_probs(scores, tables, zeros, states, priors, remaining)
    assert len(np.unique(remaining)) == N
    for left in np.unique(remaining):
        rows = np.flatnonzero(remaining == left)
        alone = guidance_log_ratio(tables, zeros[rows], states[rows], priors[rows], int(left), shifted=shifted)
        assert torch.equal(torch.isinf(got[rows]), torch.isinf(alone))
        if not shifted:
            torch.testing.assert_close(got[rows], alone, rtol=1e-5, atol=1e-5)
        want = guided_log_probs(scores[rows], tables, zeros[rows], states[rows], priors[rows], int(left))
        torch.testing.assert_close(guided[rows], want, rtol=1e-5, atol=1e-5)
