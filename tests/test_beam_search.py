"""Beam scores by enumeration (guided: the telescoping relation; lookahead: log p_lm + w log
p_hmm(α | prefix)), and the search's cheaper pieces (ctrlg.lm.beam_search) against the code they
replace: same values, same beams."""

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor,
                                                    NoRepeatNGramLogitsProcessor)

from ctrlg import dfa
from ctrlg.lm.beam_search import (InPlaceBans, SiblingRankPenalty, sparse_topk_values, two_stage_topk,
                                  two_stage_topk_values)
from ctrlg.lm.hmm_lm import HMMForCausalLM
from ctrlg.sampler import ConstraintLogitsProcessor
from helpers import random_dfa, random_hmm, tiny_llama
from test_guide import generations, seq_prob

V4 = 4
EOS = 3
N = 4


def _constraint():
    return dfa.intersect(dfa.any_phrase([[1], [2, 0]], V4), dfa.length(2, N, vocab_size=V4))


def _drive(proc, y, lm_scores):
    """The processor's scores at y's tokens, one row, prompt [0]; returns the running sums."""
    proc.reset()
    total, sums = 0.0, []
    for t in range(len(y)):
        ids = torch.tensor([[0, *y[:t]]])
        out = proc(ids, lm_scores(tuple(y[:t])).clone())
        total += float(out[0, y[t]])
        sums.append(total)
    return sums


def _enumerate(hmm, constraint):
    """{prefix: P_hmm(prefix, α)} and {prefix: P_hmm(prefix)} over every generation's prefixes."""
    joint, marginal = {}, {}
    for y in generations(V4, N, 0, {EOS}):
        p = seq_prob(hmm, y)
        ok = constraint.accepts(list(y))
        for t in range(1, len(y) + 1):
            marginal[y[:t]] = marginal.get(y[:t], 0.0) + p
            joint[y[:t]] = joint.get(y[:t], 0.0) + (p if ok else 0.0)
    return joint, marginal


def test_guided_beam_score_is_log_p_hmm_prefix_given_alpha_when_the_lm_is_the_hmm():
    """ρ_s = 1 when the LM is the HMM: Σ log p(x_s | x<s, α) = log P(x≤t, α) − log P(α)."""
    hmm, constraint = random_hmm(3, V4, seed=3), _constraint()
    model = HMMForCausalLM.from_hmm(hmm, prompt_length=1, eos_token_id=EOS)
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=N,
                                     eos_token_id=EOS, precision="float32")

    def lm(prefix):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[0, *prefix]])).logits[:, -1].double()
        return torch.log_softmax(logits, -1).float()

    joint, _ = _enumerate(hmm, constraint)
    p_alpha = sum(joint[(v,)] for v in range(V4) if (v,) in joint)
    checked = 0
    for y in generations(V4, N, 0, {EOS}):
        if not constraint.accepts(list(y)):
            continue
        for t, got in enumerate(_drive(proc, y, lm), start=1):
            assert got == pytest.approx(math.log(joint[y[:t]] / p_alpha), abs=2e-4)
            checked += 1
    assert checked > 20


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_lookahead_beam_score_is_log_p_lm_plus_w_log_p_hmm_alpha_given_prefix(strength):
    """Any LM (random logits per prefix): Σ scores = log p_lm(x≤t) + w · log P_hmm(α | x≤t)."""
    hmm, constraint = random_hmm(3, V4, seed=4), _constraint()
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=N,
                                     eos_token_id=EOS, precision="float32", strength=strength,
                                     beam_score="lookahead")

    def lm(prefix):
        g = torch.Generator().manual_seed(hash(prefix) % (2 ** 31))
        return torch.log_softmax(2 * torch.randn(1, V4, generator=g), -1)

    joint, marginal = _enumerate(hmm, constraint)
    checked = 0
    for y in generations(V4, N, 0, {EOS}):
        if not constraint.accepts(list(y)):
            continue
        lm_total = 0.0
        for t, got in enumerate(_drive(proc, y, lm), start=1):
            lm_total += float(lm(y[:t - 1])[0, y[t - 1]])
            want = lm_total + strength * math.log(joint[y[:t]] / marginal[y[:t]])
            assert got == pytest.approx(want, abs=2e-4)
            checked += 1
        assert got == pytest.approx(lm_total, abs=2e-4)   # finished and accepted: log p_lm(y)
    assert checked > 20


def test_lookahead_scores_give_the_guided_distribution_after_softmax():
    hmm, constraint = random_hmm(3, V4, seed=6), _constraint()
    kw = dict(prompt_length=1, max_new_tokens=N, eos_token_id=EOS, precision="float32")
    guided = ConstraintLogitsProcessor(hmm, constraint, **kw)
    ahead = ConstraintLogitsProcessor(hmm, constraint, beam_score="lookahead", **kw)
    scores = torch.log_softmax(torch.randn(3, V4), -1)
    for prefix in ([], [1], [1, 2]):
        ids = torch.tensor([[0, *prefix]] * 3)
        a = torch.softmax(ahead(ids, scores.clone()), -1)
        b = torch.exp(guided(ids, scores.clone()))
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_bad_beam_score_is_refused_by_name():
    from ctrlg.errors import ConstraintError
    with pytest.raises(ConstraintError, match="beam_score"):
        ConstraintLogitsProcessor(random_hmm(2, V4, seed=0), _constraint(), max_new_tokens=N,
                                  beam_score="best")


