"""x · Wᵀ with W packed once: the CPU product behind Ctrl-G's per-token guidance.

The guide multiplies a few rows (2 per generated sequence: the prior p and p ⊙ Ŵ) by the same
emission matrix B [V, h] at every token. ``torch.nn.functional.linear`` hands the weight to
oneDNN in its plain layout and oneDNN reorders it into its blocked layout on every call — an
extra pass over all V·h weights, which dominates at a few rows (measured on an AVX512-BF16 CPU,
V = 49152, h = 256, one thread: bfloat16 0.9 ms packed vs 2.0 ms plain at 3 rows; float32 1.9 vs
11 ms). :class:`PackedLinear` does the reorder once, as torch's inductor does for frozen CPU
linears (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``); the result is the
same product (the probe below checks it).

Where oneDNN is unavailable (another device, a build without it, bfloat16 on a CPU without
native bfloat16 dot products) or the private ops are missing or disagree with ``linear`` on a
probe, it falls back to ``torch.nn.functional.linear`` on the plain weight: same values, the old
speed. ``python -m benchmarks.bench_batch`` measures the effect.
"""

from __future__ import annotations

import torch

__all__ = ["PackedLinear", "native_bfloat16"]

#: oneDNN's reorder takes the expected number of rows as a hint; a typical batch.
BATCH_HINT = 32


class PackedLinear:
    """``y = x · weightᵀ`` ([R, h] · [h, N] → [R, N] in the weight's dtype; bfloat16 accumulates
    in float32). ``packed`` tells whether the oneDNN-packed path is in use."""

    def __init__(self, weight: torch.Tensor, batch_hint: int = BATCH_HINT):
        self.dtype = weight.dtype
        self._packed = _pack(weight, batch_hint)
        self._weight = None if self._packed is not None else weight

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        if self._packed is None:
            return torch.nn.functional.linear(x, self._weight)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, None, "none", [], "")


def native_bfloat16() -> bool:
    """Whether this CPU's oneDNN computes bfloat16 products natively (AVX512-BF16 / AMX)."""
    try:
        return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):
        return False


def _pack(weight: torch.Tensor, batch_hint: int) -> torch.Tensor | None:
    """The oneDNN-packed weight, or None where that path is unavailable or disagrees with
    ``linear`` on a probe (rows of varied scale, so a wrong layout cannot pass)."""
    if weight.device.type != "cpu" or weight.dim() != 2 or not torch.backends.mkldnn.is_available():
        return None
    if weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    if weight.dtype == torch.bfloat16 and not native_bfloat16():
        return None
    weight = weight.contiguous()
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        gen = torch.Generator().manual_seed(0)
        probe = torch.rand(3, weight.shape[1], generator=gen).to(weight.dtype)
        got = torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    want = torch.nn.functional.linear(probe, weight)
    scale = float(want.float().abs().max()) or 1.0
    if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-3 * scale):
        return None
    return packed
