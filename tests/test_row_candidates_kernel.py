"""The compiled row passes of the kept-entries lookahead (ctrlg.kernels.row_candidates_cpu)
against torch: the top m per row against torch.topk, the entries above a floor against a
comparison over the whole row, on random scores with −inf, ties and rows shorter than a block."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ctrlg.kernels import row_candidates_cpu as kernel


def _scores(seed: int, R: int, V: int, ties: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(R, V, generator=gen) * 4
    if ties:
        scores = scores.round()                      # many equal values
    scores[torch.rand(R, V, generator=gen) < 0.3] = -math.inf
    return scores.contiguous()


def test_the_loops_are_compiled():
    assert kernel.compiled()                         # numba is a dependency


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), R=st.integers(1, 6), V=st.integers(1, 300),
       m=st.integers(1, 12), ties=st.booleans())
def test_top_per_row_equals_torch_topk(seed, R, V, m, ties):
    scores = _scores(seed, R, V, ties)
    m = min(m, V)
    rows = np.arange(R)[::-1].copy()                # any order, as listed
    values, index = kernel.top_per_row(scores, rows, m)
    expected, _ = torch.topk(scores[torch.as_tensor(rows)], m)
    assert torch.equal(values, expected)             # the same values, decreasing
    picked = scores[torch.as_tensor(rows)[:, None], index]
    assert torch.equal(picked, values)               # the columns hold them
    assert all(len(set(r)) == m for r in index.tolist())   # distinct columns


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), R=st.integers(1, 6), V=st.integers(1, 300),
       cap=st.integers(1, 300), ties=st.booleans())
def test_at_least_per_row_equals_a_full_comparison(seed, R, V, cap, ties):
    scores = _scores(seed, R, V, ties)
    rows = np.array([r for r in range(R) if r % 2 == 0] + [r for r in range(R) if r % 2])
    floor = np.random.default_rng(seed).normal(size=len(rows)) * 4
    floor[0] = -math.inf                             # every finite entry and −inf itself
    at, columns, counts = kernel.at_least_per_row(scores, rows, floor, cap)
    hit = scores[torch.as_tensor(rows)] >= torch.as_tensor(floor, dtype=torch.float32)[:, None]
    assert counts.tolist() == hit.sum(1).tolist()
    r, v = hit.nonzero(as_tuple=True)
    keep = (counts[r.numpy()] <= cap)
    assert at.tolist() == r.numpy()[keep].tolist() and columns.tolist() == v.numpy()[keep].tolist()


@pytest.mark.parametrize("make", [lambda s: s.double(), lambda s: s.t().contiguous().t()])
def test_other_layouts_fall_back_to_torch(make):
    scores = _scores(0, 4, 200, False)
    other = make(scores)
    values, index = kernel.top_per_row(other, np.arange(4), 5)
    assert torch.equal(values.float(), torch.topk(scores, 5).values)
    at, columns, counts = kernel.at_least_per_row(other, np.arange(4), np.zeros(4), 1000)
    assert counts.tolist() == (scores >= 0).sum(1).tolist()
