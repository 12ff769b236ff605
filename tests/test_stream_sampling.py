"""The continuous-batching distillation sampler (ctrlg.hmm.stream_sampling) against the model
itself: the stepper's logits equal Hugging Face's forward, every sampled token's recorded
log-probability equals the teacher-forced one, and the sequences follow the LM's distribution
exactly (χ² over every sequence of a tiny model)."""

import itertools
import math

import pytest
import torch
from scipy.stats import chisquare

from ctrlg.errors import CtrlgError
from ctrlg.hmm.sampling import load_chunks
from ctrlg.hmm.stream_sampling import LlamaStepper, stream_sample, stream_sample_to_disk


def tiny_llama(vocab=12, seed=0, kv_heads=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                         bos_token_id=0, eos_token_id=1, pad_token_id=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # a peaked LM so that sequences end at varied lengths
        model.model.embed_tokens.weight.mul_(4.0)
    return model


def hf_logprobs(model, prefix, seqs):
    """Teacher-forced log p(x_t | prefix, x_<t) [N, L] with the model's own forward."""
    ids = torch.cat([torch.tensor(prefix).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), -1)
    P = len(prefix)
    return logp[:, P - 1:-1].gather(2, seqs[..., None])[..., 0]


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_stepper_logits_equal_the_models_forward(kv_heads):
    model = tiny_llama(kv_heads=kv_heads)
    prefix = [0, 5]
    seqs = torch.tensor([[3, 4, 7, 2], [9, 9, 1, 1], [2, 6, 8, 10]])
    from ctrlg.hmm.stream_sampling import _prefix

    stepper = LlamaStepper(model, rows=3, capacity=len(prefix) + 4)
    cache, _, first = _prefix(model, torch.tensor(prefix))
    stepper.fill_prefix(cache, len(prefix))
    with torch.no_grad():
        ids = torch.cat([torch.tensor(prefix).expand(3, -1), seqs], 1)
        reference = torch.log_softmax(model(ids).logits.float(), -1)
    assert torch.allclose(first, reference[0, 1], atol=1e-5)
    # the slots sit at different depths: slot b starts b steps late (stale columns masked)
    for step in range(4 + 2):
        positions = torch.tensor([min(max(step - b, 0), 3) for b in range(3)]) + len(prefix)
        tokens = seqs[torch.arange(3), positions - len(prefix)]
        logp = torch.log_softmax(stepper.logits(stepper.step(tokens, positions)), -1)
        for b in range(3):
            if step - b == positions[b] - len(prefix):  # this slot's step is a fresh one
                assert torch.allclose(logp[b], reference[b, positions[b]], atol=1e-5), (step, b)


def test_recorded_logprobs_are_the_teacher_forced_ones_and_padding_follows_eos():
    model = tiny_llama()
    gen = torch.Generator().manual_seed(0)
    res = stream_sample(model, [0], 200, 6, eos_token_ids=[1], generator=gen, rows=16)
    tokens, logprob = res["tokens"], res["logprob"]
    assert tokens.shape == (200, 6) and logprob.shape == (200, 6)
    reference = hf_logprobs(model, [0], tokens)
    is_eos = tokens == 1
    after = torch.cumsum(is_eos.long(), 1) - is_eos.long() > 0  # positions after the first EOS
    assert torch.allclose(logprob[~after], reference[~after], atol=1e-4)
    assert (logprob[after] == 0).all() and (tokens[after] == 1).all()
    assert is_eos.any(1).float().mean() > 0.2  # the test exercises slot reuse


def test_hidden_states_are_the_states_each_token_was_drawn_from():
    model = tiny_llama()
    gen = torch.Generator().manual_seed(3)
    res = stream_sample(model, [0, 4], 40, 5, eos_token_ids=[1], generator=gen, rows=8, return_hidden=True)
    ids = torch.cat([torch.tensor([0, 4]).expand(40, -1), res["tokens"]], 1)
    with torch.no_grad():
        states = model.model(ids).last_hidden_state[:, 1:-1]  # state before each sampled token
    live = torch.cumsum((res["tokens"] == 1).long(), 1) - (res["tokens"] == 1).long() == 0
    assert torch.allclose(res["hidden"][live], states[live], atol=1e-5)


def test_sequences_follow_the_lms_distribution_exactly():
    """χ² over every sequence of length 2 from a 6-token LM: the continuous batch (slots at
    different depths, slot reuse, first-token EOS) samples p_lm exactly."""
    model = tiny_llama(vocab=6, seed=4)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.25)  # flatter, so that every cell is populated
    L, N = 2, 12000
    res = stream_sample(model, [0], N, L, eos_token_ids=[1], generator=torch.Generator().manual_seed(1),
                        rows=64)
    seqs = [tuple(r) for r in res["tokens"].tolist()]
    cells = [c for c in itertools.product(range(6), repeat=L) if not (c[0] == 1 and c[1] != 1)]
    probs = hf_logprobs(model, [0], torch.tensor(cells))
    probs[torch.tensor([c[0] == 1 for c in cells]), 1] = 0.0  # EOS padding has probability 1
    expected = probs.sum(1).exp()
    assert math.isclose(float(expected.sum()), 1.0, rel_tol=1e-4)
    observed = torch.tensor([seqs.count(c) for c in cells], dtype=torch.float64)
    assert observed.sum() == N
    expected = expected.double() / expected.double().sum()
    stat = chisquare(observed.numpy(), (expected * N).numpy())
    assert stat.pvalue > 1e-3, stat


def test_to_disk_chunks_resume_and_shards(tmp_path):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models as tok_models

    model = tiny_llama()
    vocab = {f"t{i}": i for i in range(12)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(tok_models.WordLevel(vocab, unk_token="t2")),
                                  eos_token="t1", bos_token="t0")
    kwargs = dict(num_sequences=50, length=5, chunk_size=16, rows=8, seed=7, hidden_chunks=1)
    stats = stream_sample_to_disk(model, tok, "t0", tmp_path / "a", **kwargs)
    assert stats["sequences"] == 50 and stats["chunks_on_disk"] == 4
    whole = load_chunks(tmp_path / "a", ("tokens", "logprob", "prompt_index"))
    assert whole["tokens"].shape == (50, 5)
    assert load_chunks(tmp_path / "a", ("hidden",), chunks=[0])["hidden"].shape == (16, 5, 16)
    # two shards into another folder give the same chunks (seeded by chunk number)
    for i in range(2):
        stream_sample_to_disk(model, tok, "t0", tmp_path / "b", shard=(i, 2), **kwargs)
    assert torch.equal(load_chunks(tmp_path / "b")["tokens"], whole["tokens"])
    # resume keeps the chunks on disk; other settings are refused
    (tmp_path / "a" / "chunk_00002.safetensors").unlink()
    again = stream_sample_to_disk(model, tok, "t0", tmp_path / "a", **kwargs)
    assert again["sequences"] == 16 and torch.equal(load_chunks(tmp_path / "a")["tokens"], whole["tokens"])
    with pytest.raises(CtrlgError, match="other settings"):
        stream_sample_to_disk(model, tok, "t0", tmp_path / "a", **{**kwargs, "length": 6})


def test_bad_arguments_are_refused():
    model = tiny_llama()
    with pytest.raises(CtrlgError, match="non-empty prompt"):
        stream_sample(model, [], 4, 3, eos_token_ids=[1], generator=torch.Generator())
    with pytest.raises(CtrlgError, match="positive"):
        stream_sample(model, [0], 0, 3, eos_token_ids=[1], generator=torch.Generator())
