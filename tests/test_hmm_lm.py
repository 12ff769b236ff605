"""HMMForCausalLM: next-token logits equal the HMM's conditionals; generate works."""

import pytest
import torch

from ctrlg import HMM
from ctrlg.errors import VocabularyMismatchError
from ctrlg.lm.hmm_lm import HMMForCausalLM


def small_hmm(h=3, V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return HMM.from_params(torch.rand(h, generator=g), torch.rand(h, h, generator=g),
                           torch.rand(h, V, generator=g), normalize=True)


def test_logits_are_hmm_conditionals_after_the_prompt():
    hmm = small_hmm()
    model = HMMForCausalLM.from_hmm(hmm, prompt_length=2)
    ids = torch.tensor([[4, 1, 0, 3, 2, 2], [0, 0, 1, 1, 4, 0]])
    logits = model(ids).logits
    assert logits.shape == (2, 6, 5)
    for row in range(2):
        generated = ids[row, 2:]
        for k in range(len(generated)):  # logits at position 1 + k predict generated[k]
            expect = hmm.log_prob(generated[None, :k + 1]) - hmm.log_prob(generated[None, :k])
            got = torch.log_softmax(logits[row, 1 + k], -1)[generated[k]]
            assert torch.allclose(got, expect[0], atol=1e-5)
        assert torch.allclose(torch.logsumexp(logits[row], -1), torch.zeros(6), atol=1e-5)


def test_generate_samples_and_beams_with_hmm_lm():
    hmm = small_hmm()
    model = HMMForCausalLM.from_hmm(hmm, prompt_length=1, eos_token_id=4)
    ids = torch.full((3, 1), 2)
    torch.manual_seed(0)
    out = model.generate(ids, do_sample=True, max_new_tokens=3, attention_mask=torch.ones_like(ids))
    assert out.shape[0] == 3 and out.shape[1] <= 4
    out = model.generate(ids[:1], num_beams=2, num_return_sequences=2, max_new_tokens=3,
                         attention_mask=torch.ones_like(ids[:1]))
    assert out.shape[0] == 2


def test_out_of_vocabulary_ids_raise():
    model = HMMForCausalLM.from_hmm(small_hmm(), prompt_length=1)
    with pytest.raises(VocabularyMismatchError, match=r"\[0, 5\)"):
        model(torch.tensor([[0, 7]]))
