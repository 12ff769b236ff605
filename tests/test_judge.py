"""The judge's prompt-cached log-likelihoods against the chain rule computed one token at a time."""

import math

import pytest
import torch

from ctrlg.errors import ConstraintError
from ctrlg.lm.judge import judge_log_likelihoods
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
