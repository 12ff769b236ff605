"""Tiny random Llama models over the SmolLM2 vocabulary, for tests that check LM-driven code
against brute force (imported by the test modules; pytest puts tests/ on the path)."""

import torch


def tiny_llama(vocab_size: int, *, seed: int, head_scale: float, layers: int = 1,
               kv_heads: int = 2, max_positions: int = 64, **config):
    """A seeded 16-wide Llama; ``head_scale`` multiplies the LM head so that the next-token
    distribution is peaky (rankings well separated)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, **config)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


class NoCacheLM(torch.nn.Module):
    """Wraps a model so that its forward returns logits only (no reusable cache)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, **_):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask)
        return type("Out", (), {"logits": out.logits})()
