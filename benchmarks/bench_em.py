"""EM throughput: tokens/s of the Baum-Welch E-step (and a full E+M step) at several hidden sizes.

    python -m benchmarks.bench_em                       # CPU, h ∈ {64, 256, 1024}
    python -m benchmarks.bench_em --device cuda         # adds the Triton E-step next to torch

Synthetic data: a random HMM with the SmolLM2 vocabulary (V = 49152) and token sequences of
length L sampled from it. Each configuration is timed ``--repeats`` times after a warm-up; the
table reports the median. Ratios are against references measured in the same process: the
forward-only pass (``HMM.log_prob``) for the E-step's cost, and torch for Triton's speed-up.
Writes ``benchmarks/results/bench_em.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from ctrlg import HMM
from ctrlg.hmm.em import expected_counts, m_step


def _time(fn, device, repeats: int) -> float:
    fn()  # warm-up (and Triton compilation)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_hmm(h: int, V: int, seed: int, device) -> HMM:
    g = torch.Generator().manual_seed(seed)
    params = [torch.rand(*shape, generator=g).add(0.01) for shape in ((h,), (h, h), (h, V))]
    return HMM.from_params(*params, normalize=True).to(device)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", default="64,256,1024", help="comma-separated hidden sizes")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads on CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/bench_em.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backends = ["torch"]
    if device.type == "cuda":
        from ctrlg.kernels.em_estep import triton_available
        if triton_available(device):
            backends.append("triton")

    rows = []
    for h in (int(x) for x in args.hidden.split(",")):
        hmm = random_hmm(h, args.vocab, args.seed, device)
        tokens = hmm.sample(args.sequences, args.length, seed=args.seed).to(device)
        n_tokens = tokens.numel()
        forward_s = _time(lambda: hmm.log_prob(tokens), device, args.repeats)
        row = {"h": h, "V": args.vocab, "tokens": n_tokens, "device": str(device),
               "forward_tokens_per_s": n_tokens / forward_s}
        for backend in backends:
            estep_s = _time(lambda: expected_counts(hmm, tokens, batch_size=args.batch_size,
                                                    backend=backend), device, args.repeats)
            step_s = _time(lambda: m_step(hmm, expected_counts(hmm, tokens, batch_size=args.batch_size,
                                                               backend=backend), pseudocount=1.0),
                           device, args.repeats)
            row[f"{backend}_estep_tokens_per_s"] = n_tokens / estep_s
            row[f"{backend}_em_step_tokens_per_s"] = n_tokens / step_s
            row[f"{backend}_estep_over_forward"] = estep_s / forward_s
        if "triton" in backends:
            row["triton_speedup_estep"] = row["triton_estep_tokens_per_s"] / row["torch_estep_tokens_per_s"]
        rows.append(row)

    keys = [k for k in rows[0] if k not in ("device", "V", "tokens")]
    print(f"device={device}  V={args.vocab}  tokens per measurement={rows[0]['tokens']}  "
          f"threads={torch.get_num_threads() if device.type == 'cpu' else '-'}")
    print(" | ".join(f"{k:>26}" for k in keys))
    for row in rows:
        print(" | ".join(f"{row[k]:>26.1f}" if isinstance(row[k], float) else f"{row[k]:>26}" for k in keys))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
