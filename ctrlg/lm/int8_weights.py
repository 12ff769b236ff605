"""Weight-only int8 linear layers for CPU decoding: a quarter of float32's weight bytes per step.

A CPU decoding step of a small LM is bound by reading its weights (:mod:`ctrlg.lm.skinny_linear`).
Storing each linear layer's weight W [d_out, d_in] as int8 with one scale per output channel
(symmetric round-to-nearest):

    s_o = max_i |W_oi| / 127,    q_oi = round(W_oi / s_o) ∈ [−127, 127],    W ≈ diag(s) · q

reads d_in · d_out bytes instead of 4 · d_in · d_out. The product y = x · (diag(s) · q)ᵀ + b is
computed by ``torch._weight_int8pack_mm`` on bfloat16 activations (the kernel torch ships for
weight-only int8 decoding; its float32-activation path is many times slower on a CPU), with
float accumulation; activations are rounded to bfloat16, not quantised. Each weight moves by at
most s_o / 2, so this is an approximation of the LM, not a re-ordering of its sums:
``python -m benchmarks.bench_infill_floor --threads 2 --quantization`` measures its next-token
KL divergence from the float32 LM (0.0048 nats on six story passages, NLL per token 3.683 →
3.684) and its step time (×1.40 at 4 rows on a 2-core AMD EPYC, against the weight-first float32
step).

:func:`use_int8_weights` replaces every ``torch.nn.Linear`` of a CPU model in place (their float
weights are released; an input embedding tied to the output layer keeps its float copy; layers
of other types, such as GPT-2's ``Conv1D``, stay float).
:func:`ctrlg.lm.models.load_model` applies it with ``int8_weights=True`` (``model.int8_weights``
in the experiments' configs); it is off by default, since it changes outputs beyond float
rounding.
"""

from __future__ import annotations

import torch

from ctrlg.lm.replace_linears import replace_linears

__all__ = ["Int8WeightLinear", "use_int8_weights"]


class Int8WeightLinear(torch.nn.Module):
    """y = x · (diag(s) · q)ᵀ + b with int8 weights q [d_out, d_in] and one scale s_o per output
    channel (module docstring), on the CPU."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        if weight.device.type != "cpu":
            raise ValueError(f"int8 weights are a CPU decoding option; this layer is on {weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scales = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
        self.register_buffer("q", torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(torch.bfloat16))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(flat, self.q, self.scales).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_int8_weights(model: torch.nn.Module) -> int:
    """Replace every ``torch.nn.Linear`` (subclasses included) of ``model`` by an
    :class:`Int8WeightLinear` in place. Returns how many; a model not on the CPU raises ValueError."""
    return replace_linears(model, Int8WeightLinear)
