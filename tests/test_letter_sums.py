"""The shared sums of large letters (ctrlg.guide.letter_sums) against direct float64 sums."""

import numpy as np
import torch

from ctrlg.guide.letter_sums import LargeLetterSums
from ctrlg.guide.tables import letter_emission_sums


def _brute(emission_t, members):
    return emission_t.double()[torch.as_tensor(np.asarray(members, dtype=np.int64))].sum(0)


def test_near_sets_come_from_a_kept_sum_and_far_sets_are_summed_and_kept():
    rng = np.random.default_rng(0)
    V, h = 500, 7
    emission_t = torch.rand(V, h) ** 3
    store = LargeLetterSums(emission_t, capacity=2, max_difference=0.25)
    base = rng.choice(V, 200, replace=False)
    torch.testing.assert_close(store.sum(base), _brute(emission_t, base), rtol=1e-12, atol=1e-12)
    assert len(store._kept) == 1
    near = np.concatenate([rng.permutation(base)[:190], np.setdiff1d(np.arange(V), base)[:20]])
    torch.testing.assert_close(store.sum(near), _brute(emission_t, near), rtol=1e-12, atol=1e-12)
    assert len(store._kept) == 1                    # a difference from the kept set
    far = np.setdiff1d(np.arange(V), base)[:200]
    torch.testing.assert_close(store.sum(far), _brute(emission_t, far), rtol=1e-12, atol=1e-12)
    assert len(store._kept) == 2
    third = np.arange(0, V, 2)[:200]
    store.sum(third)
    assert len(store._kept) == 2                    # capacity: the least recently used is dropped
    assert any(np.array_equal(k, np.sort(third)) for k, _ in store._kept)
    assert store.sum(np.array([], dtype=np.int64)).abs().sum() == 0


def test_letter_sums_with_the_store_equal_brute_force(monkeypatch):
    """B̄[:, a] with large letters through the store (a threshold of 10 members here), over several
    tables whose large letters overlap, EOS excluded, the largest letter by complement."""
    import ctrlg.guide.tables as tables_module

    monkeypatch.setattr(tables_module, "LARGE_LETTER", 10)
    rng = np.random.default_rng(2)
    V, h, A = 120, 5, 6
    B = torch.rand(h, V, dtype=torch.float64) ** 3
    emission_t = B.T.float().contiguous()
    store = LargeLetterSums(emission_t)
    base = rng.integers(0, A, V)
    for table in range(4):
        letter_of = base.copy()
        flip = rng.choice(V, 5, replace=False)
        letter_of[flip] = rng.integers(0, A, 5)
        letter_of[:40] = 0                                       # letter 0 is the largest
        order = np.argsort(letter_of, kind="stable")
        ptr = np.concatenate([[0], np.cumsum(np.bincount(letter_of, minlength=A))])
        eos = [int(order[-1])]
        got = letter_emission_sums(emission_t, B.sum(1), ptr, order, eos, store)
        for a in range(A):
            tokens = [v for v in range(V) if letter_of[v] == a and v not in eos]
            torch.testing.assert_close(got[a], B[:, tokens].sum(1), rtol=1e-5, atol=1e-6)
    assert store._kept                                           # the store was used


def test_sums_from_several_threads_stay_exact():
    """Tables of one HMM built from several threads share the store; every sum stays exact."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(3)
    V, h = 400, 6
    emission_t = torch.rand(V, h) ** 3
    store = LargeLetterSums(emission_t, capacity=3)
    base = [rng.choice(V, 150, replace=False) for _ in range(4)]
    sets = [np.concatenate([b[rng.permutation(150)[:140]], rng.integers(0, V, 5)])
            for b in base for _ in range(10)]
    sets = [np.unique(s) for s in sets]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(store.sum, sets))
    for s, g in zip(sets, got):
        torch.testing.assert_close(g, _brute(emission_t, s), rtol=1e-12, atol=1e-12)


def test_group_sums_memo_keys_and_capacity():
    """Equal groups in the same order share a key; a different order, a moved token or a
    different split does not; past ``max_bytes`` the least recently used result goes first."""
    from ctrlg.guide.letter_sums import GroupSumsMemo

    a, b = np.array([1, 5, 9]), np.array([2, 3])
    key = GroupSumsMemo.key([a, b])
    assert key == GroupSumsMemo.key([a.copy(), b.copy()])
    assert len({key, GroupSumsMemo.key([b, a]), GroupSumsMemo.key([np.array([1, 5]), np.array([9, 2, 3])]),
                GroupSumsMemo.key([np.array([1, 5, 8]), b])}) == 4
    memo = GroupSumsMemo(max_bytes=2 * 8)      # two results of two float32 values
    for k in range(3):
        memo.put(bytes([k]), torch.full((1, 2), float(k)))
        memo.get(bytes([0]))                 # 0 stays the most recently used
    assert memo.get(bytes([1])) is None
    assert memo.get(bytes([0])) is not None and memo.get(bytes([2])) is not None
    memo.put(bytes([2]), torch.full((1, 2), 5.0))   # the same key again: replaced, not counted twice
    assert memo.get(bytes([0])) is not None and memo.get(bytes([2]))[0, 0] == 5.0
    memo.put(bytes([3]), torch.zeros(1, 5))           # larger than the whole memo: not kept
    assert memo.get(bytes([3])) is None and memo.get(bytes([0])) is not None


def test_a_second_guide_reads_the_pair_sums_back(monkeypatch):
    """Two lazy guides of one HMM over the same schema: the second reads the first's pair sums
    from the HMM's memo (the same tensors), and they are the groups' column sums; a guide over
    another schema with other groups gets its own."""
    import ctrlg.guide.horizon as horizon
    from ctrlg import dfa
    from ctrlg.guide.horizon import HorizonGuide
    from helpers import random_hmm
    from tiny_bpe import tiny_bpe_tokenizer

    monkeypatch.setattr(horizon, "GATHER_SUMS", 0)        # every state's sums are kept
    tok = tiny_bpe_tokenizer()
    schema = {"type": "object", "properties": {"note": {"type": "string"}}}
    first = dfa.lazy_json_schema(schema, tok, whitespace="")
    hmm = random_hmm(4, first.vocab_size, seed=5)
    B = hmm.emission.double()
    one = HorizonGuide(first, hmm, 12, horizon=3)
    two = HorizonGuide(dfa.lazy_json_schema(schema, tok, whitespace=""), hmm, 12, horizon=3)
    other = HorizonGuide(dfa.lazy_json_schema({"type": "array", "items": {"type": "integer"}},
                                              tok, whitespace=""), hmm, 12, horizon=3)
    s1, s2 = one.dfa.initial, two.dfa.initial
    assert two.pair_sums(s2) is one.pair_sums(s1)
    _, members = two.feasibility.groups(s2)
    for j, tokens in enumerate(members):
        np.testing.assert_allclose(two.pair_sums(s2)[j].double().numpy(),
                                   B[:, tokens].sum(1).numpy(), rtol=1e-5, atol=1e-7)
    got = other.pair_sums(other.dfa.initial)
    assert got is not one.pair_sums(s1)
    for j, tokens in enumerate(other.feasibility.groups(other.dfa.initial)[1]):
        np.testing.assert_allclose(got[j].double().numpy(), B[:, tokens].sum(1).numpy(),
                                   rtol=1e-5, atol=1e-7)
