"""Baum-Welch (ctrlg.hmm.em) and the LVD initialisation (ctrlg.hmm.lvd)."""

import itertools

import pytest
import torch

from ctrlg.errors import CtrlgError
from ctrlg.hmm.em import (baum_welch, estep_torch, forward_loglik, log_prior, m_step, parse_schedule,
                          unigram_prior)
from ctrlg.hmm.lvd import count_hmm, kmeans, lvd_init, padding_mask
from helpers import floored_random_hmm as random_hmm


def brute_counts(hmm, rows):
    h, V = hmm.hidden_size, hmm.vocab_size
    pi, A, B = hmm.initial.double(), hmm.transition.double(), hmm.emission.double()
    init, trans, emit, ll = torch.zeros(h, dtype=torch.float64), torch.zeros(h, h, dtype=torch.float64), \
        torch.zeros(h, V, dtype=torch.float64), 0.0
    for row in rows:
        joint = {}
        for z in itertools.product(range(h), repeat=len(row)):
            p = pi[z[0]] * B[z[0], row[0]]
            for t in range(1, len(row)):
                p = p * A[z[t - 1], z[t]] * B[z[t], row[t]]
            joint[z] = p
        total = sum(joint.values())
        ll += float(torch.log(total))
        for z, p in joint.items():
            w = p / total
            init[z[0]] += w
            for t in range(len(row)):
                emit[z[t], row[t]] += w
                if t:
                    trans[z[t - 1], z[t]] += w
    return init, trans, emit, ll


@pytest.mark.parametrize("h, V, L, seed", [(3, 4, 3, 0), (2, 5, 4, 1), (3, 3, 1, 2)])
def test_expected_counts_equal_enumeration(h, V, L, seed):
    hmm = random_hmm(h, V, seed)
    tokens = torch.randint(0, V, (5, L), generator=torch.Generator().manual_seed(seed))
    got = estep_torch(hmm.initial, hmm.transition, hmm.emission, tokens)
    init, trans, emit, ll = brute_counts(hmm, tokens.tolist())
    torch.testing.assert_close(got.initial.double(), init, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.transition.double(), trans, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.emission.double(), emit, atol=1e-5, rtol=0)
    assert abs(float(got.loglik) - ll) < 1e-4
    assert float(got.tokens) == 5 * L and float(got.sequences) == 5


@pytest.mark.parametrize("pseudocount, prior", [(0.0, None), (0.5, None), (3.0, "unigram")])
def test_full_batch_em_never_lowers_the_objective(pseudocount, prior):
    """Log-likelihood (pseudocount 0) or log-likelihood + log-prior (MAP-EM) never decreases."""
    true = random_hmm(4, 12, seed=10, sharp=3.0)
    data = true.sample(300, 6, seed=0)
    hmm = random_hmm(4, 12, seed=11)
    u = unigram_prior(data, 12) if prior else None
    objective = []
    for _ in range(15):
        objective.append(float(forward_loglik(hmm, data)) + log_prior(hmm, pseudocount, u))
        counts = estep_torch(hmm.initial, hmm.transition, hmm.emission, data)
        hmm = m_step(hmm, counts, pseudocount=pseudocount, emission_prior=u)
    diffs = torch.tensor(objective).diff()
    assert (diffs >= -1e-3).all(), objective
    assert objective[-1] > objective[0] + 1.0


def test_baum_welch_history_is_monotone_for_full_batch_steps():
    true = random_hmm(4, 12, seed=12, sharp=3.0)
    data = true.sample(400, 6, seed=1)
    _, history = baum_welch(random_hmm(4, 12, seed=13), data, schedule=[(12, 1)], num_chunks=1,
                            pseudocount=0.0)
    train = torch.tensor(history.train_ll[1:])
    assert (train.diff() >= -1e-6).all(), history.train_ll


def test_em_recovers_a_known_hmm_within_two_percent():
    true = random_hmm(4, 10, seed=20, sharp=4.0)
    train, heldout = true.sample(2000, 8, seed=2), true.sample(500, 8, seed=3)
    true_ll = float(forward_loglik(true, heldout)) / heldout.numel()
    hmm, history = baum_welch(random_hmm(4, 10, seed=21), train,
                              schedule=[(3, 1), (3, 2), (20, 4)], num_chunks=4, pseudocount=0.1,
                              heldout_tokens=heldout, seed=0)
    assert history.heldout_ll[-1] == pytest.approx(float(forward_loglik(hmm, heldout)) / heldout.numel())
    assert history.heldout_ll[-1] > history.heldout_ll[0]
    assert abs(history.heldout_ll[-1] - true_ll) <= 0.02 * abs(true_ll), (history.heldout_ll[-1], true_ll)


