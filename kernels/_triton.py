"""Optional Triton import shared by the kernels: Triton runs on CUDA GPUs, and on CPU tensors
under ``TRITON_INTERPRET=1`` (the tests' interpreter mode)."""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

__all__ = ["triton", "tl", "triton_available"]


def triton_available(device: torch.device | str) -> bool:
    """Whether the Triton path can run for tensors on ``device``."""
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
