"""Shared test helpers: random HMMs and DFAs, EOS trimming. Import as ``from helpers import ...``
(the tests folder is on ``sys.path`` under pytest's rootdir import mode)."""

import numpy as np
import torch

from ctrlg import HMM
from ctrlg.dfa.core import TokenDFA


def random_hmm(h, V, seed, concentration=1.0):
    g = torch.Generator().manual_seed(seed)
    dist = lambda *shape: torch._standard_gamma(torch.full(shape, concentration, dtype=torch.float64),  # noqa: E731
                                                generator=g)
    pi, A, B = dist(h), dist(h, h), dist(h, V)
    return HMM.from_params(pi, A, B, normalize=True)


def random_dfa(S, V, seed):
    rng = np.random.default_rng(seed)
    table = rng.integers(0, S, size=(S, V))
    accepting = rng.random(S) < 0.4
    accepting[rng.integers(S)] = True
    return TokenDFA.from_dense(table, accepting, initial=0)


def random_letter_dfa(S, V, seed):
    """A random DFA stored over letters (token classes): tokens of a letter behave alike."""
    rng = np.random.default_rng(seed)
    letter_of_token = rng.integers(0, 3, size=V)
    letter_of_token[:3] = [0, 1, 2]
    A = 3
    table = rng.integers(0, S, size=(S, A))
    accepting = rng.random(S) < 0.4
    accepting[rng.integers(S)] = True
    default = table[:, 0].copy()
    ptr, exc, nxt = [0], [], []
    for s in range(S):
        for a in range(A):
            if table[s, a] != default[s]:
                exc.append(a)
                nxt.append(table[s, a])
        ptr.append(len(exc))
    dfa = TokenDFA(V, 0, accepting, default, ptr, exc, nxt, letter_of_token=letter_of_token)
    assert dfa.has_letters and np.array_equal(dfa.dense(), table[:, letter_of_token])
    return dfa
