"""Backward tables, feasibility and per-token weights of ctrlg.guide against brute force."""

import itertools
import math

import numpy as np
import pytest
import torch

from ctrlg import HMM
from ctrlg.dfa.core import TokenDFA
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError, VocabularyMismatchError
from ctrlg.guide import GuideTables, build_tables, resolve_precision
from ctrlg.kernels.packed_linear import native_bfloat16
from helpers import random_dfa, random_hmm, random_letter_dfa


def seq_prob(hmm, seq):
    """p_hmm(x_1..x_k) in float64 (k ≥ 0)."""
    pi, A, B = (t.double() for t in (hmm.initial, hmm.transition, hmm.emission))
    p, total = pi, 1.0
    for i, v in enumerate(seq):
        if i:
            p = p @ A
        q = p * B[:, v]
        s = float(q.sum())
        total *= s
        if s == 0:
            return 0.0
        p = q / s
    return total


def generations(V, n, m, eos):
    """Every generation: ends at an allowed EOS (after ≥ m tokens) or has exactly n tokens."""
    for L in range(1, n + 1):
        for y in itertools.product(range(V), repeat=L):
            if any(t in eos for t in y[:-1]):
                continue
            if y[-1] in eos:
                if L - 1 >= m:
                    yield y
            elif L == n:
                yield y


def brute_weights(hmm, dfa, n, m, eos, suffix):
    """{generation: weight} for accepted generations: p_hmm(y), or p_hmm(y' σ) with a suffix."""
    out = {}
    for y in generations(dfa.vocab_size, n, m, eos):
        if not dfa.accepts(list(y)):
            continue
        if suffix:
            middle = y[:-1] if y[-1] in eos else y
            out[y] = seq_prob(hmm, list(middle) + list(suffix))
        else:
            out[y] = seq_prob(hmm, y)
    return out


CASES = [  # (S, V, h, n, min_tokens, eos, suffix, seed)
    (3, 3, 2, 3, 0, [], None, 0),
    (4, 4, 3, 3, 0, [3], None, 1),
    (3, 4, 2, 4, 2, [0], None, 2),
    (4, 3, 3, 3, 0, [2], [1, 0], 3),
    (3, 4, 2, 3, 1, [], [2], 4),
    (5, 4, 3, 3, 0, [1, 3], None, 5),
    (3, 5, 2, 3, 0, [4], None, 6),      # letters (token classes) from here on
    (4, 5, 3, 3, 1, [3], [1], 7),
    (3, 4, 2, 3, 0, [], None, 8),
]


@pytest.mark.parametrize("S,V,h,n,m,eos,suffix,seed", CASES)
def test_tables_and_token_weights_equal_brute_force(S, V, h, n, m, eos, suffix, seed):
    _check_against_brute_force(S, V, h, n, m, eos, suffix, seed)


@pytest.mark.parametrize("S,V,h,n,m,eos,suffix,seed", CASES[6:])
@pytest.mark.parametrize("bound", [None, math.inf])
def test_letters_evaluated_as_blocks_equal_brute_force(monkeypatch, S, V, h, n, m, eos, suffix, seed,
                                                        bound):
    """Every exceptional letter through the per-letter block product (large vocabularies); with
    an infinite underflow bound every call takes the unfolded path and then the per-entry check."""
    monkeypatch.setattr("ctrlg.guide.tables.BLOCK_LETTER", 1)
    if bound is not None:
        monkeypatch.setattr("ctrlg.guide.token_weights.UNDERFLOW_BOUND", bound)
    for inline_rows in (0, 1000):   # per-letter products, and extra rows of the dense product
        monkeypatch.setattr("ctrlg.guide.token_weights.INLINE_ROWS", inline_rows)
        _check_against_brute_force(S, V, h, n, m, eos, suffix, seed)


