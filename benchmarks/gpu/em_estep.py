"""E-step benchmark: expected counts of one batch of token sequences (Baum-Welch, ``ctrlg.hmm.em``).

Implementations: the plain-torch reference ``ctrlg.hmm.em.estep_torch``, the Triton kernel
``ctrlg.kernels.em_estep.estep_triton`` (same arguments, same :class:`ExpectedCounts`), and, when
``import pyjuice`` works, pyjuice's homogeneous HMM (forward + backward "flows", i.e. its E-step).

FLOP model, per token (batch n × length L, hidden size h; every term a vector-matrix product)::

    forward    α̂_t = (α̂_{t-1} A) ⊙ E_t              2h²
    backward   β̂_t = A (E_{t+1} ⊙ β̂_{t+1}) / c       2h²
    counts     Σ_t α̂_tᵀ (E_{t+1} ⊙ β̂_{t+1})          2h²
    ---------------------------------------------------------
    total                                            6h²  (+ O(h) emission gathers/scatters)

Byte model (float32, the minimum traffic of an unfused implementation)::

    per token: E_t gathered twice, α̂, β̂ written and read, γ scattered   ≈ 4 · 8h bytes
    per call:  A read once per time step and pass (3 passes)            ≈ 3 · L · 4h² bytes

Reported: tokens/s = n·L / median seconds; achieved FLOP/s = 6h²·n·L / seconds; fractions of the
device's peak (``peaks.py``); agreement with the torch reference (max relative error of the
transition and emission counts and of the log-likelihood).
"""

from __future__ import annotations

import math

import torch

from benchmarks.gpu.fixtures import random_hmm
from benchmarks.gpu.peaks import fraction_of_bandwidth, fractions_of_peak
from benchmarks.gpu.timing import measure

__all__ = ["SIZES", "run", "flops_per_token", "bytes_per_call", "MARKDOWN_COLUMNS"]

#: Shapes per size: hidden sizes, vocabulary, batch × length (Ctrl-G distils on length-32 samples).
SIZES = {
    "tiny": dict(hidden_sizes=[8], vocab_size=32, batch=2, length=4, repeats=2, warmup=0),
    "full": dict(hidden_sizes=[1024, 4096], vocab_size=49152, batch=256, length=32, repeats=5,
                 warmup=2),
}

MARKDOWN_COLUMNS = [
    ("impl", "impl", "{}"), ("hidden_size", "h", "{}"), ("batch", "batch", "{}"),
    ("length", "L", "{}"), ("median_s", "ms/call", "ms"), ("tokens_per_s", "tokens/s", "{:.3g}"),
    ("tflops", "TFLOP/s", "{:.3g}"), ("fraction_of_peak.fp32", "of fp32 peak", "pct"),
    ("fraction_of_peak.tf32", "of tf32 peak", "pct"), ("fraction_of_peak.bf16", "of bf16 peak", "pct"),
    ("fraction_of_bandwidth", "of HBM", "pct"), ("speedup_vs_torch", "× torch", "{:.3g}"),
    ("max_rel_err_vs_torch", "max rel err", "{:.1e}"),
]


def flops_per_token(h: int) -> float:
    """6h² (module docstring)."""
    return 6.0 * h * h


def bytes_per_call(h: int, batch: int, length: int) -> float:
    """32h bytes per token + 12·L·h² bytes of transition reads (module docstring)."""
    return 32.0 * h * batch * length + 12.0 * length * h * h


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _compare(counts, reference) -> float:
    """Worst relative error over initial, transition, emission counts and the log-likelihood."""
    errs = [_rel_err(counts.initial, reference.initial),
            _rel_err(counts.transition, reference.transition),
            _rel_err(counts.emission, reference.emission),
            abs(float(counts.loglik) - float(reference.loglik)) / max(1.0, abs(float(reference.loglik)))]
    return max(errs)


def _row(impl: str, h: int, batch: int, length: int, timing, peak) -> dict:
    tokens = batch * length
    flops = flops_per_token(h) * tokens / timing.median_s
    return {"impl": impl, "hidden_size": h, "batch": batch, "length": length,
            **timing.as_dict(), "tokens_per_s": tokens / timing.median_s, "tflops": flops / 1e12,
            "fraction_of_peak": fractions_of_peak(flops, peak),
            "fraction_of_bandwidth": fraction_of_bandwidth(bytes_per_call(h, batch, length)
                                                           / timing.median_s, peak)}


