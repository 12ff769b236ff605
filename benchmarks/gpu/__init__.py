"""The GPU benchmark harness (``python -m benchmarks.gpu``): Triton kernels against their torch
references and the device's peak, per-token guidance overhead against the LM step, and HMM
distillation at scale. See docs/gpu.md and ``benchmarks/gpu/__main__.py``."""