def _check_against_brute_force(S, V, h, n, m, eos, suffix, seed, hmm=None):
    hmm = random_hmm(h, V, seed) if hmm is None else hmm
    for dfa_seed in range(3):
        make = random_letter_dfa if seed >= 6 else random_dfa
        dfa = make(S, V, 100 * seed + dfa_seed)
        weights = brute_weights(hmm, dfa, n, m, eos, suffix)
        tables = build_tables(hmm, dfa, n, min_new_tokens=m, eos_token_id=eos or None, suffix_ids=suffix)
        bf16 = build_tables(hmm, dfa, n, min_new_tokens=m, eos_token_id=eos or None, suffix_ids=suffix,
                            precision="bfloat16")
        total = sum(weights.values())
        assert tables.feasible[n, dfa.initial] == (len(weights) > 0)
        if not weights:
            with pytest.raises(UnsatisfiableConstraintError):
                tables.check_satisfiable()
            continue
        assert math.isclose(math.exp(tables.log_prob_accept()), total, rel_tol=1e-4)
        # every non-terminal prefix x (no EOS, shorter than n): per-token joint and marginal
        for t in range(n):
            for x in itertools.product([v for v in range(V) if v not in eos], repeat=t):
                state = dfa.run(list(x))
                prior = tables.initial_prior()
                for v in x:
                    prior = tables.advance(prior, [v])
                r = n - t
                log_joint, log_marg = tables.token_weights([state], prior, r)
                mask = tables.token_feasible([state], r)[0]
                assert tables.feasible_counts([state], r)[0] == int(mask.sum())
                px = seq_prob(hmm, x)
                for v in range(V):
                    brute_joint = sum(w for y, w in weights.items() if y[:t + 1] == x + (v,)) / px
                    assert math.isclose(math.exp(log_joint[0, v].item()), brute_joint,
                                        rel_tol=1e-4, abs_tol=1e-12), (x, v)
                    assert bool(mask[v]) == (brute_joint > 0), (x, v)
                    assert math.isclose(math.exp(log_marg[0, v].item()),
                                        seq_prob(hmm, x + (v,)) / px, rel_tol=1e-4)
                ratio = tables.log_ratio([state], prior, r)[0]
                assert torch.equal(torch.isfinite(ratio), mask)
                want = (log_joint - log_marg)[0]
                torch.testing.assert_close(ratio[mask], want[mask], rtol=1e-4, atol=1e-5)
                shifted = tables.log_ratio([state], prior, r, shifted=True)[0]
                offset = (ratio - shifted)[mask]      # one constant per row
                torch.testing.assert_close(offset, offset[:1].expand_as(offset), rtol=0, atol=1e-4)
                low = bf16.log_ratio([state], prior, r)[0]   # bfloat16 products: ≤ ~1 % relative
                assert torch.equal(torch.isfinite(low), mask)
                torch.testing.assert_close(low[mask].exp(), want[mask].exp(), rtol=2e-2, atol=1e-6)


