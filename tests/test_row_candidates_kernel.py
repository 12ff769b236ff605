"""The compiled loops of the kept-entries lookahead against torch: the top m per row against
torch.topk and the entries above a floor against a comparison over the whole row
(ctrlg.kernels.row_candidates_cpu; random scores with −inf, ties and rows shorter than a block),
and the entries' dot products against float64 products (ctrlg.kernels.entry_dots_cpu)."""

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


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), R=st.integers(1, 5), V=st.integers(1, 300), ties=st.booleans())
def test_block_maxima_are_each_blocks_maximum(seed, R, V, ties):
    scores = _scores(seed, R, V, ties)
    got = kernel.block_maxima(scores)
    width = kernel.BLOCK
    expected = [[max(row[b:b + width]) for b in range(0, V, width)] for row in scores.tolist()]
    assert got.tolist() == expected                  # the short last block included


def test_a_shared_block_maxima_of_the_wrong_shape_is_refused():
    scores = _scores(0, 3, 200, False)
    with pytest.raises(ValueError, match="block_max has shape"):
        kernel.top_per_row(scores, np.arange(3), 4, block_max=kernel.block_maxima(scores[:2]))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), R=st.integers(1, 6), V=st.integers(1, 300),
       m=st.integers(1, 12), ties=st.booleans())
def test_top_per_row_equals_torch_topk(seed, R, V, m, ties):
    scores = _scores(seed, R, V, ties)
    m = min(m, V)
    rows = np.arange(R)[::-1].copy()                # any order, as listed
    shared = kernel.block_maxima(scores) if seed % 2 else None     # given, or computed inside
    values, index = kernel.top_per_row(scores, rows, m, block_max=shared)
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
    shared = kernel.block_maxima(scores) if seed % 2 else None
    at, columns, counts = kernel.at_least_per_row(scores, rows, floor, cap, block_max=shared)
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


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), h=st.integers(1, 70), K=st.integers(0, 30))
def test_entry_dots_equal_the_torch_products(seed, h, K):
    from ctrlg.kernels.entry_dots_cpu import entry_dots

    gen = torch.Generator().manual_seed(seed)
    priors = torch.rand(5, h, generator=gen).softmax(1)
    emission_t = torch.rand(40, h, generator=gen)
    tables = torch.rand(12, h, generator=gen)
    tables[3] = 0.0                                  # a dead successor: exact zeros
    rng = np.random.default_rng(seed)
    rows, tokens, table_rows = rng.integers(0, 5, K), rng.integers(0, 40, K), rng.integers(0, 12, K)
    joint, marginal = entry_dots(priors, emission_t, tables, rows, tokens, table_rows)
    q = priors.double()[rows] * emission_t.double()[tokens]
    torch.testing.assert_close(marginal, q.sum(1), rtol=1e-6, atol=0.0)
    torch.testing.assert_close(joint, (q * tables.double()[table_rows]).sum(1), rtol=1e-6, atol=0.0)
    assert bool((joint[torch.as_tensor(table_rows == 3)] == 0).all())
    slow = entry_dots(priors.double().float().t().contiguous().t(), emission_t, tables,
                      rows, tokens, table_rows)     # a non-contiguous operand: the torch form
    torch.testing.assert_close(slow[0], joint, rtol=1e-6, atol=0.0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), h=st.integers(1, 70), K=st.integers(0, 30))
def test_triple_dots_equal_the_float64_products(seed, h, K):
    from ctrlg.kernels.entry_dots_cpu import triple_dots

    gen = torch.Generator().manual_seed(seed)
    a, b, c = (torch.rand(n, h, generator=gen) for n in (5, 9, 7))
    rng = np.random.default_rng(seed)
    ia, ib, ic = rng.integers(0, 5, K), rng.integers(0, 9, K), rng.integers(0, 7, K)
    expected = (a.double()[ia] * b.double()[ib] * c.double()[ic]).sum(1)
    torch.testing.assert_close(triple_dots(a, b, c, ia, ib, ic), expected, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(triple_dots(a.double(), b, c, ia, ib, ic), expected,
                               rtol=1e-6, atol=0.0)           # another dtype: the torch form
