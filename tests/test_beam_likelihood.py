"""The log-likelihoods recorded during beam search (:mod:`ctrlg.lm.beam_likelihood`) against a
second LM pass over every returned beam: guided beams, left-padded prompts of two lengths in one
batch, no repeated n-grams, a minimum length, hypotheses ended by EOS and by the token budget."""

import pytest
import torch

import ctrlg
from ctrlg import dfa
from ctrlg.lm.beam_likelihood import BeamLogLikelihoods, records_lm_log_probs
from ctrlg.sampler import ConstraintLogitsProcessor, lm_log_likelihood, trim_at_eos
from helpers import tiny_llama

V, BOS, EOS, PAD = 7, 0, 1, 1


@pytest.mark.parametrize("beams,max_new,no_repeat", [(12, 6, 0), (12, 6, 2)])
def test_recorded_beam_log_likelihoods_equal_a_second_lm_pass(beams, max_new, no_repeat):
    """Every recorded value equals the second pass; with ``no_repeat_ngram_size`` a beam that the
    guidance revived after the LM's scores were all −inf (a banned n-gram as the only feasible
    continuation) is not read from the search (None: the caller's second pass scores it)."""
    model = tiny_llama(V, seed=1)
    prompts = [[BOS, 4, 5], [BOS]]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    constraints = [dfa.phrase([3], vocab_size=V), dfa.phrase([2, 6], vocab_size=V)]
    hmm = ctrlg.HMM.from_params(torch.full((2,), 0.5), torch.full((2, 2), 0.5),
                                torch.softmax(torch.randn(2, V, generator=torch.Generator().manual_seed(1)), -1))
    guide = ConstraintLogitsProcessor(hmm, constraints, prompt_length=width, max_new_tokens=max_new,
                                      eos_token_id=[EOS], mode="ctrlg")
    recorder = BeamLogLikelihoods(width, len(prompts), [EOS])
    options = dict(do_sample=False, num_beams=beams, length_penalty=0.2,
                   no_repeat_ngram_size=no_repeat)
    assert records_lm_log_probs(model.generation_config, options)
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=attention, max_new_tokens=max_new,
                             min_new_tokens=2, num_return_sequences=beams, pad_token_id=PAD,
                             eos_token_id=EOS, logits_processor=[recorder, guide], **options)
    rows = out[:, width:].tolist()
    ended = budget = unread = 0
    for j, prompt in enumerate(prompts):
        samples = [trim_at_eos(r, [EOS]) for r in rows[j * beams:(j + 1) * beams]]
        expected = lm_log_likelihood(model, prompt, samples)
        for sample, value in zip(samples, expected):
            recorded = recorder.log_likelihood(j, sample)
            if recorded is None:         # only beams that repeat a banned n-gram
                assert no_repeat and repeats_an_ngram(prompt + sample, no_repeat), (j, sample)
                unread += 1
                continue
            assert recorded == pytest.approx(value, abs=1e-4), (j, sample)
            ended += sample[-1] == EOS
            budget += sample[-1] != EOS and len(sample) == max_new
    assert ended and budget            # both kinds of hypothesis were checked
    assert unread <= beams // 2


def repeats_an_ngram(ids: list[int], n: int) -> bool:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) != len(set(grams))


def test_unknown_hypotheses_and_rescaled_scores_are_not_read_from_the_search():
    recorder = BeamLogLikelihoods(1, 1, [EOS])
    assert recorder.log_likelihood(0, [3, EOS]) is None          # nothing recorded yet
    config = tiny_llama(V).generation_config
    assert not records_lm_log_probs(config, dict(num_beams=4, repetition_penalty=1.3))
    assert not records_lm_log_probs(config, dict(num_beams=4, do_sample=True))
    assert not records_lm_log_probs(config, dict(num_beams=1))
    assert records_lm_log_probs(config, dict(num_beams=4, do_sample=False, no_repeat_ngram_size=4))


def test_ended_hypotheses_are_every_row_prefix_plus_eos_with_its_lm_log_likelihood():
    """``ended_hypotheses(j)``: for every call of the search and every row of input j, the row's
    generated prefix + EOS (EOS banned before ``min_new_tokens``: left out), each once, with the
    value of a second LM pass; the returned beams that ended with EOS are among them."""
    model = tiny_llama(V, seed=1)
    prompts = [[BOS, 4, 5], [BOS]]
    width, beams, max_new = 3, 4, 5
    input_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    recorder = BeamLogLikelihoods(width, len(prompts), [EOS])
    seen: list[set] = [set(), set()]

    class Probe:
        def __call__(self, ids, scores):
            for r, row in enumerate(ids[:, width:].tolist()):
                if len(row) >= 2:                                     # min_new_tokens=2
                    seen[r // beams].add(tuple(row) + (EOS,))
            return scores

    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=attention, max_new_tokens=max_new,
                             min_new_tokens=2, num_return_sequences=beams, pad_token_id=PAD,
                             eos_token_id=EOS, do_sample=False, num_beams=beams,
                             logits_processor=[Probe(), recorder])
    rows = out[:, width:].tolist()
    finished_beams = 0
    for j, prompt in enumerate(prompts):
        ended = recorder.ended_hypotheses(j)
        tokens = [tuple(t) for t, _ in ended]
        assert len(tokens) == len(set(tokens)) and set(tokens) == seen[j]
        expected = lm_log_likelihood(model, prompt, [list(t) for t in tokens])
        assert [v for _, v in ended] == pytest.approx(expected, abs=1e-4)
        returned = {tuple(trim_at_eos(r, [EOS])) for r in rows[j * beams:(j + 1) * beams]}
        finished = {t for t in returned if t[-1] == EOS}
        assert finished <= set(tokens)
        finished_beams += len(finished)
    assert finished_beams                     # some returned beam ended with EOS
    assert recorder.ended_hypotheses(5) == []
