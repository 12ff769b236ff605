"""Backward-table benchmark: one step of the Ctrl-G recurrence W_r = G · Aᵀ (``ctrlg.guide``).

Implementations: the plain-torch reference ``ctrlg.guide.backward_step_reference`` and the Triton
kernel ``ctrlg.kernels.backward_table.backward_step`` on random inputs
(:func:`benchmarks.gpu.fixtures.backward_step_inputs`), with ``w_prev`` and ``transition`` in
float32 and, for the kernel, also in bf16 (fp32 accumulation either way). As a practical ceiling
the section also times the bare (S×h)·(h×h) product in cuBLAS (``torch.matmul``) in bf16.

FLOP model, one step with S DFA states, E exception edges, hidden size h::

    G · Aᵀ                         2·S·h²
    G (default + exceptions + EOS)  3·S·h + 3·E·h      (gathers, multiply-adds)

Byte model (minimum traffic)::

    Aᵀ read once                    h² · bytes(A)
    Ŵ rows, M, EOS term, G, output  4·S·h · 4 + S·h · bytes(Ŵ)
    exceptions                      E·h · (4 + bytes(Ŵ))

Reported: achieved TFLOP/s = FLOPs / median seconds, fractions of the device's peak per precision
(the issue's goal: ≥ 50 % of dense bf16 at h = 4096), fraction of HBM bandwidth, and the max
relative error of each kernel output against the reference on the same inputs.
"""

from __future__ import annotations

import math

import torch

from benchmarks.gpu.fixtures import backward_step_inputs
from benchmarks.gpu.peaks import fraction_of_bandwidth, fractions_of_peak
from benchmarks.gpu.timing import measure

__all__ = ["SIZES", "run", "step_flops", "step_bytes", "MARKDOWN_COLUMNS"]

SIZES = {
    "tiny": dict(hidden_sizes=[16], num_states=[4], exceptions_per_state=2, repeats=2, warmup=0),
    "full": dict(hidden_sizes=[1024, 4096, 16384], num_states=[10, 100, 1000],
                 exceptions_per_state=6, repeats=10, warmup=3),
}

MARKDOWN_COLUMNS = [
    ("impl", "impl", "{}"), ("dtype", "Ŵ, A dtype", "{}"), ("hidden_size", "h", "{}"),
    ("num_states", "S", "{}"), ("median_s", "ms/step", "ms"), ("tflops", "TFLOP/s", "{:.3g}"),
    ("fraction_of_peak.bf16", "of bf16 peak", "pct"), ("fraction_of_peak.fp32", "of fp32 peak", "pct"),
    ("fraction_of_bandwidth", "of HBM", "pct"), ("speedup_vs_torch", "× torch", "{:.3g}"),
    ("max_rel_err_vs_torch", "max rel err", "{:.1e}"),
]


def step_flops(S: int, h: int, E: int) -> float:
    """2·S·h² + 3·S·h + 3·E·h (module docstring)."""
    return 2.0 * S * h * h + 3.0 * S * h + 3.0 * E * h


def step_bytes(S: int, h: int, E: int, elem: int) -> float:
    """Minimum bytes of one step with ``elem``-byte Ŵ and A (module docstring)."""
    return h * h * elem + 16.0 * S * h + S * h * elem + E * h * (4 + elem)


def _args(inputs: dict) -> tuple:
    keys = ("w_prev", "default", "coef_default", "nonexc_mass", "exc_src", "exc_dst",
            "exc_row", "emission_rows", "coef_exc", "eos_term", "coef_eos", "transition")
    return tuple(inputs[k] for k in keys)


