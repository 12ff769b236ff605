"""Linear layers of a CPU decoding step computed weight-first: y = (W · xᵀ)ᵀ for a few rows.

A decoding step multiplies a few rows x [M, d_in] (M = beams or samples, one token each) by every
weight W [d_out, d_in] of the LM. ``torch.nn.functional.linear`` computes x · Wᵀ, which the CPU
BLAS runs as a GEMM whose outer dimension is the tiny M, with the weight as the transposed
operand. The same product written W · xᵀ (then transposed back, an M × d_out copy) puts the long
d_out outermost and streams W in its stored order, so the step is bound by reading the weights
(4 · d_in · d_out bytes) rather than by a narrow kernel. The arithmetic is the same sums in
another order: outputs agree with ``F.linear`` up to float rounding.

:func:`use_skinny_linears` switches a model's ``torch.nn.Linear`` modules to :class:`SkinnyLinear`
in place (same parameters, same state dict, tied weights stay tied). Inputs of one row or of
more than :data:`MAX_ROWS` rows (a prompt's prefill), other devices and other dtypes take
``F.linear`` unchanged. :func:`ctrlg.lm.models.load_model` applies it to float32 models on the
CPU. ``benchmarks/bench_skinny_linear`` measures the step against ``F.linear`` in one process: on
a 2-core AMD EPYC (AVX2), two threads, SmolLM2-135M, ×1.75 / 1.47 / 1.30 / 1.21 faster at
4 / 8 / 32 / 64 rows and ×0.95 at one row (hence F.linear there), with next-token
log-probabilities equal to F.linear's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["MIN_ROWS", "MAX_ROWS", "SkinnyLinear", "use_skinny_linears"]

#: the rows (tokens × batch) computed weight-first; one row (a GEMV either way) and more than
#: MAX_ROWS (a prefill) go through F.linear
MIN_ROWS, MAX_ROWS = 2, 64


class SkinnyLinear(torch.nn.Linear):
    """A ``torch.nn.Linear`` whose float32 CPU forward of :data:`MIN_ROWS` … :data:`MAX_ROWS` rows
    is (W · xᵀ)ᵀ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if self.in_features else 0
        if (x.device.type != "cpu" or x.dtype != torch.float32 or self.weight.dtype != torch.float32
                or not MIN_ROWS <= rows <= MAX_ROWS):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features)
        y = torch.mm(self.weight, flat.t()).t().contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def use_skinny_linears(model: torch.nn.Module) -> int:
    """Switch every module of exact type ``torch.nn.Linear`` in ``model`` to :class:`SkinnyLinear`
    (in place; subclasses such as LoRA or quantised layers are left alone). Returns how many."""
    switched = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = SkinnyLinear
            switched += 1
    return switched
