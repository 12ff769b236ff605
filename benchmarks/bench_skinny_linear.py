"""One LM decoding step with weight-first linear layers (:mod:`ctrlg.lm.skinny_linear`) against
``torch.nn.functional.linear``, in one process.

    python -m benchmarks.bench_skinny_linear                 # rows 1 / 4 / 8 / 32 / 64, 1 thread
    python -m benchmarks.bench_skinny_linear --threads 2

The LM is the embedded SmolLM2-135M-Instruct in float32, loaded twice: ``skinny_linears=False``
(every linear through ``F.linear``, x · Wᵀ) and the default (W · xᵀ for ≤ 64 rows). A step is one
token for each of R rows on a 96-token KV cache (transformers' own cache and attention, as the
samplers use them); it reads all 4 · 135M bytes of weights whatever R is, and costs
≈ 2 · 135M · R FLOPs. The two variants run round-robin ``--repeats`` times; each speed-up is the
median over rounds of (F.linear seconds) / (weight-first seconds) in the same round. The script
also records how far the two LMs' next-token log-probabilities are apart (max |Δ| over the
vocabulary, on random prefixes: float rounding only). Writes
``benchmarks/results/bench_skinny_linear.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from benchmarks.bench_infill_floor import step_seconds

VARIANTS = ("f_linear", "weight_first")


def logprob_gap(models: dict) -> float:
    """Max |log p_weight_first − log p_f_linear| over next tokens of two random 24-token prefixes
    (48 rows: the weight-first path)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 20000, (2, 24), generator=generator)
    with torch.no_grad():
        lp = {name: torch.log_softmax(m(ids).logits.float(), -1) for name, m in models.items()}
    return float((lp["weight_first"] - lp["f_linear"]).abs().max())


def main(argv=None) -> dict:
    from ctrlg.lm.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 32, 64])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/bench_skinny_linear.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    models = {"f_linear": load_model(None, skinny_linears=False),
              "weight_first": load_model(None, skinny_linears=True)}
    seconds = {(v, r): [] for v in VARIANTS for r in args.rows}
    for _ in range(args.repeats):
        for rows in args.rows:
            for variant in VARIANTS:
                seconds[variant, rows].append(step_seconds(models[variant], rows, steps=args.steps))
    table = []
    for rows in args.rows:
        ratios = [f / w for f, w in zip(seconds["f_linear", rows], seconds["weight_first", rows])]
        table.append({"rows": rows,
                      "f_linear_ms": 1000 * statistics.median(seconds["f_linear", rows]),
                      "weight_first_ms": 1000 * statistics.median(seconds["weight_first", rows]),
                      "speedup_median": statistics.median(ratios)})
        print(f"rows {rows:4d}: F.linear {table[-1]['f_linear_ms']:7.1f} ms, weight-first "
              f"{table[-1]['weight_first_ms']:7.1f} ms per step, ×{table[-1]['speedup_median']:.2f}",
              flush=True)
    result = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "steps": args.steps, "repeats": args.repeats, "rows": table,
              "max_abs_logprob_diff": logprob_gap(models),
              "note": "same-round ratios; absolute times depend on the machine's load"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"max |Δ log p| = {result['max_abs_logprob_diff']:.2e}; wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
