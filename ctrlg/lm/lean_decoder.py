"""A Llama decoding forward in fewer, larger operations, for small LMs on a CPU.

A decoding step of a 30-layer, 576-wide Llama (SmolLM2-135M) at a few rows is short on
arithmetic: on a 2-core CPU with bfloat16 weights its matrix products take ≈ 18 ms, and
transformers' module-by-module forward spends as long again on ≈ 60 small operations and module
calls per layer (the norms' five passes, the rotary embedding's slices and concatenations, the KV
cache's concatenation, seven separate products). :class:`LeanLlama` computes the same function per
layer ℓ, with the same weights:

    n = RMSNorm(h; g_ℓ)                                  (``torch.nn.functional.rms_norm``)
    [q | k | v] = n · [W_q | W_k | W_v]ᵀ                 (one product)
    q, k ← q ⊙ cos + rot(q) ⊙ sin, k ⊙ cos + rot(k) ⊙ sin (the model's own rotary cos / sin)
    K, V ← the cache with k, v appended                  (written in place: :mod:`.growing_cache`)
    a = softmax(q Kᵀ / √d + M) V                         (``scaled_dot_product_attention``, GQA)
    h ← h + a · W_oᵀ
    [g | u] = RMSNorm(h; g'_ℓ) · [W_gate | W_up]ᵀ         (one product)
    h ← h + (silu(g) ⊙ u) · W_downᵀ

then the final norm and the LM head, where M is 0 where a key slot is unmasked and not after the
query's slot, −∞ elsewhere (the causal mask over cache slots that transformers builds from a 2-D
attention mask). The fused products keep each layer's kind: bfloat16 weights
(:class:`~ctrlg.lm.bf16_weights.Bf16WeightLinear`) stay bfloat16 with the same rounding of each
sum, float32 ones stay float32 (and weight-first where the model's are,
:class:`~ctrlg.lm.skinny_linear.SkinnyLinear`). The outputs equal transformers' up to float
rounding (tests compare both on random Llamas, prompts, padded ragged steps and beam reorders).

:func:`lean_llama` returns None for a model this does not cover (another architecture, a rope
scaling other than the default, biases, int8 or LoRA layers, a model computed in bfloat16 or
float16 (``model.dtype``, whose norms transformers computes in float32), a GPU): callers then run
the model itself. The fused weights are built once per model and kept on it (``_ctrlg_lean``, rebuilt if its
linear layers are swapped; weights changed in place afterwards are not seen); they add a copy of
the fused layers' weights (≈ 150 MB in bfloat16 for SmolLM2-135M).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ctrlg.lm.bf16_weights import Bf16WeightLinear
from ctrlg.lm.skinny_linear import SkinnyLinear

__all__ = ["LeanLlama", "lean_llama"]

_FLOAT_KINDS = (torch.nn.Linear, SkinnyLinear)


def _fused(linears: list[torch.nn.Module]) -> torch.nn.Module | None:
    """One linear layer whose output is the outputs of ``linears`` side by side, of their kind;
    None when they are of different or unsupported kinds or carry a bias."""
    kinds = {type(layer) for layer in linears}
    if len(kinds) != 1 or any(getattr(layer, "bias", None) is not None for layer in linears):
        return None
    kind = kinds.pop()
    if kind is Bf16WeightLinear:
        weight = torch.cat([layer.weight for layer in linears]).float()   # bfloat16 values: exact
    elif kind in _FLOAT_KINDS:
        weight = torch.cat([layer.weight.detach() for layer in linears])
    else:
        return None
    plain = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    plain.weight = torch.nn.Parameter(weight, requires_grad=False)
    if kind is Bf16WeightLinear:
        return Bf16WeightLinear(plain)
    if kind is SkinnyLinear:
        plain.__class__ = SkinnyLinear
    return plain


class _Layer:
    """One decoder layer's fused products and norm weights."""

    def __init__(self, layer):
        attention, mlp = layer.self_attn, layer.mlp
        self.qkv = _fused([attention.q_proj, attention.k_proj, attention.v_proj])
        self.o = attention.o_proj
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj])
        self.down = mlp.down_proj
        self.split = (attention.q_proj.out_features, attention.k_proj.out_features,
                      attention.v_proj.out_features)
        self.intermediate = mlp.gate_proj.out_features
        self.norm_in, self.norm_post = layer.input_layernorm, layer.post_attention_layernorm

    @property
    def complete(self) -> bool:
        return self.qkv is not None and self.gate_up is not None and \
            type(self.o) in (*_FLOAT_KINDS, Bf16WeightLinear) and \
            type(self.down) in (*_FLOAT_KINDS, Bf16WeightLinear)


