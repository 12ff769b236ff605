"""The Triton backward-table kernel equals the plain-torch reference (TRITON_INTERPRET=1 on CPU)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402

pytest.importorskip("triton")

import torch  # noqa: E402

from ctrlg import dfa  # noqa: E402
from ctrlg.guide import backward_step_reference, build_tables  # noqa: E402
from ctrlg.kernels.backward_table import backward_step, triton_available  # noqa: E402
from test_guide import random_dfa, random_hmm  # noqa: E402


def random_step_inputs(S, h, E, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    exc_src = torch.sort(torch.randint(0, S, (E,), generator=g)).values
    inputs = dict(
        w_prev=torch.rand(S, h, generator=g).to(dtype), default=torch.randint(0, S, (S,), generator=g),
        coef_default=torch.rand(S, generator=g), nonexc_mass=torch.rand(S, h, generator=g).to(dtype),
        exc_src=exc_src, exc_dst=torch.randint(0, S, (E,), generator=g),
        exc_emission=torch.rand(E, h, generator=g).to(dtype), coef_exc=torch.rand(E, generator=g),
        eos_term=torch.rand(S, h, generator=g).to(dtype), coef_eos=torch.rand(S, generator=g),
        transition=torch.softmax(torch.randn(h, h, generator=g), -1).to(dtype))
    return inputs


@pytest.mark.parametrize("S,h,E", [(1, 2, 0), (5, 3, 7), (17, 20, 40), (33, 40, 5)])
def test_kernel_equals_reference_across_shapes(S, h, E):
    assert triton_available("cpu")
    inputs = random_step_inputs(S, h, E, seed=S + h + E)
    got = backward_step(**inputs)
    expect = backward_step_reference(**inputs)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_half_inputs_accumulate_in_fp32(dtype):
    inputs = random_step_inputs(9, 24, 12, seed=1, dtype=dtype)
    got = backward_step(**inputs)
    assert got.dtype == torch.float32
    expect = backward_step_reference(**{k: (v.float() if v.is_floating_point() else v)
                                        for k, v in inputs.items()})
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)


def test_tables_built_with_the_kernel_equal_the_reference_tables():
    V = 6
    hmm = random_hmm(4, V, 0)
    constraint = dfa.intersect(dfa.phrase([1, 2], V), random_dfa(3, V, 1), allow_empty=True)
    ref = build_tables(hmm, constraint, 5, eos_token_id=5, use_kernel=False)
    ker = build_tables(hmm, constraint, 5, eos_token_id=5, use_kernel=True)
    torch.testing.assert_close(ker.w_hat, ref.w_hat, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ker.log_scale, ref.log_scale, rtol=1e-9, atol=1e-5)
