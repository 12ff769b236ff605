"""The guide tables' CPU recurrence (compiled loops, exceptions grouped by (source, successor)
pair) against the torch recurrence it replaces on the CPU, and the emission sums it reads
against brute force."""

import math

import numpy as np
import pytest
import torch

import ctrlg.guide.tables as guide_tables
from ctrlg.guide.tables import GuideTables, grouped_sums, letter_emission_sums
from ctrlg.kernels.backward_table_cpu import compiled
from helpers import random_dfa, random_hmm, random_letter_dfa

pytestmark = pytest.mark.skipif(not compiled(), reason="numba is a dependency")

CASES = [dict(eos_token_id=[19]), dict(eos_token_id=[19], min_new_tokens=3),
         dict(eos_token_id=[18, 19], suffix_ids=[3, 4]), dict(), dict(reachable_only=False)]


def _both(monkeypatch, dfa, hmm, n, **kwargs) -> tuple[GuideTables, GuideTables]:
    fast = GuideTables(dfa, hmm, n, precision="float32", **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(guide_tables, "compiled", lambda: False)   # the torch recurrence
        slow = GuideTables(dfa, hmm, n, precision="float32", **kwargs)
    return fast, slow


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("letters", [False, True])
def test_compiled_recurrence_equals_the_torch_recurrence(monkeypatch, seed, case, letters):
    """The same Ŵ bit for bit and the same scales up to float64 exp/log rounding, on random
    DFAs (over tokens or letters) with EOS, min_new_tokens, insertion suffixes and the band."""
    hmm = random_hmm(8, 20, seed)
    dfa = (random_letter_dfa if letters else random_dfa)(9, 20, seed)
    fast, slow = _both(monkeypatch, dfa, hmm, 6, **CASES[case])
    assert torch.equal(fast.w_hat, slow.w_hat)
    finite = torch.isfinite(slow.log_scale)
    assert torch.equal(torch.isfinite(fast.log_scale), finite)
    torch.testing.assert_close(fast.log_scale[finite], slow.log_scale[finite], rtol=0, atol=1e-12)


def test_compiled_recurrence_keeps_underflowed_feasible_rows_alive(monkeypatch):
    """A feasible state whose weight underflows in float32 gets the over-estimate (Ŵ = 1, scale
    m + log tiny) in both recurrences, never an exact 0."""
    hmm = random_hmm(4, 6, 3, concentration=0.001)       # near-zero emissions
    dfa = random_dfa(5, 6, 3)
    fast, slow = _both(monkeypatch, dfa, hmm, 30, eos_token_id=[5])
    assert torch.equal(fast.w_hat, slow.w_hat)
    assert torch.equal(fast.log_scale, slow.log_scale)
    tiny = math.log(torch.finfo(torch.float32).tiny)
    assert bool((fast.log_scale <= tiny + 1e-9).any())       # the underflow branch ran
    live = torch.as_tensor(fast.band)
    assert bool((fast.w_hat.amax(-1) > 0)[live].all())


def test_grouped_sums_equal_brute_force():
    rng = np.random.default_rng(0)
    rows = torch.rand(30, 5, dtype=torch.float64)
    group, member = rng.integers(0, 7, 50), rng.integers(0, 30, 50)
    want = torch.zeros(7, 5, dtype=torch.float64)
    for g, m in zip(group, member):
        want[g] += rows[m]
    torch.testing.assert_close(grouped_sums(group, member, rows, 7), want)
    assert grouped_sums(group[:0], member[:0], rows, 3).abs().sum() == 0


@pytest.mark.parametrize("eos", [[], [4], [4, 11]])
def test_letter_emission_sums_equal_brute_force(eos):
    """B̄[:, a] = Σ_{v ∈ a, v ∉ EOS} B[:, v]; the largest letter by complement, clamped at 0."""
    rng = np.random.default_rng(1)
    V, h, A = 40, 6, 5
    letter_of = rng.integers(0, A, V)
    letter_of[:12] = 0                                          # letter 0 is the largest
    order = np.argsort(letter_of, kind="stable")
    ptr = np.concatenate([[0], np.cumsum(np.bincount(letter_of, minlength=A))])
    B = torch.rand(h, V, dtype=torch.float64) ** 3
    got = letter_emission_sums(B.T.float().contiguous(), B.sum(1), ptr, order, eos)
    for a in range(A):
        tokens = [v for v in range(V) if letter_of[v] == a and v not in eos]
        want = B[:, tokens].sum(1)
        torch.testing.assert_close(got[a], want, rtol=1e-6, atol=1e-6)
    assert bool((got >= 0).all())


def test_pairs_with_the_same_letters_share_one_emission_row():
    """Ē is stored once per distinct letter set: two pairs share a row exactly when their
    exceptions carry the same letters, and every row is used."""
    hmm = random_hmm(4, 20, 5)
    for seed in range(4):
        dfa = random_letter_dfa(9, 20, seed)
        tables = GuideTables(dfa, hmm, 3, precision="float32", eos_token_id=[19])
        src, dst = tables._pair_src_t.numpy(), tables._pair_dst_t.numpy()
        letters = [frozenset(tables.exc.tok[(tables.exc.src == s) & (tables.exc.dst == t)].tolist())
                   for s, t in zip(src, dst)]
        row = tables._pair_row
        assert sorted(set(row.tolist())) == list(range(len(tables._pair_emission)))
        for a in range(len(row)):
            for b in range(len(row)):
                assert (row[a] == row[b]) == (letters[a] == letters[b])


def test_pairs_group_exceptions_by_source_and_successor():
    """Ē_{s,t} sums the letters of s that lead to t; every exception lands in its pair."""
    hmm = random_hmm(4, 20, 5)
    dfa = random_letter_dfa(7, 20, 5)
    tables = GuideTables(dfa, hmm, 3, precision="float32", eos_token_id=[19])
    src, dst = tables._pair_src_t.numpy(), tables._pair_dst_t.numpy()
    assert np.all(np.diff(src) >= 0)
    for p, (s, t) in enumerate(zip(src, dst)):
        k = np.flatnonzero((tables.exc.src == s) & (tables.exc.dst == t))
        assert len(k)
        want = tables._emission_rows[torch.as_tensor(tables.exc.tok[k])].double().sum(0)
        torch.testing.assert_close(tables._pair_emission[tables._pair_row[p]].double(), want,
                                   rtol=1e-6, atol=1e-7)
    assert len(src) == len({(int(s), int(t)) for s, t in zip(tables.exc.src, tables.exc.dst)})
    assert math.isfinite(tables.log_prob_accept())


def test_both_recurrences_keep_scales_far_below_float64s_range(monkeypatch):
    """Rows whose every completion has log probability below −709 (400 forced tokens before
    EOS): the torch recurrence must not read e^{eos_log − m} = inf at rows where EOS is not
    live (0 · inf is nan, and the row fell to the underflow over-estimate)."""
    from ctrlg import dfa as dfa_module

    tokens = [b"a", b"b", b"c", b"\x00"]
    constraint = dfa_module.regex(r"(a|b)c{400}", tokens, eos_token_id=3)
    hmm = random_hmm(3, len(tokens), 4)
    fast, slow = _both(monkeypatch, constraint, hmm, 410, eos_token_id=[3])
    assert float(fast.log_scale[fast.log_scale > -math.inf].min()) < -709
    torch.testing.assert_close(fast.w_hat, slow.w_hat, rtol=1e-5, atol=1e-6)
    finite = torch.isfinite(slow.log_scale)
    assert torch.equal(torch.isfinite(fast.log_scale), finite)
    torch.testing.assert_close(fast.log_scale[finite], slow.log_scale[finite], rtol=1e-9,
                               atol=1e-6)
