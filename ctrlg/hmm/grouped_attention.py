"""Grouped-query attention without repeating K/V, for fast batched CPU decoding.

For query heads grouped g = H / H_kv per key/value head, with an additive mask M (0 or −∞)::

    out[b, j·g + i, q] = Σ_t softmax_t(scale · Q[b, j·g + i, q] · K[b, j, t] + M[b, q, t]) · V[b, j, t]

computed as two batched matmuls over (b, j) with the g·q query rows of a group stacked, so K and
V are never copied g times (transformers' eager path calls ``repeat_kv``; its SDPA path is slow in
bfloat16 on CPU). The softmax runs in float32. Cost per layer: O(B · H · q · T · head_dim).

Registered with transformers under :data:`GROUPED_ATTENTION` (attention function + the eager
additive mask), so ``from_pretrained(..., attn_implementation=GROUPED_ATTENTION)`` or
``model.set_attn_implementation(GROUPED_ATTENTION)`` selects it after :func:`register`.
"""

from __future__ import annotations

import torch

__all__ = ["GROUPED_ATTENTION", "grouped_attention_forward", "register"]

GROUPED_ATTENTION = "ctrlg_grouped"


def grouped_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                              **kwargs):
    """query [B, H, q, D], key/value [B, H_kv, T, D], attention_mask additive [B, 1, q, T] (or None).
    Returns (output [B, q, H, D], None), the contract of transformers' attention functions."""
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise NotImplementedError("grouped attention supports neither sliding windows nor soft-capping; "
                                  "load the model with attn_implementation='sdpa'")
    B, H, q, D = query.shape
    H_kv, T = key.shape[1], key.shape[2]
    g = H // H_kv
    scores = torch.matmul(query.reshape(B, H_kv, g * q, D), key.transpose(2, 3)).float() * scaling
    scores = scores.view(B, H_kv, g, q, T)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, -T:].float()
    weights = torch.softmax(scores, -1).to(value.dtype).view(B, H_kv, g * q, T)
    out = torch.matmul(weights, value).view(B, H, q, D)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the attention function and its mask builder with transformers (idempotent);
    returns the implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask

    AttentionInterface.register(GROUPED_ATTENTION, grouped_attention_forward)
    if GROUPED_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(GROUPED_ATTENTION, eager_mask)
    return GROUPED_ATTENTION