# ---------------------------------------------------------------------- the cheaper pieces
@pytest.mark.parametrize("seed", range(5))
def test_in_place_bans_equal_transformers_processors(seed):
    g = torch.Generator().manual_seed(seed)
    B, T, V, P = 6, 14, 7, 3
    ids = torch.randint(0, 4, (B, T), generator=g)     # few symbols: many repeated n-grams
    ids[0, -1] = 9                                      # an id past the scores' width
    for n in (1, 2, 3, 4):
        for length in (T, T - 5):
            scores = torch.randn(B, V, generator=g)
            want = MinNewTokensLengthLogitsProcessor(P, 20, [2, 5])(ids[:, :length], scores)
            want = NoRepeatNGramLogitsProcessor(n)(ids[:, :length], want)
            got = InPlaceBans(n, 20, P, [2, 5])(ids[:, :length], scores.clone())
            assert torch.equal(got, want)


def test_two_stage_topk_selects_the_same_values_as_one_topk():
    g = torch.Generator().manual_seed(0)
    for groups, V, k in ((4, 50, 8), (8, 30, 16), (3, 5, 6)):
        x = torch.randn(2, groups * V, generator=g)
        x[0, :V // 2] = -math.inf
        top, index = two_stage_topk_values(x, k, groups)
        want, want_index = torch.topk(x, k)
        assert torch.equal(top, want)
        assert torch.equal(x.gather(1, index), top)
        finite = torch.isfinite(want)
        assert torch.equal(index[finite], want_index[finite])   # distinct values: same picks


def test_sparse_topk_selects_what_one_topk_over_every_entry_selects():
    """Scores −inf outside a random key set (some keys −inf too): the top k among the keys
    equals ``torch.topk`` over the whole rows, values and (distinct values) columns; a row with
    fewer than k finite keys gives None, as does an empty key set."""
    g = torch.Generator().manual_seed(1)
    rng = np.random.default_rng(1)
    for trial in range(200):
        N, W = int(rng.integers(1, 4)), int(rng.integers(4, 60))
        k = int(rng.integers(1, 9))
        density = rng.uniform(0.05, 1.0)
        keys = np.flatnonzero(rng.random(N * W) < density)
        x = torch.full((N * W,), -math.inf)
        x[torch.as_tensor(keys, dtype=torch.long)] = torch.randn(len(keys), generator=g)
        x[torch.as_tensor(keys[rng.random(len(keys)) < 0.2], dtype=torch.long)] = -math.inf
        x = x.view(N, W)
        got = sparse_topk_values(x, k, keys)
        finite = torch.isfinite(x).sum(1)
        if len(keys) == 0 or bool((finite < k).any()):
            assert got is None
            continue
        want, want_index = torch.topk(x, k)
        top, index = got
        assert torch.equal(top, want)
        assert torch.equal(index, want_index)
    assert sparse_topk_values(torch.zeros(2, 3), 1, np.zeros(0, dtype=np.int64)) is None


def test_sibling_rank_penalty_subtracts_gamma_times_rank():
    scores = torch.tensor([[0.0, -1.0, -3.0, -2.0, -math.inf], [-2.0, -1.0, -5.0, -4.0, -3.0]])
    out = SiblingRankPenalty(0.5, top=3)(None, scores.clone())
    want = torch.tensor([[0.0, -1.5, -4.5, -3.0, -math.inf], [-2.5, -1.0, -6.5, -5.5, -4.0]])
    assert torch.equal(out, want)
    assert torch.equal(SiblingRankPenalty(0.0, top=3)(None, scores.clone()), scores)


def _beams(model, proc_list, fast, beams=6, ngram=2, min_new=2):
    ids = torch.tensor([[0, 5], [0, 7]])
    kwargs = dict(num_beams=beams, num_return_sequences=beams, max_new_tokens=7, do_sample=False,
                  pad_token_id=1, eos_token_id=1, attention_mask=torch.ones_like(ids),
                  length_penalty=0.2)
    if fast:
        bans = InPlaceBans(ngram, min_new, ids.shape[1], [1])
        with two_stage_topk(model):
            return model.generate(ids, logits_processor=[bans, *proc_list], **kwargs)
    return model.generate(ids, logits_processor=list(proc_list), no_repeat_ngram_size=ngram,
                          min_new_tokens=min_new, **kwargs)


@pytest.mark.parametrize("seed", range(3))
def test_fast_search_gives_the_same_beams(seed):
    """InPlaceBans + two_stage_topk against no_repeat_ngram_size / min_new_tokens + one top-k,
    with and without guidance, on a tiny random Llama."""
    V = 12
    model = tiny_llama(V, seed=seed)
    hmm = random_hmm(4, V, seed=seed)
    constraint = dfa.any_phrase([[3, 4], [6]], V)
    for guided in (False, True):
        procs = lambda: [ConstraintLogitsProcessor(hmm, [constraint, constraint], prompt_length=2,  # noqa: E731
                                                   max_new_tokens=7, min_new_tokens=2,
                                                   eos_token_id=1, precision="float32")] \
            if guided else []
        torch.manual_seed(0)
        slow = _beams(model, procs(), fast=False)
        torch.manual_seed(0)
        fast = _beams(model, procs(), fast=True)
        assert torch.equal(slow, fast)
    assert "_get_top_k_continuations" not in model.__dict__       # the override is removed


