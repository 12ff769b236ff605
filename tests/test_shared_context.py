"""The prompt encoded once and shared by every row (ctrlg.lm.shared_context): scores and samples
equal those of rows that each carry the prompt."""

import math

import pytest
import torch

from ctrlg import dfa
from ctrlg.lm import shared_context
from ctrlg.lm.shared_context import ContextCache, SharedContext
from ctrlg.sampler import generate, lm_log_likelihood
from tiny_lms import NoCacheLM, tiny_llama

VOCAB = 40


@pytest.fixture(scope="module")
def lm():
    return tiny_llama(VOCAB, seed=3, head_scale=4.0, layers=2, kv_heads=1)


def brute_force_log_likelihood(model, prompt, candidate):
    """Σ_j log p(c_j | prompt, c_<j) from one forward over prompt + c, no cache, no padding."""
    if not candidate:
        return 0.0
    ids = torch.tensor([prompt + candidate])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(candidate))


@pytest.mark.parametrize("cached", [True, False])
def test_scores_equal_each_candidate_scored_alone(lm, cached):
    model = lm if cached else NoCacheLM(lm)
    prompt = [1, 7, 3, 9, 12]
    candidates = [[5], [], [8, 2, 2, 31], [0, 39, 4], [6, 6]]
    got = lm_log_likelihood(model, prompt, candidates, batch_size=3)
    expected = [brute_force_log_likelihood(lm, prompt, c) for c in candidates]
    assert got == pytest.approx(expected, abs=1e-4)
    assert SharedContext(model, prompt).reusable is cached
    assert lm_log_likelihood(model, prompt, []) == []


def test_the_shared_cache_is_never_written(lm):
    context = SharedContext(lm, [1, 2, 3])
    before = [(k.clone(), v.clone()) for k, v in context.layers]
    ids = torch.tensor([[4, 5, 6], [7, 8, 0]])
    first = context.continuation_logits(ids, torch.tensor([[1, 1, 1], [1, 1, 0]]))
    second = context.continuation_logits(ids, torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert torch.equal(first, second)
    for (k0, v0), (k1, v1) in zip(before, context.layers):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_sampling_with_the_shared_prompt_draws_what_repeated_prompts_draw(lm, monkeypatch,
                                                                          encoded_contexts):
    """Same seed, same samples, token for token, whether the rows share the prompt's cache or
    transformers repeats the prompt per row (the fallback path)."""
    constraint = dfa.banned_phrases([[9, 9]], VOCAB)   # never 9 9
    prompt = [1, 4, 4, 20, 3, 17, 8]
    kwargs = dict(mode="logical", max_new_tokens=6, num_samples=6, seed=11, eos_token_id=[0],
                  rank_by_lm=False)
    shared = [g.token_ids for g in generate(lm, None, prompt, constraint, **kwargs)]
    assert encoded_contexts == [len(prompt) - 1]           # the prompt (but its last token) encoded once
    monkeypatch.setattr(shared_context.SharedContext, "reusable", property(lambda self: False))
    repeated = [g.token_ids for g in generate(lm, None, prompt, constraint, **kwargs)]
    assert shared == repeated and len(shared) == 6
    assert not any(s[i:i + 2] == [9, 9] for s in shared for i in range(len(s)))


def test_lm_log_likelihood_agrees_with_generation_scores(lm):
    """The shared-prompt scores equal the sum of the per-step log-softmax transformers hands out."""
    prompt = [2, 5, 11]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = lm.generate(ids, max_new_tokens=5, do_sample=False, output_scores=True,
                          return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    new = out.sequences[0, len(prompt):].tolist()
    steps = sum(float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, new))
    assert lm_log_likelihood(lm, prompt, [new])[0] == pytest.approx(steps, abs=1e-4)
    assert math.isfinite(steps)


@pytest.mark.parametrize("cached", [True, False])
def test_scores_through_a_context_cache_equal_each_candidate_scored_alone(lm, cached):
    """The cache keeps the prompt but its last token; that token then runs before each candidate:
    the same scores as the brute force, and a second call encodes nothing."""
    model = lm if cached else NoCacheLM(lm)
    prompt = [1, 7, 3, 9, 12]
    candidates = [[5], [], [8, 2, 2, 31], [0, 39, 4]]
    contexts = ContextCache(capacity=1)
    got = lm_log_likelihood(model, prompt, candidates, batch_size=3, contexts=contexts)
    expected = [brute_force_log_likelihood(lm, prompt, c) for c in candidates]
    assert got == pytest.approx(expected, abs=1e-4)
    assert (contexts.hits, contexts.misses) == (0, 1)    # encoded once for both chunks
    again = lm_log_likelihood(model, prompt, candidates[:2], contexts=contexts)
    assert again == pytest.approx(expected[:2], abs=1e-4) and contexts.misses == 1
    one_token = lm_log_likelihood(model, [4], [[5, 6]], contexts=contexts)   # nothing to keep
    assert one_token == pytest.approx([brute_force_log_likelihood(lm, [4], [5, 6])], abs=1e-4)


def test_sampling_and_its_rerank_encode_the_prompt_once_between_calls(lm, encoded_contexts):
    """generate(contexts=...) shares one encoding of the prompt between sampling and the rerank,
    and the next call with the same prompt encodes nothing; samples and scores equal the
    uncached call's."""
    constraint = dfa.banned_phrases([[9, 9]], VOCAB)
    prompt = [1, 4, 4, 20, 3, 17, 8]
    kwargs = dict(mode="logical", max_new_tokens=6, num_samples=5, seed=3, eos_token_id=[0])
    plain = generate(lm, None, prompt, constraint, **kwargs)
    assert encoded_contexts == [len(prompt) - 1, len(prompt)]     # without: sampling, then rerank
    del encoded_contexts[:]
    contexts = ContextCache()
    cached = generate(lm, None, prompt, constraint, contexts=contexts, **kwargs)
    assert encoded_contexts == [len(prompt) - 1]
    assert [g.token_ids for g in cached] == [g.token_ids for g in plain]
    assert [g.lm_log_likelihood for g in cached] == pytest.approx(
        [g.lm_log_likelihood for g in plain], abs=1e-4)
    generate(lm, None, prompt, constraint, contexts=contexts, **dict(kwargs, seed=4))
    assert encoded_contexts == [len(prompt) - 1] and contexts.hits == 3


def test_the_context_cache_drops_the_least_recently_used_and_knows_its_model(lm):
    contexts = ContextCache(capacity=2)
    a, b, c = [1, 2], [3, 4], [5, 6]
    first = contexts.get(lm, a)
    contexts.get(lm, b)
    assert contexts.get(lm, a) is first          # a is now the most recent
    contexts.get(lm, c)                          # evicts b
    assert contexts.get(lm, a) is first and contexts.misses == 3
    contexts.get(lm, b)
    assert contexts.misses == 4
    other = tiny_llama(VOCAB, seed=4, head_scale=1.0, layers=1, kv_heads=1)
    assert contexts.get(other, a) is not first   # another model never reads this model's entry
    contexts.clear()
    assert contexts.get(lm, a) is not first
    with pytest.raises(ValueError, match="capacity"):
        ContextCache(capacity=0)
