"""The Triton backward-table kernel equals the plain-torch reference (TRITON_INTERPRET=1 on CPU).

Triton reads TRITON_INTERPRET when it is first imported, and other test modules may have imported
it already (transformers probes for it), so the checks run in a fresh subprocess; each test then
asserts on its share of the results.
"""

import pytest

from helpers import interpreted_checks

pytest.importorskip("triton")

CASES = [(1, 2, 0), (5, 3, 7), (17, 20, 40), (33, 40, 5)]
DTYPES = ["bfloat16", "float16"]


def random_step_inputs(S, h, E, seed, dtype):
    import torch

    g = torch.Generator().manual_seed(seed)
    exc_src = torch.sort(torch.randint(0, S, (E,), generator=g)).values
    return dict(
        w_prev=torch.rand(S, h, generator=g).to(dtype), default=torch.randint(0, S, (S,), generator=g),
        coef_default=torch.rand(S, generator=g), nonexc_mass=torch.rand(S, h, generator=g).to(dtype),
        exc_src=exc_src, exc_dst=torch.randint(0, S, (E,), generator=g),
        exc_row=torch.randint(0, 7, (E,), generator=g),
        emission_rows=torch.rand(7, h, generator=g).to(dtype), coef_exc=torch.rand(E, generator=g),
        eos_term=torch.rand(S, h, generator=g).to(dtype), coef_eos=torch.rand(S, generator=g),
        transition=torch.softmax(torch.randn(h, h, generator=g), -1).to(dtype))


def formula_step(w_prev, default, coef_default, nonexc_mass, exc_src, exc_dst, exc_row,
                 emission_rows, coef_exc, eos_term, coef_eos, transition):
    """G · Aᵀ written out entry by entry in float64 (the kernel module's docstring)."""
    import torch

    S, h = w_prev.shape
    d = lambda t: t.double()  # noqa: E731
    G = torch.zeros(S, h, dtype=torch.float64)
    for s in range(S):
        for z in range(h):
            g = d(coef_default)[s] * d(w_prev)[default[s], z] * d(nonexc_mass)[s, z]
            for k in range(len(exc_src)):
                if exc_src[k] == s:
                    g += d(coef_exc)[k] * d(emission_rows)[exc_row[k], z] * d(w_prev)[exc_dst[k], z]
            G[s, z] = g + d(coef_eos)[s] * d(eos_term)[s, z]
    return G @ d(transition).T


def run_all_checks() -> dict:
    """Runs inside the TRITON_INTERPRET=1 subprocess; returns {check: max abs/rel error info}."""
    import torch

    from ctrlg import dfa
    from ctrlg.guide import backward_step_reference, build_tables
    from ctrlg.kernels.backward_table import backward_step, triton_available
    import ctrlg.kernels.backward_table as kernel_module
    from helpers import random_dfa, random_hmm

    def close(a, b, rtol, atol):
        return bool(torch.allclose(a, b, rtol=rtol, atol=atol)), float((a - b).abs().max()) if a.numel() else 0.0

    out = {"interpreted": triton_available("cpu")}
    inputs = random_step_inputs(5, 3, 7, 99, torch.float32)
    out["reference-vs-formula"] = close(backward_step_reference(**inputs).double(),
                                        formula_step(**inputs), 1e-5, 1e-6)

    def no_fallback(*args, **kwargs):
        raise AssertionError("the kernel fell back to the torch reference")

    saved, kernel_module.backward_step_reference = kernel_module.backward_step_reference, no_fallback
    try:  # the kernel itself runs (no silent fallback) and gives the formula's values
        out["kernel-vs-formula"] = close(backward_step(**inputs).double(), formula_step(**inputs),
                                         1e-5, 1e-6)
    finally:
        kernel_module.backward_step_reference = saved
    for S, h, E in CASES:
        inputs = random_step_inputs(S, h, E, S + h + E, torch.float32)
        out[f"shape-{S}-{h}-{E}"] = close(backward_step(**inputs), backward_step_reference(**inputs),
                                          1e-5, 1e-6)
    for name in DTYPES:
        inputs = random_step_inputs(9, 24, 12, 1, getattr(torch, name))
        got = backward_step(**inputs)
        ref = backward_step_reference(**{k: (v.float() if v.is_floating_point() else v)
                                         for k, v in inputs.items()})
        out[f"dtype-{name}"] = close(got, ref, 1e-5, 1e-6) + (str(got.dtype),)
    V = 6
    hmm = random_hmm(4, V, 0)
    constraint = dfa.intersect(dfa.phrase([1, 2], V), random_dfa(3, V, 1), allow_empty=True)
    ref = build_tables(hmm, constraint, 5, eos_token_id=5, use_kernel=False)
    ker = build_tables(hmm, constraint, 5, eos_token_id=5, use_kernel=True)
    out["tables-w"] = close(ker.w_hat, ref.w_hat, 1e-5, 1e-6)
    out["tables-scale"] = close(torch.nan_to_num(ker.log_scale, neginf=-1e300),
                                torch.nan_to_num(ref.log_scale, neginf=-1e300), 1e-9, 1e-5)
    return out


@pytest.fixture(scope="module")
def results():
    return interpreted_checks("test_kernel_backward")


def test_runs_under_the_triton_interpreter(results):
    assert results["interpreted"]
    ok, err = results["kernel-vs-formula"]
    assert ok, f"max abs error {err} against the entry-by-entry formula"


def test_reference_equals_the_formula(results):
    ok, err = results["reference-vs-formula"]
    assert ok, f"max abs error {err}"


@pytest.mark.parametrize("S,h,E", CASES)
def test_kernel_equals_reference_across_shapes(results, S, h, E):
    ok, err = results[f"shape-{S}-{h}-{E}"]
    assert ok, f"max abs error {err}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_half_inputs_accumulate_in_fp32(results, dtype):
    ok, err, out_dtype = results[f"dtype-{dtype}"]
    assert ok and out_dtype == "torch.float32", (err, out_dtype)


def test_tables_built_with_the_kernel_equal_the_reference_tables(results):
    assert results["tables-w"][0], results["tables-w"]
    assert results["tables-scale"][0], results["tables-scale"]
