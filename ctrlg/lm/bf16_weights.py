"""bfloat16-weight linear layers for CPU decoding: half of float32's weight bytes per step.

A CPU decoding step of a small LM is bound by reading its weights (:mod:`ctrlg.lm.skinny_linear`).
Storing each linear layer's weight W [d_out, d_in] in bfloat16 (round-to-nearest-even, 8 bits of
mantissa: |W̃ − W| ≤ 2⁻⁸ |W|) and computing

    y = float32( bf16( bf16(x) · W̃ᵀ ) ) + b     (float32 accumulation, the sum rounded once)

reads 2 · d_in · d_out bytes instead of 4 · d_in · d_out (oneDNN sums the products in float32
over its packed copy of W̃, reordered once on the first product rather than on every call,
:mod:`ctrlg.kernels.packed_linear`: ×1.2–1.5 per product at a few rows;
torch's CPU matmul has no float32 output for bfloat16 operands, so each sum is rounded to
bfloat16 once before it returns to float32). Only the products are in bfloat16: the
residual stream, the normalisations, attention's softmax and the logits stay float32, which is
what keeps the next-token distribution close to the float32 LM's (a whole-model bfloat16 cast, the
``model.dtype=bfloat16`` setting, rounds every activation too and moves it ~1000× more). On CPUs
with native bfloat16 products (AVX512-BF16 or AMX, reported by
``torch.ops.mkldnn._is_mkldnn_bf16_supported()``) oneDNN runs them at full speed; elsewhere it
emulates them, with no speed measured here. ``python -m benchmarks.bench_infill_floor
--quantization`` measures the step time and the next-token KL divergence from the float32 LM
beside weight-only int8 (:mod:`ctrlg.lm.int8_weights`).

:func:`use_bf16_weights` replaces every ``torch.nn.Linear`` of a CPU model in place (an input
embedding tied to the output layer keeps its float32 copy). :func:`ctrlg.lm.models.load_model`
applies it with ``bf16_weights=True`` (``model.bf16_weights`` in the experiments' configs, the
editor's ``--weights bfloat16``); it is an approximation of the LM, not a re-ordering of its sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ctrlg.kernels.packed_linear import PackedLinear
from ctrlg.kernels.packed_linear import native_bfloat16 as native_bf16   # the one oneDNN probe
from ctrlg.lm.replace_linears import replace_linears

__all__ = ["Bf16WeightLinear", "use_bf16_weights", "native_bf16"]


class Bf16WeightLinear(torch.nn.Module):
    """y = float32(bf16(bf16(x) · W̃ᵀ)) + b with W̃ the bfloat16 rounding of a linear layer's
    weight (module docstring), on the CPU."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach()
        if weight.device.type != "cpu":
            raise ValueError(f"bfloat16 weights are a CPU decoding option; this layer is on {weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", weight.to(torch.bfloat16).clone())
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        self._packed: PackedLinear | None = None       # built on the first product (not state)
        self._packed_source: torch.Tensor | None = None

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        """bf16(x) · W̃ᵀ in bfloat16: oneDNN's packed weight where it is available (the weight
        reordered once, not on every call: :mod:`ctrlg.kernels.packed_linear`), else ``linear``."""
        x = x.to(torch.bfloat16)
        if x.numel() == 0 or self.weight.device.type != "cpu":
            return F.linear(x, self.weight)
        if self._packed is None or self._packed_source is not self.weight:
            self._packed, self._packed_source = PackedLinear(self.weight), self.weight
        if not self._packed.packed:
            return F.linear(x, self.weight)
        return self._packed(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], self.out_features)

    def __getstate__(self):                             # deepcopy / pickle: the packed copy is rebuilt
        state = self.__dict__.copy()
        state["_packed"] = state["_packed_source"] = None
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._product(x).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_bf16_weights(model: torch.nn.Module) -> int:
    """Replace every ``torch.nn.Linear`` (subclasses included) of ``model`` by a
    :class:`Bf16WeightLinear` in place. Returns how many; a model not on the CPU raises ValueError."""
    return replace_linears(model, Bf16WeightLinear)
