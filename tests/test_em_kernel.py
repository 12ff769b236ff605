"""The Triton E-step kernels equal the plain-torch reference (TRITON_INTERPRET=1 on CPU).

Triton reads TRITON_INTERPRET when it is first imported, and other test modules may have imported
it already in the same process (transformers probes for it; the guide imports the kernels), so
the checks run in a fresh subprocess with the interpreter on; each test asserts on its share of
the results (as tests/test_kernel_backward.py does).
"""


import pytest

from helpers import interpreted_checks

pytest.importorskip("triton")

CASES = [(16, 11, 4, 5), (5, 7, 3, 4), (3, 5, 1, 1), (12, 9, 2, 3)]
FIELDS = ("initial", "transition", "emission", "loglik", "sequences", "tokens")


def random_params(h, V, seed):
    import torch

    from ctrlg import HMM

    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.rand(*shape, generator=g).add(0.01)  # noqa: E731
    hmm = HMM.from_params(make(h), make(h, h), make(h, V), normalize=True)
    return hmm.initial, hmm.transition, hmm.emission


def _max_error(got, want) -> float:
    import torch

    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    scale = want.abs().clamp_min(1.0)
    return float(((got - want).abs() / scale).max()) if want.numel() else 0.0


def run_all_checks() -> dict:
    """Runs inside the TRITON_INTERPRET=1 subprocess; returns {check: max relative error}."""
    import torch

    from ctrlg import HMM
    from ctrlg.hmm.em import baum_welch, estep_torch
    from ctrlg.kernels.em_estep import estep_triton, triton_available

    out = {"interpreted": bool(triton_available("cpu"))}
    for h, V, n, L in CASES:
        initial, transition, emission = random_params(h, V, seed=h + n + L)
        tokens = torch.randint(0, V, (n, L), generator=torch.Generator().manual_seed(L))
        want = estep_torch(initial, transition, emission, tokens)
        got = estep_triton(initial, transition, emission, tokens)
        out[f"estep-{h}-{V}-{n}-{L}"] = {name: _max_error(getattr(got, name), getattr(want, name))
                                         for name in FIELDS}
    initial, transition, emission = random_params(4, 6, seed=0)
    hmm = HMM.from_params(initial, transition, emission)
    data = hmm.sample(4, 3, seed=1)
    a, _ = baum_welch(hmm, data, schedule=[(2, 1)], pseudocount=0.1, backend="torch")
    b, _ = baum_welch(hmm, data, schedule=[(2, 1)], pseudocount=0.1, backend="triton")
    out["baum-welch"] = {"emission": _max_error(b.emission, a.emission),
                         "transition": _max_error(b.transition, a.transition)}
    return out


@pytest.fixture(scope="module")
def results():
    return interpreted_checks("test_em_kernel")


def test_interpreter_is_active(results):
    assert results["interpreted"]


@pytest.mark.parametrize("h, V, n, L", CASES)
def test_triton_estep_equals_torch(results, h, V, n, L):
    errors = results[f"estep-{h}-{V}-{n}-{L}"]
    assert set(errors) == set(FIELDS)
    for name, error in errors.items():
        assert error <= 1e-5, f"{name}: max relative error {error}"


def test_triton_backend_in_baum_welch_matches_torch(results):
    for name, error in results["baum-welch"].items():
        assert error <= 1e-5, f"{name}: max relative error {error}"
