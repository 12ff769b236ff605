"""The fast-forward sampler draws exactly the guided distribution of token-by-token decoding (by
enumeration and a chi-square test), sums the right LM log-likelihood, and keeps every row's
KV cache straight when rows feed chunks of different lengths."""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from ctrlg import dfa
from ctrlg.errors import ConstraintError
from ctrlg.fast_forward import build_guide, sample_fast_forward
from ctrlg.guide.guidance import guided_log_probs
from helpers import random_hmm, tiny_llama

V, EOS = 6, 5


def constraint():
    """[2 3] · ([1] | [4 4] | [4 1 0]) · [2] · ([0] | [3 3 3 3 3 3 3 3 3 3]) · EOS: forced runs of
    different lengths after choices, so rows feed ragged chunks."""
    middle = dfa.union(dfa.exact([1], V), dfa.exact([4, 4], V), dfa.exact([4, 1, 0], V))
    tail = dfa.union(dfa.exact([0], V), dfa.exact([3] * 10, V))
    return dfa.concat(dfa.exact([2, 3], V), middle, dfa.exact([2], V), tail, dfa.exact([EOS], V))


def accepted(d, n):
    """Every accepted token sequence of at most ``n`` tokens that ends at its only EOS, by
    depth-first search over the DFA's transitions (``d.step`` on every token), pruning states
    from which no accepting state is reachable (a fixed point over the same transitions)."""
    live = set(np.flatnonzero(d.accepting).tolist())
    while True:
        grown = live | {s for s in range(d.num_states) if any(d.step(s, a) in live for a in range(V))}
        if grown == live:
            break
        live = grown
    out = []

    def walk(state, prefix):
        if prefix and prefix[-1] == EOS:
            if d.accepting[state]:
                out.append(tuple(prefix))
            return
        if len(prefix) == n:
            return
        for a in range(V):
            nxt = d.step(state, a)
            if nxt in live:
                walk(nxt, prefix + [a])

    walk(d.initial, [])
    return out


@torch.no_grad()
def exact_probability(model, prompt, y, table, hmm, n, temperature):
    """The token-by-token guided probability of ``y`` (the reference distribution)."""
    ids = list(prompt)
    state, prior = table.dfa.initial, table.initial_prior(1) if hmm is not None else None
    total = 0.0
    for t, token in enumerate(y):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1, :V].float()
        scores = torch.log_softmax(logits, -1)[None] / temperature
        dist = torch.log_softmax(guided_log_probs(scores, [table], np.zeros(1, dtype=np.int64),
                                                  np.array([state]), prior, n - t, 1.0)[0].double(), -1)
        total += float(dist[token])
        ids.append(token)
        state = table.dfa.step(state, token)
        if prior is not None:
            prior = table.advance(prior, torch.tensor([token]))
    return math.exp(total)


@pytest.mark.parametrize("guided, temperature", [(True, 1.0), (False, 1.0), (True, 0.7)])
def test_samples_follow_the_token_by_token_guided_distribution(guided, temperature):
    model = tiny_llama(V, seed=3, hidden=16)
    hmm = random_hmm(3, V, 4) if guided else None
    d = constraint()
    n = 18
    table = build_guide(d, n, hmm=hmm, eos_token_id=EOS)
    prompt = [0]
    support = accepted(d, n)
    assert len(support) == 6
    expected = np.array([exact_probability(model, prompt, y, table, hmm, n, temperature)
                         for y in support])
    assert expected.sum() == pytest.approx(1.0, abs=1e-6)
    counts = dict.fromkeys(support, 0)
    draws = 0
    for seed in range(8):
        for s in sample_fast_forward(model, prompt, d, hmm=hmm, num_samples=250, max_new_tokens=n,
                                     eos_token_id=EOS, seed=seed, temperature=temperature,
                                     table=table):
            assert s.accepted
            counts[tuple(s.token_ids)] += 1
            draws += 1
    observed = np.array([counts[y] for y in support])
    assert observed.sum() == draws
    keep = expected * draws >= 5
    chi = stats.chisquare(observed[keep], expected[keep] / expected[keep].sum() * observed[keep].sum())
    assert chi.pvalue > 1e-3, (observed, expected * draws)


@torch.no_grad()
def test_the_log_likelihood_is_log_p_lm_of_the_sample_and_rows_stay_straight():
    model = tiny_llama(V, seed=5, hidden=16)
    d = constraint()
    prompt = [0, 1]
    for seed in range(4):
        for s in sample_fast_forward(model, prompt, d, hmm=random_hmm(3, V, 2), num_samples=7,
                                     max_new_tokens=18, eos_token_id=EOS, seed=seed):
            ids = prompt + s.token_ids
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            logp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])
            assert s.lm_log_likelihood == pytest.approx(float(logp[len(prompt) - 1:].sum()), abs=1e-4)
            assert s.forced >= 4 and s.lm_calls < len(s.token_ids)


def test_bad_arguments_are_refused():
    model = tiny_llama(V, seed=0)
    with pytest.raises(ConstraintError, match="temperature"):
        sample_fast_forward(model, [0], constraint(), max_new_tokens=18, eos_token_id=EOS,
                            temperature=0)
    with pytest.raises(ConstraintError, match="num_samples"):
        sample_fast_forward(model, [0], constraint(), max_new_tokens=18, eos_token_id=EOS,
                            num_samples=0)
    with pytest.raises(ConstraintError, match="prompt"):
        sample_fast_forward(model, [], constraint(), max_new_tokens=18, eos_token_id=EOS)