def test_schedule_cycles_through_chunks_and_is_seeded():
    true = random_hmm(3, 6, seed=30)
    data = true.sample(64, 5, seed=4)
    runs = [baum_welch(random_hmm(3, 6, seed=31), data, schedule="2:1,1:3,2:4", num_chunks=4,
                       pseudocount=0.1, seed=7) for _ in range(2)]
    assert runs[0][1].chunks == [0, 1, 1, 3, 4, 4]
    torch.testing.assert_close(runs[0][0].emission, runs[1][0].emission, atol=0, rtol=0)


def test_chunk_windows_take_the_next_chunks_cyclically():
    """Each step takes min(chunks, num_chunks) chunks following the previous step's (mod num_chunks)."""
    from ctrlg.hmm.em import _chunk_windows

    schedule = [(2, 1), (1, 3), (2, 4), (1, 9), (0, 2)]
    flat = itertools.cycle(range(4))
    want = [[next(flat) for _ in range(min(chunks, 4))] for steps, chunks in schedule for _ in range(steps)]
    assert list(_chunk_windows(schedule, 4)) == want
    assert want[:4] == [[0], [1], [2, 3, 0], [1, 2, 3, 0]]


def test_shuffled_chunks_partition_the_rows_and_shards_partition_the_chunks():
    from ctrlg.hmm.em import _shuffled_chunks

    tokens = torch.arange(22).reshape(11, 2)
    chunks = _shuffled_chunks(tokens, 3, seed=5, shard=None)
    assert [c.shape[0] for c in chunks] == [4, 4, 3]
    assert sorted(torch.cat(chunks)[:, 0].tolist()) == list(range(0, 22, 2))   # every row once
    assert all(torch.equal(a, b) for a, b in zip(chunks, _shuffled_chunks(tokens, 3, 5, None)))
    shards = [_shuffled_chunks(tokens, 3, seed=5, shard=(rank, 2)) for rank in range(2)]
    for i, chunk in enumerate(chunks):
        assert torch.equal(shards[0][i], chunk[0::2]) and torch.equal(shards[1][i], chunk[1::2])
    with pytest.raises(CtrlgError, match="rank"):
        _shuffled_chunks(tokens, 3, seed=5, shard=(2, 2))


def testemission_prior_mean_is_uniform_or_the_training_unigram():
    from ctrlg.hmm.em import emission_prior_mean

    tokens = torch.tensor([[0, 0, 2]])
    assert emission_prior_mean("uniform", tokens, 4, "cpu") is None
    torch.testing.assert_close(emission_prior_mean("unigram", tokens, 4, "cpu"),
                               torch.tensor([3 / 7, 1 / 7, 2 / 7, 1 / 7], dtype=torch.float64))
    with pytest.raises(CtrlgError, match="'zipf'"):
        emission_prior_mean("zipf", tokens, 4, "cpu")


def test_bad_schedules_and_batches_raise():
    for bad in ["", "3", "a:b", "1:0", [(1, 2, 3)]]:
        with pytest.raises(CtrlgError, match="schedule"):
            parse_schedule(bad)
    hmm = random_hmm(3, 6, seed=0)
    with pytest.raises(CtrlgError, match="num_chunks"):
        baum_welch(hmm, torch.zeros(4, 3, dtype=torch.long), num_chunks=5)
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        baum_welch(hmm, torch.full((4, 3), 6))
    with pytest.raises(CtrlgError, match=r"\[n, L\]"):
        baum_welch(hmm, torch.zeros(4, dtype=torch.long))


def test_padding_mask_and_eos_padding_state_is_kept_by_em():
    tokens = torch.tensor([[5, 2, 2, 2], [1, 1, 1, 2], [2, 2, 3, 2]])
    assert padding_mask(tokens, 2).tolist() == [[False, False, True, True], [False] * 4,
                                                [False, True, True, True]]
    states = torch.tensor([[0, 1, 3, 3], [0, 0, 1, 1], [1, 3, 3, 3]])
    hmm = count_hmm(states, tokens, 4, 6, pseudocount=0.5, eos_pad_state=3, eos_token_id=2)
    assert hmm.emission[3].tolist() == [0, 0, 1, 0, 0, 0]
    assert hmm.transition[3].tolist() == [0, 0, 0, 1]
    trained, _ = baum_welch(hmm, tokens, schedule=[(3, 1)], pseudocount=0.5)
    assert trained.emission[3].tolist() == [0, 0, 1, 0, 0, 0]
    assert trained.transition[3].tolist() == [0, 0, 0, 1]
    assert trained.config["eos_pad_state"] == 3


