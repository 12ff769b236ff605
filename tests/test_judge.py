"""The judge's prompt-cached log-likelihoods against the chain rule computed one token at a time,
its candidates packed as a prefix tree (shared prefixes, duplicates, a candidate that is another's
prefix, random sets), and the tree itself against the candidates it spells."""

import math

import pytest
import torch

from ctrlg.errors import ConstraintError
from ctrlg.lm.judge import judge_log_likelihoods, judge_log_likelihoods_many, prefix_tree
from ctrlg.sampler import lm_log_likelihood
from helpers import tiny_llama


def chain_rule(model, prompt, candidate) -> float:
    """Σ_t log p(y_t | prompt, y_<t), one full forward of prompt + y_<t per token."""
    total = 0.0
    for t, token in enumerate(candidate):
        ids = torch.tensor([list(prompt) + list(candidate[:t])])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1].float()
        total += float(torch.log_softmax(logits, -1)[token])
    return total


@pytest.mark.parametrize("batch_size", [1, 2, 32])
def test_judge_matches_the_chain_rule_on_ragged_candidates(batch_size):
    model = tiny_llama(7, seed=3, layers=2)
    prompt = [0, 4, 2, 5]
    candidates = [[3], [2, 6, 1], [], [5, 5, 5, 5, 1], [1]]
    scores = judge_log_likelihoods(model, prompt, candidates, batch_size=batch_size)
    for candidate, score in zip(candidates, scores):
        assert math.isclose(score, chain_rule(model, prompt, candidate), rel_tol=1e-5, abs_tol=1e-5)
    nonempty = [c for c in candidates if c]
    assert judge_log_likelihoods(model, prompt, nonempty) == pytest.approx(
        lm_log_likelihood(model, prompt, nonempty), rel=1e-5, abs=1e-5)


def test_judge_needs_a_prompt():
    with pytest.raises(ConstraintError, match="non-empty prompt"):
        judge_log_likelihoods(tiny_llama(5), [], [[1]])


def test_judge_matches_the_chain_rule_on_candidates_that_share_prefixes():
    model = tiny_llama(7, seed=5, layers=2)
    prompt = [1, 3]
    candidates = [[2, 4, 6, 1], [2, 4, 5, 1], [2, 4, 6, 1], [2, 4], [2], [6, 4, 6, 1], [], [2, 4, 6, 1, 1]]
    for batch_size in (1, 3, 32):
        scores = judge_log_likelihoods(model, prompt, candidates, batch_size=batch_size)
        for candidate, score in zip(candidates, scores):
            assert math.isclose(score, chain_rule(model, prompt, candidate), rel_tol=1e-5, abs_tol=1e-5)


def test_judge_matches_the_chain_rule_on_random_candidate_sets():
    """Beams of a small vocabulary: many shared prefixes, repeats and prefixes of one another."""
    model = tiny_llama(5, seed=11, layers=2)
    generator = torch.Generator().manual_seed(0)
    for trial in range(6):
        prompt = torch.randint(0, 5, (1 + trial % 3,), generator=generator).tolist()
        candidates = [torch.randint(0, 3 if trial % 2 else 5, (int(n),), generator=generator).tolist()
                      for n in torch.randint(0, 6, (7,), generator=generator)]
        scores = judge_log_likelihoods(model, prompt, candidates, batch_size=4)
        for candidate, score in zip(candidates, scores):
            assert math.isclose(score, chain_rule(model, prompt, candidate), rel_tol=1e-5, abs_tol=1e-5)


def test_prefix_tree_spells_every_candidate_once_per_distinct_prefix():
    candidates = [[2, 4, 6], [2, 4, 5], [2, 4, 6], [], [2], [6, 4]]
    tokens, parents, depths, paths = prefix_tree(candidates)
    prefixes = {tuple(c[:i + 1]) for c in candidates for i in range(len(c))}
    assert len(tokens) == len(prefixes) == 6
    for candidate, path in zip(candidates, paths):
        assert [tokens[n] for n in path] == candidate
        assert [depths[n] for n in path] == list(range(len(candidate)))
        assert all(parents[b] == a for a, b in zip([-1] + path, path))
    assert all(p < n for n, p in enumerate(parents))     # a parent comes before its children


@pytest.mark.parametrize("max_positions, forwards", [(4096, 1), (12, None)])
def test_many_requests_share_forwards_and_match_the_chain_rule(max_positions, forwards):
    """Items of a batch with prompts of different lengths go through one forward (their rows
    right-aligned) or, under a small position budget, several; the scores are the chain rule's."""
    model = tiny_llama(7, seed=2, layers=2)
    requests = [([0, 4, 2, 5], [[3, 1], [3, 2, 1], []]), ([6], [[2, 2, 2], [2, 2]]),
                ([1, 1], []), ([5, 3, 3], [[4], [4, 6, 6, 6, 1]])]
    calls = []
    hook = model.register_forward_hook(lambda module, args, kwargs, out: calls.append(1), with_kwargs=True)
    try:
        scores = judge_log_likelihoods_many(model, requests, max_positions=max_positions)
    finally:
        hook.remove()
    assert forwards is None and len(calls) > 1 or len(calls) == forwards
    assert [len(s) for s in scores] == [len(c) for _, c in requests]
    for (prompt, candidates), row in zip(requests, scores):
        for candidate, score in zip(candidates, row):
            assert math.isclose(score, chain_rule(model, prompt, candidate), rel_tol=1e-5, abs_tol=1e-5)


def test_a_judge_with_absolute_positions_and_eager_attention_matches_the_chain_rule():
    """GPT-2 (learned position embeddings, eager attention): the packed rows' positions and
    masks carry over to another architecture."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=6, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                        initializer_range=0.5, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    requests = [([0, 3], [[2, 4, 1], [2, 4, 5, 1], [2]]), ([5, 5, 5], [[1], [3, 3, 1]])]
    for (prompt, candidates), row in zip(requests, judge_log_likelihoods_many(model, requests)):
        for candidate, score in zip(candidates, row):
            assert math.isclose(score, chain_rule(model, prompt, candidate), rel_tol=1e-5, abs_tol=1e-5)
