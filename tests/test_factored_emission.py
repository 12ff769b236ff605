"""The guide's product x · B over the support plus a rank-1 tail (ctrlg.guide.factored_emission)
equals the dense product, is found from the emission's values alone, and the guidance built on
it equals brute-force enumeration."""

import pytest
import torch

from ctrlg import HMM
from ctrlg.guide import build_tables
from ctrlg.guide.factored_emission import FactoredProduct, emission_product, rank_one_tail
from ctrlg.hmm.quantize import dequantize_emission, quantize_emission
from ctrlg.kernels.packed_linear import PackedLinear, native_bfloat16
from helpers import random_dfa, random_hmm
from test_guide import CASES, _check_against_brute_force


def _peaked_emission(h, V, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(3.0 * torch.randn(h, V, generator=g, dtype=torch.float64), 1)


def test_a_topk_emission_factors_over_the_union_of_its_kept_tokens():
    B = _peaked_emission(16, 400, 0)
    codes = quantize_emission(B, "topk8-8")
    Bt = dequantize_emission(codes, "topk8-8").float().T.contiguous()
    kept = torch.unique(codes["emission_topk_index"].long() & 0xFFFF)
    tail = rank_one_tail(Bt)
    assert tail is not None
    assert torch.equal(tail.support, kept)                   # exactly the tokens some row keeps
    assert float(tail.weight[kept].abs().max()) == 0.0
    outside = torch.ones(400, dtype=torch.bool)
    outside[kept] = False
    torch.testing.assert_close(Bt[outside], tail.weight[outside, None] * tail.profile[None, :],
                               rtol=1e-6, atol=0)
    product = emission_product(Bt, Bt)
    assert isinstance(product, FactoredProduct)
    x = torch.rand(7, 16, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(product(x), x @ Bt.T, rtol=1e-5, atol=0)


@pytest.mark.skipif(not native_bfloat16(), reason="bfloat16 products need a CPU that has them")
def test_the_factored_product_in_bfloat16_is_within_bfloat16_rounding():
    codes = quantize_emission(_peaked_emission(16, 400, 2), "topk8-8")
    Bt = dequantize_emission(codes, "topk8-8").float().T.contiguous()
    product = emission_product(Bt.bfloat16(), Bt)
    x = torch.rand(5, 16, generator=torch.Generator().manual_seed(3))
    got = product(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), x @ Bt.T, rtol=2e-2, atol=0)


def test_a_dense_emission_keeps_the_plain_product():
    Bt = random_hmm(4, 50, 0).emission.float().T.contiguous()
    assert rank_one_tail(Bt) is None
    assert isinstance(emission_product(Bt, Bt), PackedLinear)


def test_an_emission_of_one_profile_has_an_empty_support():
    B = torch.outer(torch.tensor([0.2, 0.5, 0.3]), torch.full((8,), 1.0))
    B = B / B.sum(1, keepdim=True)
    Bt = B.T.contiguous()
    product = emission_product(Bt, Bt)
    assert isinstance(product, FactoredProduct) and len(product.support) == 0
    x = torch.rand(4, 3)
    torch.testing.assert_close(product(x), x @ Bt.T, rtol=1e-6, atol=0)


def _tailed_hmm(h, V, seed):
    """A random HMM whose last ⌈V/2⌉ tokens share one emission profile (B[:, v] = c · u_v), so
    the guide takes the factored product."""
    base = random_hmm(h, V, seed)
    B = base.emission.double().clone()
    g = torch.Generator().manual_seed(seed + 1000)
    tail = torch.arange(V // 2, V)
    profile = torch.rand(h, generator=g, dtype=torch.float64) + 0.1
    B[:, tail] = profile[:, None] * (torch.rand(len(tail), generator=g, dtype=torch.float64) + 0.1)
    return HMM.from_params(base.initial, base.transition, B, normalize=True)


@pytest.mark.parametrize("S,V,h,n,m,eos,suffix,seed", CASES)
def test_guidance_with_a_factored_emission_equals_brute_force(S, V, h, n, m, eos, suffix, seed):
    hmm = _tailed_hmm(h, V, seed)
    assert isinstance(build_tables(hmm, random_dfa(2, V, 0), 2)._emission_product, FactoredProduct)
    _check_against_brute_force(S, V, h, n, m, eos, suffix, seed, hmm=hmm)

