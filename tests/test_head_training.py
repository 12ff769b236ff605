"""Prior-head training (ctrlg.hmm.head_training) against brute-force enumeration on a tiny HMM."""

import itertools
import math

import pytest
import torch

from ctrlg import HMM
from ctrlg.hmm.head_training import (feature_positions, log_continuation_likelihoods, log_filtering_priors,
                                     prefix_loglik_table, prior_head_loss, train_prior_head)

H, V, L = 3, 4, 4


def random_hmm(seed=0, h=H, V=V):
    g = torch.Generator().manual_seed(seed)
    return HMM.from_params(*(torch.rand(*shape, generator=g).add(0.05) for shape in ((h,), (h, h), (h, V))),
                           normalize=True)


def joint(hmm, zs, xs):
    """P(z_1..z_n, x_1..x_n) for a path starting from the initial distribution."""
    pi, A, B = hmm.initial.double(), hmm.transition.double(), hmm.emission.double()
    p = pi[zs[0]] * B[zs[0], xs[0]]
    for t in range(1, len(xs)):
        p = p * A[zs[t - 1], zs[t]] * B[zs[t], xs[t]]
    return float(p)


def brute_continuation(hmm, xs, s, z):
    """P(x_s..x_L | z_s = z) (s 0-based) by enumerating the later hidden states."""
    A, B = hmm.transition.double(), hmm.emission.double()
    total = 0.0
    for rest in itertools.product(range(hmm.hidden_size), repeat=len(xs) - s - 1):
        zs = (z,) + rest
        p = B[zs[0], xs[s]]
        for t in range(1, len(zs)):
            p = p * A[zs[t - 1], zs[t]] * B[zs[t], xs[s + t]]
        total += float(p)
    return total


def brute_prefix(hmm, xs):
    if not xs:
        return 1.0
    return sum(joint(hmm, zs, xs) for zs in itertools.product(range(hmm.hidden_size), repeat=len(xs)))


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_equals_enumerated_probability(seed):
    hmm = random_hmm(seed)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=L))[::7])
    log_b = log_continuation_likelihoods(hmm, seqs, batch_size=5)
    q = torch.softmax(torch.randn(len(seqs), L, H, generator=torch.Generator().manual_seed(seed)), -1)
    loss = prior_head_loss(q.log(), log_b)
    for n, xs in enumerate(seqs.tolist()):
        for k in range(L):
            want = sum(float(q[n, k, z]) * brute_continuation(hmm, xs, k, z) for z in range(H))
            assert math.isclose(float(loss[n, k]), -math.log(want), rel_tol=1e-5, abs_tol=1e-5)


def test_filtering_prior_gives_the_conditional_loglik():
    hmm = random_hmm(2)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=L))[::5])
    loss = prior_head_loss(log_filtering_priors(hmm, seqs), log_continuation_likelihoods(hmm, seqs))
    for n, xs in enumerate(seqs.tolist()):
        for k in range(L):
            want = brute_prefix(hmm, xs) / brute_prefix(hmm, xs[:k])  # P(x_{k+1..L} | x_1..x_k)
            assert math.isclose(float(loss[n, k]), -math.log(want), rel_tol=1e-5)
    # k = 0 is the HMM alone
    torch.testing.assert_close(-loss[:, 0], hmm.log_prob(seqs), rtol=1e-5, atol=1e-5)


def test_feature_positions_stop_after_the_first_eos():
    tokens = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [2, 2, 2, 2]])
    assert feature_positions(tokens, [2]).tolist() == [[True, True, False, False], [True] * 4,
                                                        [True, False, False, False]]


def test_head_learns_a_prior_that_depends_on_the_feature():
    """Sequences come from the HMM started in a known state; the feature is that state's one-hot,
    so the head should beat the filtering prior at k = 0 and recover the start state."""
    hmm = HMM.from_params(torch.full((H,), 1 / H), torch.eye(H) * 0.9 + 0.1 / H,
                          torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1]]),
                          normalize=True)
    g = torch.Generator().manual_seed(0)
    N = 600
    start = torch.randint(0, H, (N,), generator=g)
    tokens = torch.empty(N, L, dtype=torch.long)
    z = start.clone()
    for t in range(L):
        tokens[:, t] = torch.multinomial(hmm.emission[z], 1, generator=g)[:, 0]
        z = torch.multinomial(hmm.transition[z], 1, generator=g)[:, 0]
    features = torch.zeros(N, L, 5)
    features[torch.arange(N), 0, start] = 1.0
    features[:, 1:, 3] = 1.0  # uninformative later features
    head, history = train_prior_head(hmm, features, tokens, eos_token_ids=[V + 10], inner_size=8,
                                     epochs=60, patience=60, lr=3e-2, batch_size=256, seed=0)
    assert history["valid_loss"][history["best_epoch"]] == min(history["valid_loss"])
    assert min(history["valid_loss"]) < history["valid_loss_initial"]
    q0 = head(torch.eye(5)[:3]).exp()
    assert (q0.argmax(-1) == torch.arange(3)).all()
    table = prefix_loglik_table(hmm, head, tokens, features, torch.zeros(N, L), torch.full((V,), -math.log(V)),
                                eos_token_ids=[V + 10], prefix_lengths=(0, 2))
    row0 = table[0]
    assert row0["sequences"] == N and row0["tokens"] == N * L
    assert row0["per_token"]["hmm_head"] > row0["per_token"]["hmm"]
    assert row0["per_token"]["hmm"] == pytest.approx(float(hmm.log_prob(tokens).double().mean()) / L, rel=1e-5)
    assert row0["per_token"]["unigram"] == pytest.approx(-math.log(V))
