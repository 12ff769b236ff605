"""ctrlg.hmm.grouped_attention equals transformers' eager attention (padding, KV cache, GQA)."""

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_attention_equals_eager(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    from ctrlg.hmm.grouped_attention import GROUPED_ATTENTION, register
    from ctrlg.lm.shared_context import cache_keyword, returned_cache

    register()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval().to(dtype)
    ids = torch.randint(0, 40, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    outputs = {}
    with torch.no_grad():
        for impl in ("eager", GROUPED_ATTENTION):
            model.set_attn_implementation(impl)
            full = model(ids, attention_mask=mask).logits
            prefix = model(ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
            step = model(ids[:, 6:], attention_mask=mask,
                         **{cache_keyword(model): returned_cache(prefix)}).logits
            outputs[impl] = (full, step)
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(outputs["eager"], outputs[GROUPED_ATTENTION]):
        torch.testing.assert_close(a[mask[:, -a.shape[1]:].bool()].float(), b[mask[:, -b.shape[1]:].bool()].float(),
                                   atol=atol, rtol=atol)
