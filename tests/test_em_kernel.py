"""The Triton E-step kernels equal the plain-torch reference (TRITON_INTERPRET=1 on CPU)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402

pytest.importorskip("triton")

import torch  # noqa: E402

from ctrlg import HMM  # noqa: E402
from ctrlg.hmm.em import baum_welch, estep_torch  # noqa: E402
from ctrlg.kernels.em_estep import estep_triton, triton_available  # noqa: E402


def random_params(h, V, seed):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.rand(*shape, generator=g).add(0.01)  # noqa: E731
    hmm = HMM.from_params(make(h), make(h, h), make(h, V), normalize=True)
    return hmm.initial, hmm.transition, hmm.emission


def test_interpreter_is_active():
    assert triton_available("cpu")


@pytest.mark.parametrize("h, V, n, L", [(16, 11, 4, 5), (5, 7, 3, 4), (3, 5, 1, 1), (12, 9, 2, 3)])
def test_triton_estep_equals_torch(h, V, n, L):
    initial, transition, emission = random_params(h, V, seed=h + n + L)
    tokens = torch.randint(0, V, (n, L), generator=torch.Generator().manual_seed(L))
    want = estep_torch(initial, transition, emission, tokens)
    got = estep_triton(initial, transition, emission, tokens)
    for name in ("initial", "transition", "emission", "loglik", "sequences", "tokens"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-5, rtol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_triton_backend_in_baum_welch_matches_torch():
    initial, transition, emission = random_params(4, 6, seed=0)
    hmm = HMM.from_params(initial, transition, emission)
    data = hmm.sample(4, 3, seed=1)
    a, _ = baum_welch(hmm, data, schedule=[(2, 1)], pseudocount=0.1, backend="torch")
    b, _ = baum_welch(hmm, data, schedule=[(2, 1)], pseudocount=0.1, backend="triton")
    torch.testing.assert_close(a.emission, b.emission, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.transition, b.transition, atol=1e-5, rtol=1e-5)
