"""Beam search + reranking by the LM (the paper's decoding) against brute force: on a vocabulary
small enough that a wide beam keeps every feasible prefix, the reranked best output must be the
accepted sequence of highest LM log-likelihood among *all* sequences, found by enumeration."""

import itertools

import pytest
import torch

import ctrlg
from ctrlg import dfa
from helpers import tiny_llama

V, BOS, EOS, N = 6, 0, 1, 3


def brute_force_best(model, constraint) -> tuple[list[int], float]:
    """The accepted sequence of ≤ N new tokens (ending at EOS) of highest log p_lm(· | BOS)."""
    best, best_score = None, -float("inf")
    for n in range(1, N + 1):
        for body in itertools.product(range(V), repeat=n - 1):
            seq = list(body) + [EOS]
            if EOS in body or BOS in seq or not constraint.accepts(seq):
                continue
            ids = torch.tensor([[BOS] + seq])
            with torch.no_grad():
                logp = model(input_ids=ids).logits.log_softmax(-1)[0, :-1]
            score = float(logp.gather(1, ids[0, 1:, None]).sum())
            if score > best_score:
                best, best_score = seq, score
    return best, best_score


@pytest.mark.parametrize("mode", ["logical", "ctrlg"])
def test_wide_beams_reranked_by_the_lm_find_the_brute_force_optimum(mode):
    model = tiny_llama(V, seed=2)
    constraint = dfa.intersect(dfa.phrase([3], vocab_size=V), dfa.eos(EOS, V, required=True))
    constraint = dfa.intersect(constraint, dfa.complement(dfa.any_phrase([[BOS]], vocab_size=V)))
    hmm = ctrlg.HMM.from_params(torch.full((2,), 0.5), torch.full((2, 2), 0.5),
                                torch.softmax(torch.randn(2, V, generator=torch.Generator().manual_seed(0)), -1))
    results = ctrlg.generate(model, None, [BOS], constraint, hmm=hmm if mode == "ctrlg" else None,
                             mode=mode, max_new_tokens=N, num_beams=64, num_samples=64,
                             eos_token_id=EOS, rank_by_lm=True, prior_head=None)
    expected, score = brute_force_best(model, constraint)
    assert results[0].token_ids == expected
    assert results[0].lm_log_likelihood == pytest.approx(score, abs=1e-4)
    scores = [g.lm_log_likelihood for g in results]
    assert scores == sorted(scores, reverse=True) and all(constraint.accepts(g.token_ids) for g in results)
