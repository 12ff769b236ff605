"""benchmarks.bench_beam_breakdown's lifted HMM (the cost of a larger HMM on the same
distribution): every sequence keeps its probability, checked by enumeration."""

import itertools

import torch

from benchmarks.bench_beam_breakdown import lifted_hmm
from helpers import random_hmm


def test_a_lifted_hmm_gives_every_sequence_the_same_probability():
    hmm = random_hmm(3, 4, seed=0)
    lifted = lifted_hmm(hmm, 4)
    assert lifted.hidden_size == 12 and lifted.vocab_size == 4
    assert lifted_hmm(hmm, 1) is hmm
    sequences = torch.tensor(list(itertools.product(range(4), repeat=3)))
    torch.testing.assert_close(lifted.log_prob(sequences), hmm.log_prob(sequences),
                               rtol=0.0, atol=1e-5)
    assert abs(float(hmm.log_prob(sequences).double().exp().sum()) - 1.0) < 1e-5   # all of them