def _row(impl: str, dtype: torch.dtype, S: int, h: int, E: int, timing, peak) -> dict:
    elem = torch.tensor([], dtype=dtype).element_size()
    seconds = timing.median_s
    flops = step_flops(S, h, E) / seconds
    return {"impl": impl, "dtype": str(dtype).replace("torch.", ""), "hidden_size": h,
            "num_states": S, "exceptions": E, **timing.as_dict(), "tflops": flops / 1e12,
            "fraction_of_peak": fractions_of_peak(flops, peak),
            "fraction_of_bandwidth": fraction_of_bandwidth(step_bytes(S, h, E, elem) / seconds, peak)}


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def run(size: str, device: torch.device, *, seed: int = 0, peak=None, hidden_sizes=None) -> dict:
    """Benchmark the reference, the kernel (fp32 and bf16 inputs) and the cuBLAS bf16 product."""
    from ctrlg.guide import backward_step_reference

    params = dict(SIZES[size])
    if hidden_sizes:
        params["hidden_sizes"] = list(hidden_sizes)
    rows, skipped = [], []
    try:
        from ctrlg.kernels.backward_table import backward_step, triton_available
        kernel_ok = triton_available(device)
        if not kernel_ok:
            skipped.append({"impl": "triton", "reason": f"Triton cannot run on {device} "
                            "(no CUDA and TRITON_INTERPRET is not 1)"})
    except ImportError as err:
        kernel_ok = False
        skipped.append({"impl": "triton", "reason": f"ctrlg.kernels.backward_table unavailable ({err})"})
    timed = dict(warmup=params["warmup"], repeats=params["repeats"])
    for h in params["hidden_sizes"]:
        for S in params["num_states"]:
            inputs = backward_step_inputs(S, h, exceptions_per_state=params["exceptions_per_state"],
                                          seed=seed, device=device)
            E = int(inputs["exc_src"].numel())
            args = _args(inputs)
            reference = backward_step_reference(*args)
            t_ref = measure(lambda: backward_step_reference(*args), device, **timed)
            ref_row = _row("torch", torch.float32, S, h, E, t_ref, peak)
            rows.append(ref_row)
            if kernel_ok:
                for dtype in (torch.float32, torch.bfloat16):
                    cast = dict(inputs, w_prev=inputs["w_prev"].to(dtype),
                                transition=inputs["transition"].to(dtype))
                    kargs = _args(cast)
                    try:
                        out = backward_step(*kargs)
                        t_k = measure(lambda: backward_step(*kargs), device, **timed)
                    except Exception as err:  # record the failure, keep benchmarking
                        skipped.append({"impl": "triton", "dtype": str(dtype), "hidden_size": h,
                                        "num_states": S, "reason": f"{type(err).__name__}: {err}"})
                        continue
                    row = _row("triton", dtype, S, h, E, t_k, peak)
                    # bf16 inputs: compare with the reference on the same rounded inputs
                    ref = reference if dtype == torch.float32 else backward_step_reference(
                        *_args(dict(inputs, w_prev=cast["w_prev"].float(),
                                    transition=cast["transition"].float())))
                    row["max_rel_err_vs_torch"] = _rel_err(out, ref)
                    row["speedup_vs_torch"] = ref_row["median_s"] / row["median_s"]
                    rows.append(row)
            g = torch.rand(S, h, device=device, dtype=torch.bfloat16)
            a_t = inputs["transition"].to(torch.bfloat16).T.contiguous()
            t_mm = measure(lambda: g @ a_t, device, **timed)
            row = _row("cublas matmul only", torch.bfloat16, S, h, 0, t_mm, peak)
            row["tflops"] = 2.0 * S * h * h / t_mm.median_s / 1e12
            row["fraction_of_peak"] = fractions_of_peak(row["tflops"] * 1e12, peak)
            rows.append(row)
            del inputs, args, reference, g, a_t
            if device.type == "cuda":
                torch.cuda.empty_cache()
    for row in rows:
        if not (math.isfinite(row["median_s"]) and row["median_s"] > 0):
            raise RuntimeError(f"non-positive timing in {row}")
    return {"description": "one backward-table step W_r = G·Aᵀ on random DFA/HMM inputs",
            "flop_model": "2*S*h^2 + 3*S*h + 3*E*h per step",
            "byte_model": "h^2*bytes(A) + 16*S*h + S*h*bytes(W) + E*h*(4 + bytes(W))",
            "goal": ">= 50% of dense bf16 peak at h = 4096 (fp32 accumulation)",
            "rows": rows, "skipped": skipped}