def _pyjuice_row(h: int, V: int, tokens: torch.Tensor, device, params: dict, peak) -> dict:
    """pyjuice's homogeneous HMM: forward (log-likelihoods) + backward (parameter flows)."""
    import pyjuice as juice

    root = juice.structures.HMM(seq_length=tokens.shape[1], num_latents=h, num_emits=V,
                                homogeneous=True)
    pc = juice.compile(root)
    pc.to(device)

    def estep():
        pc.init_param_flows(flows_memory=0.0)
        pc(tokens, propagation_alg="LL")
        pc.backward(tokens, flows_memory=1.0, allow_modify_flows=False, propagation_alg="LL",
                    logspace_flows=True)

    timing = measure(estep, device, warmup=params["warmup"], repeats=params["repeats"])
    return _row("pyjuice", h, tokens.shape[0], tokens.shape[1], timing, peak)


def run(size: str, device: torch.device, *, seed: int = 0, peak=None, hidden_sizes=None) -> dict:
    """Benchmark every available implementation at each hidden size of ``SIZES[size]``."""
    from ctrlg.hmm.em import estep_torch

    params = dict(SIZES[size])
    if hidden_sizes:
        params["hidden_sizes"] = list(hidden_sizes)
    V, n, L = params["vocab_size"], params["batch"], params["length"]
    rows, skipped = [], []
    try:
        from ctrlg.kernels.em_estep import estep_triton, triton_available
        if not triton_available(device):  # the launcher would silently fall back to torch
            estep_triton = None
            skipped.append({"impl": "triton", "reason": f"Triton cannot run on {device} "
                            "(no CUDA and TRITON_INTERPRET is not 1)"})
    except ImportError as err:  # the kernel module or Triton is missing
        estep_triton = None
        skipped.append({"impl": "triton", "reason": f"ctrlg.kernels.em_estep unavailable ({err})"})
    try:
        import pyjuice  # noqa: F401
        have_pyjuice = device.type == "cuda"
        if not have_pyjuice:
            skipped.append({"impl": "pyjuice", "reason": "pyjuice runs on CUDA only"})
    except ImportError as err:
        have_pyjuice = False
        skipped.append({"impl": "pyjuice", "reason": f"pyjuice is not installed ({err})"})
    for h in params["hidden_sizes"]:
        hmm = random_hmm(h, V, seed=seed, device=device)
        g = torch.Generator(device=device).manual_seed(seed + 1)
        tokens = torch.randint(0, V, (n, L), generator=g, device=device)
        args = (hmm.initial, hmm.transition, hmm.emission, tokens)
        reference = estep_torch(*args)
        timing = measure(lambda: estep_torch(*args), device, warmup=params["warmup"],
                         repeats=params["repeats"])
        torch_row = _row("torch", h, n, L, timing, peak)
        torch_row["loglik_per_token"] = float(reference.loglik) / (n * L)
        rows.append(torch_row)
        if estep_triton is not None:
            try:
                counts = estep_triton(*args)
                timing = measure(lambda: estep_triton(*args), device, warmup=params["warmup"],
                                 repeats=params["repeats"])
                row = _row("triton", h, n, L, timing, peak)
                row["max_rel_err_vs_torch"] = _compare(counts, reference)
                row["loglik_per_token"] = float(counts.loglik) / (n * L)
                row["speedup_vs_torch"] = torch_row["median_s"] / row["median_s"]
                rows.append(row)
            except Exception as err:  # a failing kernel is a finding, not a crash of the harness
                skipped.append({"impl": "triton", "hidden_size": h, "reason": f"{type(err).__name__}: {err}"})
        if have_pyjuice:
            try:
                row = _pyjuice_row(h, V, tokens, device, params, peak)
                row["speedup_vs_torch"] = torch_row["median_s"] / row["median_s"]
                rows.append(row)
            except Exception as err:
                skipped.append({"impl": "pyjuice", "hidden_size": h, "reason": f"{type(err).__name__}: {err}"})
        del hmm, reference
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for row in rows:
        for key in ("median_s", "tokens_per_s"):
            if not (math.isfinite(row[key]) and row[key] > 0):
                raise RuntimeError(f"non-positive timing {key}={row[key]} in {row}")
    return {"description": "Baum-Welch E-step (expected counts) on random HMMs and random tokens",
            "flop_model": "6h^2 per token (forward 2h^2 + backward 2h^2 + transition counts 2h^2)",
            "byte_model": "32h bytes per token + 12*L*h^2 per call (float32)",
            "vocab_size": V, "rows": rows, "skipped": skipped}