def _supported_config(config) -> bool:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
    return (getattr(config, "model_type", None) == "llama" and rope_type == "default"
            and not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
            and getattr(config, "hidden_act", None) == "silu"
            and getattr(config, "pretraining_tp", 1) == 1)


class LeanLlama:
    """``model``'s decoding forward (module docstring). Call with ``input_ids`` [R, W],
    ``attention_mask`` [R, past + W] (0/1 over every cache slot and the new ones),
    ``position_ids`` [R, W] and a ``cache`` (a :class:`~ctrlg.lm.growing_cache.GrowingCache`, or
    any transformers ``Cache``); returns the logits [R, W, V] in float32 and updates the cache."""

    def __init__(self, model):
        config = model.config
        self.model = model
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.layers = [_Layer(layer) for layer in model.model.layers]
        self.scale = 1.0 / math.sqrt(self.head_dim)

    @property
    def complete(self) -> bool:
        return all(layer.complete for layer in self.layers)

    @staticmethod
    def _norm(x: torch.Tensor, norm) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return torch.addcmul(x * cos, rotated, sin)

    def _mask(self, attention_mask: torch.Tensor, width: int) -> torch.Tensor:
        """[R, 1, W, L] bool: slot j is visible to new position i iff it is unmasked and j ≤
        past + i."""
        length = attention_mask.shape[1]
        past = length - width
        slots = torch.arange(length, device=attention_mask.device)
        causal = slots[None, :] <= (past + torch.arange(width, device=attention_mask.device))[:, None]
        return (causal[None] & attention_mask.bool()[:, None, :])[:, None]

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor, cache) -> torch.Tensor:
        model = self.model
        R, W = input_ids.shape
        h = model.model.embed_tokens(input_ids)
        cos, sin = model.model.rotary_emb(h, position_ids)
        cos, sin = cos[:, None].to(h.dtype), sin[:, None].to(h.dtype)         # [R, 1, W, D]
        mask = self._mask(attention_mask, W)
        D, Hq, Hk = self.head_dim, self.heads, self.kv_heads
        for index, layer in enumerate(self.layers):
            q, k, v = layer.qkv(self._norm(h, layer.norm_in)).split(layer.split, dim=-1)
            q = self._rotate(q.view(R, W, Hq, D).transpose(1, 2), cos, sin)
            k = self._rotate(k.view(R, W, Hk, D).transpose(1, 2), cos, sin)
            v = v.view(R, W, Hk, D).transpose(1, 2)
            keys, values = cache.update(k, v, index)
            attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                                      enable_gqa=Hq != Hk)
            h = h + layer.o(attended.transpose(1, 2).reshape(R, W, Hq * D))
            gate, up = layer.gate_up(self._norm(h, layer.norm_post)).split(layer.intermediate, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        return model.lm_head(self._norm(h, model.model.norm)).float()


def _fingerprint(model) -> tuple:
    """The identity and kind of every decoder linear layer: a model whose layers were swapped since
    (another weight format) gets a new :class:`LeanLlama`."""
    return tuple((id(module), type(module)) for layer in model.model.layers
                 for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                                layer.mlp.gate_proj, layer.mlp.up_proj))


def lean_llama(model) -> LeanLlama | None:
    """The :class:`LeanLlama` of ``model`` (built once and kept on it, rebuilt when its layers are
    swapped), or None where it does not apply (module docstring)."""
    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return None
    if device.type != "cpu" or not _supported_config(getattr(model, "config", None)) \
            or not hasattr(getattr(model, "model", None), "layers") or not hasattr(model, "lm_head") \
            or getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "eager") \
            or model.get_input_embeddings().weight.dtype != torch.float32:
        return None
    key = _fingerprint(model)
    cached = model.__dict__.get("_ctrlg_lean")
    if cached is not None and cached[0] == key:
        return cached[1]
    lean = LeanLlama(model)
    lean = lean if lean.complete else None
    model.__dict__["_ctrlg_lean"] = (key, lean)
    return lean