def test_backward_table_rows_equal_brute_force():
    """W_r(s, z) itself, for every state, hidden state and r, without EOS: enumerate continuations."""
    S, V, h, n = 3, 3, 2, 3
    hmm = random_hmm(h, V, 7)
    dfa = random_dfa(S, V, 8)
    tables = build_tables(hmm, dfa, n, reachable_only=False)
    A, B = hmm.transition.double(), hmm.emission.double()
    for r in range(n + 1):
        W = tables.w_hat[r].double() * torch.exp(tables.log_scale[r])[:, None]
        W = torch.nan_to_num(W, nan=0.0)
        for s in range(S):
            for z in range(h):
                expect = 0.0
                for y in itertools.product(range(V), repeat=r):
                    if not dfa.is_accepting(dfa.run(list(y), s)):
                        continue
                    p = torch.zeros(h, dtype=torch.float64)
                    p[z] = 1.0
                    prob = 1.0
                    for v in y:
                        p = p @ A
                        q = p * B[:, v]
                        prob *= float(q.sum())
                        p = q / q.sum()
                    expect += prob
                assert math.isclose(float(W[s, z]), expect, rel_tol=1e-4, abs_tol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_the_reachable_band_is_what_enumeration_reaches_and_its_rows_are_unchanged(seed):
    """B_r(s) = F_r(s) ∧ (s is reached from the initial state by some sequence of exactly n − r
    tokens, EOS excluded), by enumeration; inside the band the tables equal the full ones (up to
    the product's float rounding), outside they are 0."""
    S, V, h, n = 5, 4, 3, 4
    eos = 3
    dfa = random_dfa(S, V, 20 + seed)
    hmm = random_hmm(h, V, 30 + seed)
    full = build_tables(hmm, dfa, n, eos_token_id=eos, reachable_only=False)
    band = build_tables(hmm, dfa, n, eos_token_id=eos)
    for r in range(n + 1):
        reached = {dfa.run(list(y)) for y in itertools.product([0, 1, 2], repeat=n - r)}
        for s in range(S):
            assert band.band[r, s] == (s in reached and bool(full.feasible[r, s])), (r, s)
            if band.band[r, s]:
                assert torch.allclose(band.w_hat[r, s], full.w_hat[r, s], rtol=1e-6, atol=0)
                assert math.isclose(band.log_scale[r, s], full.log_scale[r, s], rel_tol=1e-6,
                                    abs_tol=1e-6)
            else:
                assert not band.w_hat[r, s].any() and band.log_scale[r, s] == -math.inf
    unreachable = [(r, s) for r in range(n + 1) for s in range(S)
                   if full.feasible[r, s] and not band.band[r, s]]
    if unreachable:
        r, s = unreachable[0]
        with pytest.raises(ConstraintError, match="cannot be reached"):
            band.log_prob_accept(s, remaining=r)


def phrase_dfa(phrase, V):
    """'phrase appears somewhere' for a phrase whose first token never reappears in it."""
    S = len(phrase) + 1
    table = np.zeros((S, V), dtype=np.int64)
    for s in range(len(phrase)):
        table[s, :] = 0
        table[s, phrase[0]] = 1
        table[s, phrase[s]] = s + 1
    table[len(phrase), :] = len(phrase)
    accepting = np.zeros(S, bool)
    accepting[-1] = True
    return TokenDFA.from_dense(table, accepting)


def log_space_reference(hmm, dfa, n):
    """log P_hmm(α) by a dense float64 log-space recurrence (independent of the scaling)."""
    logA, logB = hmm.transition.double().log().numpy(), hmm.emission.double().log().numpy()
    table = dfa.dense()
    logW = np.where(dfa.accepting, 0.0, -np.inf)[:, None] * np.ones(hmm.hidden_size)
    from scipy.special import logsumexp
    for _ in range(n):
        g = logsumexp(logB[None] + logW[table].transpose(0, 2, 1), axis=2)  # [S, h]
        logW_next = logsumexp(logA[None] + g[:, None, :], axis=2)
        last_g, logW = g, logW_next
    return float(logsumexp(hmm.initial.double().log().numpy() + last_g[dfa.initial]))


def test_astronomically_small_probabilities_do_not_underflow():
    V, n = 50, 200
    phrase = [0] + [1 + (i % (V - 1)) for i in range(149)]
    dfa = phrase_dfa(phrase, V)
    hmm = random_hmm(4, V, 11, concentration=50.0)  # near uniform
    tables = build_tables(hmm, dfa, n)
    got = tables.log_prob_accept()
    expect = log_space_reference(hmm, dfa, n)
    assert expect < -500  # ~1e-250: far below float32's range
    assert math.isfinite(got) and abs(got - expect) < 1e-3 * abs(expect)
    assert torch.isfinite(tables.log_scale[n, dfa.initial])
    # per-token guidance stays finite on the feasible tokens, −inf on the others
    ratio = tables.log_ratio([dfa.initial], tables.initial_prior(), n)
    assert torch.isfinite(ratio).all()
    # from state 5 (145 phrase tokens to go) with 150 left: continue, or restart at token 0
    ratio = tables.log_ratio([5], tables.initial_prior(), 150)
    feasible = tables.token_feasible([5], 150)[0]
    assert feasible.sum() == 2 and torch.equal(torch.isfinite(ratio[0]), feasible)


def test_logical_mode_is_feasibility_only():
    dfa = random_dfa(4, 4, 3)
    tables = build_tables(None, dfa, 3, eos_token_id=2)
    assert tables.w_hat is None
    for s in range(4):
        ratio = tables.log_ratio([s], None, 3)
        mask = tables.token_feasible([s], 3)
        assert torch.equal(ratio == 0, mask) and torch.equal(torch.isinf(ratio), ~mask)


def test_feasibility_is_exact_despite_tiny_hmm_mass():
    """A token the HMM almost never emits but that is the only way to accept stays feasible."""
    V, h = 3, 2
    pi = torch.tensor([0.5, 0.5])
    A = torch.full((h, h), 0.5)
    B = torch.tensor([[1.0 - 2e-30, 1e-30, 1e-30], [1.0 - 2e-30, 1e-30, 1e-30]])
    hmm = HMM.from_params(pi, A, B)
    table = np.array([[0, 1, 0], [1, 1, 1]])
    dfa = TokenDFA.from_dense(table, [False, True])  # token 1 must appear
    tables = build_tables(hmm, dfa, 1)
    ratio = tables.log_ratio([0], tables.initial_prior(), 1)[0]
    assert torch.isfinite(ratio[1]) and torch.isinf(ratio[0]) and torch.isinf(ratio[2])


def test_bad_inputs_raise_clear_errors():
    hmm = random_hmm(2, 5, 0)
    with pytest.raises(VocabularyMismatchError, match="vocabulary size 4"):
        build_tables(hmm, random_dfa(3, 4, 0), 3)
    dfa = random_dfa(3, 5, 0)
    with pytest.raises(ConstraintError, match="max_tokens"):
        build_tables(hmm, dfa, 0)
    with pytest.raises(ConstraintError, match="eos_token_id"):
        build_tables(hmm, dfa, 3, eos_token_id=9)
    with pytest.raises(ConstraintError, match="suffix_ids"):
        build_tables(hmm, dfa, 3, suffix_ids=[])
    never = TokenDFA.from_dense(np.zeros((2, 5), dtype=np.int64), [False, True])
    tables = GuideTables(never, hmm, 3)
    with pytest.raises(UnsatisfiableConstraintError, match="max_new_tokens=3"):
        tables.check_satisfiable()


@pytest.mark.parametrize("inline_rows", [0, 1000])
def test_rows_of_a_batch_equal_rows_alone(monkeypatch, inline_rows):
    """A batch of rows (different states, priors, budgets) gives each row what it gets alone."""
    monkeypatch.setattr("ctrlg.guide.tables.BLOCK_LETTER", 1)
    monkeypatch.setattr("ctrlg.guide.token_weights.INLINE_ROWS", inline_rows)
    V, n = 5, 4
    hmm = random_hmm(3, V, 11)
    dfa = random_letter_dfa(5, V, 12)
    tables = build_tables(hmm, dfa, n, eos_token_id=4)
    g = torch.Generator().manual_seed(0)
    states = [s for s in range(dfa.num_states) for _ in range(2)]
    priors = torch.softmax(torch.randn(len(states), 3, generator=g), -1)
    remaining = [1 + i % n for i in range(len(states))]
    together = tables.log_ratio(states, priors, remaining)
    for i, (s, r) in enumerate(zip(states, remaining)):
        alone = tables.log_ratio([s], priors[i:i + 1], r)[0]
        torch.testing.assert_close(together[i], alone, rtol=1e-5, atol=1e-6)


def test_precision_auto_resolves_to_what_the_hardware_has():
    native = native_bfloat16()
    assert resolve_precision("auto") == ("bfloat16" if native else "float32")
    assert resolve_precision("float32") == "float32"
    with pytest.raises(ConstraintError, match="precision must be one of"):
        resolve_precision("fp8")
    hmm, dfa = random_hmm(2, 4, 0), random_dfa(3, 4, 0)
    assert build_tables(hmm, dfa, 3, precision="auto").precision == resolve_precision("auto")
    assert build_tables(hmm, dfa, 3).precision == "float32"          # the tables' default


def test_the_filter_step_in_bfloat16_stays_within_bfloat16_rounding():
    """HMMFilterPrior(precision="bfloat16"): p·A with bfloat16 inputs, float32 accumulation; a
    distribution close to the float32 step's (relative error of bfloat16 rounding)."""
    from ctrlg.guide.priors import HMMFilterPrior

    hmm = random_hmm(64, 30, 3)
    exact, low = HMMFilterPrior(hmm), HMMFilterPrior(hmm, precision="bfloat16")
    assert low.transition.dtype == torch.bfloat16 and exact.transition.dtype == torch.float32
    p = exact.initial(4)
    tokens = torch.tensor([1, 7, 7, 29])
    want, got = exact.advance(p, tokens), low.advance(p, tokens)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.sum(1), torch.ones(4))
    torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-6)
    assert not torch.equal(got, want)          # the product did run in bfloat16