def test_count_hmm_equals_smoothed_counts():
    states = torch.tensor([[0, 1, 1], [1, 0, 0]])
    tokens = torch.tensor([[2, 0, 1], [1, 2, 2]])
    hmm = count_hmm(states, tokens, 2, 3, pseudocount=1.0)
    torch.testing.assert_close(hmm.initial, torch.tensor([1.5, 1.5]) / 3)
    # transitions: 0->1, 1->1, 1->0, 0->0 ; each +0.5
    torch.testing.assert_close(hmm.transition, torch.tensor([[1.5, 1.5], [1.5, 1.5]]) / 3)
    want = torch.tensor([[0, 0, 3], [1, 2, 0]], dtype=torch.float32) + 1 / 3
    torch.testing.assert_close(hmm.emission, want / want.sum(-1, keepdim=True))


def test_kmeans_separates_clusters_and_lvd_init_uses_them():
    g = torch.Generator().manual_seed(0)
    centers = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    labels = torch.arange(3).repeat_interleave(50)
    x = centers[labels] + 0.3 * torch.randn(150, 2, generator=g)
    found = kmeans(x, 3, iters=10, seed=0)
    nearest = torch.cdist(centers, found).argmin(-1)
    assert sorted(nearest.tolist()) == [0, 1, 2]
    # tokens determined by the cluster: LVD should give near-deterministic emissions
    tokens = labels.view(30, 5) + 1  # ids 1..3, EOS = 0 never occurs
    hidden = x.view(30, 5, 2)
    hmm = lvd_init(tokens, hidden, 4, 5, eos_token_id=0, pseudocount=0.01, seed=0)
    assert hmm.emission[:3].max(-1).values.min() > 0.99
    assert hmm.emission[3, 0] == 1.0
    with pytest.raises(CtrlgError, match="disagree"):
        lvd_init(tokens, hidden[:, :4], 4, 5, eos_token_id=0)


def test_keep_best_returns_the_best_heldout_parameters():
    true = random_hmm(3, 8, seed=40, sharp=3.0)
    train, heldout = true.sample(20, 4, seed=5), true.sample(50, 4, seed=6)
    last, history = baum_welch(random_hmm(3, 8, seed=41), train, schedule=[(6, 1)], pseudocount=0.0,
                               heldout_tokens=heldout)
    best, best_history = baum_welch(random_hmm(3, 8, seed=41), train, schedule=[(6, 1)], pseudocount=0.0,
                                    heldout_tokens=heldout, keep_best=True)
    step = best_history.best_step
    assert history.heldout_ll[step] == max(history.heldout_ll)
    assert float(forward_loglik(best, heldout)) / heldout.numel() == pytest.approx(max(history.heldout_ll))
    assert history.best_step == 6


def test_lvd_on_an_explicit_device_gives_the_default_result_and_cpu_centroids():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 6, 4, generator=g)
    tokens = torch.randint(1, 9, (40, 6), generator=g)
    tokens[::3, 4:] = 0                                  # some EOS padding
    default = lvd_init(tokens, x, 5, 9, eos_token_id=0, seed=1)
    explicit = lvd_init(tokens, x, 5, 9, eos_token_id=0, seed=1, device="cpu")
    for name in ("initial", "transition", "emission"):
        assert torch.equal(getattr(default, name), getattr(explicit, name))
    centroids = kmeans(x.reshape(-1, 4), 3, iters=2, seed=0)
    assert centroids.device == torch.device("cpu") and centroids.shape == (3, 4)


def test_time_limit_ends_the_schedule_after_the_step_past_it():
    from ctrlg.hmm.model import HMM

    torch.manual_seed(0)
    h, V = 3, 5
    hmm = HMM.from_params(torch.full((h,), 1 / h), torch.softmax(torch.randn(h, h), -1),
                                torch.softmax(torch.randn(h, V), -1))
    tokens = hmm.sample(40, 6, seed=1)
    _, full = baum_welch(hmm, tokens, schedule=[(5, 1)])
    assert len(full.step) == 6 and not full.stopped_early
    _, cut = baum_welch(hmm, tokens, schedule=[(5, 1)], time_limit=0.0)
    assert len(cut.step) == 2 and cut.stopped_early  # the initial record and one step
