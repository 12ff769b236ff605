"""Everything ctrlg.generate (and the other places that run an LM) can check before any work: the
context length (prompt + max_new_tokens + suffix against the LM's maximum positions), the
decoding options passed on to ``model.generate``, and the token ids of the prompt, suffix and EOS.
Each check fires before a guide table is built or the LM runs."""

import json
import urllib.error
import urllib.request

import pytest
import torch

import ctrlg
from ctrlg import dfa, sampler
from ctrlg.errors import ConstraintError, ContextLengthError, VocabularyMismatchError
from ctrlg.validation import check_context_length, lm_max_positions


@pytest.fixture(scope="module")
def lm_8k(smollm2_tokenizer):
    """A tiny Llama over the SmolLM2 tokenizer with SmolLM2's 8,192 positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=8192,
                         eos_token_id=smollm2_tokenizer.eos_token_id,
                         pad_token_id=smollm2_tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a guide table is built or the LM runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(sampler, "ConstraintLogitsProcessor", refuse)
    monkeypatch.setattr(torch.nn.Module, "__call__", refuse)


def test_the_embedded_lm_reads_8192_positions(smollm2_tokenizer):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_tokenizer.name_or_path)
    assert lm_max_positions(type("LM", (), {"config": config})()) == (8192,
                                                                       "max_position_embeddings")


def test_a_prompt_past_the_context_is_refused_before_generating(lm_8k, smollm2_tokenizer,
                                                                  no_work):
    """12,000 prompt tokens against 8,192 positions ran for 108 s and returned garbage."""
    V = len(smollm2_tokenizer)
    prompt = [smollm2_tokenizer.encode(" the")[0]] * 12_000
    with pytest.raises(ContextLengthError, match=r"the prompt has 12,000 tokens; with "
                       r"max_new_tokens=32 the generation needs 12,032 positions, but the LM "
                       r"reads at most 8,192 \(config.max_position_embeddings\); shorten it to "
                       r"at most 8,160 tokens"):
        ctrlg.generate(lm_8k, smollm2_tokenizer, prompt, dfa.phrase([3], V), mode="logical",
                       max_new_tokens=32)
    text = " the" * 8_170                                  # fits alone, not with 32 new tokens
    with pytest.raises(ContextLengthError, match="8,202 positions"):
        ctrlg.generate(lm_8k, smollm2_tokenizer, text, dfa.phrase([3], V), mode="logical",
                       max_new_tokens=32)


def test_the_suffix_counts_towards_the_context(lm_8k, smollm2_tokenizer, no_work):
    V = len(smollm2_tokenizer)
    with pytest.raises(ContextLengthError, match=r"with max_new_tokens=8 \+ a 8,190-token suffix"):
        ctrlg.generate(lm_8k, smollm2_tokenizer, "Hi", dfa.phrase([3], V), mode="logical",
                       max_new_tokens=8, suffix=[5] * 8_190)


def test_context_check_without_a_position_limit_is_silent():
    check_context_length(object(), 10**6, 10**6)           # nothing names a limit: no check
    gpt2 = type("LM", (), {"config": type("C", (), {"n_positions": 1024})()})()
    with pytest.raises(ContextLengthError, match=r"config.n_positions\); lower max_new_tokens"):
        check_context_length(gpt2, 10, 2000)


@pytest.mark.parametrize("options, message", [
    (dict(temperature=0), "temperature must be a number in \\(0, inf\\]"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=1.5), "top_p must be a number in \\(0, 1\\]"),
    (dict(top_k=-1), "top_k must be an int in \\[0, inf\\]"),
    (dict(top_k=2.5), "top_k must be an int"),
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(no_repeat_ngram_size=-2), "no_repeat_ngram_size"),
    (dict(num_return_sequences=3), "num_return_sequences is set by ctrlg.generate; give its own "
                                   "argument num_samples="),
    (dict(max_length=50), "max_length is set by ctrlg.generate; give its own argument "
                          "max_new_tokens="),
    (dict(logits_processor=[]), "logits_processor is set by ctrlg.generate"),
    (dict(do_sample=False), "greedy decoding .* num_samples=3"),
])
def test_decoding_options_are_checked_before_any_work(lm_8k, smollm2_tokenizer, no_work, options,
                                                       message):
    V = len(smollm2_tokenizer)
    with pytest.raises(ConstraintError, match=message):
        ctrlg.generate(lm_8k, smollm2_tokenizer, "Hi", dfa.phrase([3], V), mode="logical",
                       max_new_tokens=4, num_samples=3, **options)


def test_prompt_ids_out_of_range_are_refused(lm_8k, smollm2_tokenizer, no_work):
    """They raised an IndexError from the LM's embedding."""
    V = len(smollm2_tokenizer)
    with pytest.raises(VocabularyMismatchError,
                       match=r"the prompt's token ids must lie in \[0, 49152\)"):
        ctrlg.generate(lm_8k, smollm2_tokenizer, [1, 2, 10**6], dfa.phrase([3], V),
                       mode="logical", max_new_tokens=4, num_samples=2)


def test_relm_query_past_the_context_is_refused_at_once(lm_8k, smollm2_tokenizer, no_work):
    from ctrlg import relm

    query = relm.Query(pattern="The ([a-z]+)", max_tokens=16)
    with pytest.raises(ContextLengthError, match="the query's context has 8,190 tokens"):
        relm.search(lm_8k, smollm2_tokenizer, query, context_ids=[5] * 8_190)


def test_distillation_sampling_checks_the_context(lm_8k):
    from ctrlg.hmm.sampling import sample_sequences

    ids = torch.full((1, 8_180), 5)
    with pytest.raises(ContextLengthError, match="distillation prompt has 8,180 tokens"):
        sample_sequences(lm_8k, ids, torch.ones_like(ids), 32, eos_token_ids=[2],
                         generator=torch.Generator().manual_seed(0))


def test_the_editor_refuses_a_prefix_past_the_context(smollm2_tokenizer):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from app_fixtures import live_server, tiny_model
    from ctrlg.app import create_app

    model, hmm = tiny_model(smollm2_tokenizer)
    model.config.max_position_embeddings = 64
    request = {"prefix": " the cat" * 40, "suffix": " end.", "max_new_tokens": 8}
    with live_server(create_app(model, smollm2_tokenizer, hmm)) as base:
        post = urllib.request.Request(base + "/api/generate", data=json.dumps(request).encode(),
                                      headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=60)
    assert refused.value.code == 422
    body = json.loads(refused.value.read())
    assert body["error"].startswith("the prefix has 80 tokens; with max_new_tokens=8 + a 2-token "
                                    "suffix the generation needs 90 positions, but the LM reads at "
                                    "most 64"), body
