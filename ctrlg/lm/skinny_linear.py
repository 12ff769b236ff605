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
``F.linear`` unchanged. ``benchmarks/bench_skinny_linear`` measures the step against
``F.linear`` in one process (two threads, SmolLM2-135M, next-token log-probabilities equal to
F.linear's on both machines):

* a 2-core AMD EPYC (AVX2): ×1.75 / 1.47 / 1.30 / 1.21 faster at 4 / 8 / 32 / 64 rows, ×0.95 at
  one row (hence F.linear there);
* a 2-core Intel Xeon (AVX512-BF16, AMX): ×0.72 / 0.87 / 0.90 / 0.84, ×0.99 at one row. Intel's
  math library, which runs ``F.linear`` on the CPU wheels, multiplies a few rows well on Intel
  CPUs, so the re-ordering only pays elsewhere.

:func:`ctrlg.lm.models.load_model` applies it to float32 models on the CPU when
:func:`weight_first_helps` (``skinny_linears="auto"``, the default), or as told (True / False).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["MIN_ROWS", "MAX_ROWS", "SkinnyLinear", "use_skinny_linears", "weight_first_helps",
           "resolve_skinny_linears"]

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


def cpu_vendor() -> str | None:
    """The CPU's vendor id as Linux reports it (``GenuineIntel``, ``AuthenticAMD``, …), or None
    where /proc/cpuinfo is not readable or names none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def weight_first_helps() -> bool:
    """Whether weight-first steps are expected to beat ``F.linear`` on this CPU: everywhere but on
    Intel CPUs (module docstring: measured ×1.75 faster on an AMD EPYC, ×0.72 on an Intel Xeon, at
    4 rows)."""
    return cpu_vendor() != "GenuineIntel"


def resolve_skinny_linears(setting) -> bool:
    """``True`` / ``False`` as given, ``"auto"`` (or None) → :func:`weight_first_helps`; anything
    else raises ValueError naming the setting."""
    if setting is None or (isinstance(setting, str) and setting.lower() == "auto"):
        return weight_first_helps()
    if isinstance(setting, bool):
        return setting
    if isinstance(setting, str) and setting.lower() in ("true", "false"):
        return setting.lower() == "true"
    raise ValueError(f"skinny_linears={setting!r}: expected true, false or auto")
