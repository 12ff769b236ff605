"""8-bit storage of the emission matrix B [h, V]: a larger h in the same checkpoint budget.

Two row-wise schemes (each row i has its own range; rows are renormalised after decoding, so
every decoded row is a distribution):

* ``log8`` — linear codes of log-probabilities: with ℓ = log B[i, v], hi = max_v ℓ and
  lo = max(min_v ℓ, hi − ``LOG_RANGE``), the code is c = round((ℓ − lo) / s), s = (hi − lo)/255,
  and B̂[i, v] ∝ exp(lo + c·s). Every probability keeps its order of magnitude: the relative error
  of an entry is at most e^{s/2} − 1 (≈ 6 % for a 30-nat range) and no entry becomes 0.
* ``normq8`` — Norm-Q (Gao & Yang 2025, arXiv 2509.25439): linear codes of the row normalised by
  its maximum, c = round(255 · B[i, v] / max_v B[i, v]), B̂[i, v] ∝ max(c, ½) · max_v B / 255.
  Entries below max/510 all decode to the same floor (Norm-Q would drop them to 0; the floor
  keeps every token possible, which the guide's ratios P(v, α)/P(v) need).

Cost: O(h·V) to encode or decode; 1 byte per entry + 8 bytes per row (h = 512, V = 49,152:
25.2 MB against 50.3 MB in bfloat16). ``docs/hmm.md`` compares their held-out log-likelihood.
"""

from __future__ import annotations

import torch

from ctrlg.errors import CheckpointError

__all__ = ["SCHEMES", "LOG_RANGE", "quantize_emission", "dequantize_emission"]

SCHEMES = ("log8", "normq8")
LOG_RANGE = 30.0
_LEVELS = 255


def quantize_emission(emission: torch.Tensor, scheme: str) -> dict[str, torch.Tensor]:
    """Codes (uint8 [h, V]) and per-row parameters (float32 [h]) of ``emission`` under
    ``scheme``; :func:`dequantize_emission` inverts it up to the rounding error."""
    if scheme not in SCHEMES:
        raise CheckpointError(f"emission quantization must be one of {SCHEMES}, got {scheme!r}")
    B = emission.detach().to("cpu", torch.float64)
    if scheme == "log8":
        logs = B.clamp_min(torch.finfo(torch.float64).tiny).log()
        hi = logs.max(1).values
        lo = torch.maximum(logs.min(1).values, hi - LOG_RANGE)
        step = ((hi - lo) / _LEVELS).clamp_min(1e-12)
        codes = ((logs - lo[:, None]) / step[:, None]).round().clamp(0, _LEVELS)
        return {"emission_codes": codes.to(torch.uint8), "emission_lo": lo.float(),
                "emission_step": step.float()}
    top = B.max(1).values.clamp_min(torch.finfo(torch.float64).tiny)
    codes = (_LEVELS * B / top[:, None]).round().clamp(0, _LEVELS)
    return {"emission_codes": codes.to(torch.uint8), "emission_lo": torch.zeros_like(top).float(),
            "emission_step": (top / _LEVELS).float()}


def dequantize_emission(tensors: dict[str, torch.Tensor], scheme: str) -> torch.Tensor:
    """The float64 emission matrix [h, V] (rows sum to 1) decoded from :func:`quantize_emission`'s
    tensors."""
    if scheme not in SCHEMES:
        raise CheckpointError(f"unknown emission quantization {scheme!r} (known: {SCHEMES})")
    missing = {"emission_codes", "emission_lo", "emission_step"} - tensors.keys()
    if missing:
        raise CheckpointError(f"a {scheme} checkpoint lacks tensors {sorted(missing)}")
    codes = tensors["emission_codes"].to(torch.float64)
    lo = tensors["emission_lo"].to(torch.float64)[:, None]
    step = tensors["emission_step"].to(torch.float64)[:, None]
    if scheme == "log8":
        logs = lo + codes * step
        probs = (logs - logs.max(1, keepdim=True).values).exp()
    else:
        probs = codes.clamp_min(0.5) * step
    return probs / probs.sum(1, keepdim=True)
