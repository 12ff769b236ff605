"""Cost of one LM decoding step in float32 against bfloat16 weights (``model.dtype``), the step
that dominates beam search in the CommonGen pipelines, measured in one process.

    python -m benchmarks.bench_lm_dtype                  # rows 8 / 32 / 128, 3 rounds

The LM is the adapted CommonGen pipeline's (the embedded SmolLM2-135M-Instruct with the
``commongen-human-balanced`` LoRA adapter merged; the recorded run used the earlier ``commongen``
adapter, of the same shapes), one torch thread. A step is one token for each of R rows on
top of a 16-token KV cache (transformers' own cache and attention, as the decoder uses them),
≈ 2 · 135M · R FLOPs. The dtypes run round-robin ``--repeats`` times; each ratio is the median
over rounds of (float32 seconds) / (bfloat16 seconds) in the same round. The script also records
how far the bfloat16 LM's next-token log-probabilities are from the float32 LM's (mean absolute
difference over the vocabulary, on the same prefixes). Writes
``benchmarks/results/bench_lm_dtype.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from ctrlg.lm.shared_context import cache_keyword, returned_cache

DTYPES = ("float32", "bfloat16")


def _step_seconds(model, rows: int, steps: int, prefix: int = 16) -> float:
    """Seconds per decoding step of ``rows`` rows after a ``prefix``-token prefill."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (rows, prefix), generator=generator)
    with torch.no_grad():
        keyword = cache_keyword(model)
        cache = returned_cache(model(ids, use_cache=True))
        start = time.perf_counter()
        for s in range(steps):
            step_ids = torch.full((rows, 1), 200 + s)
            cache = returned_cache(model(step_ids, **{keyword: cache}, use_cache=True))
        return (time.perf_counter() - start) / steps


def _logprob_gap(models: dict) -> float:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 20000, (8, 24), generator=generator)
    with torch.no_grad():
        lp = {d: torch.log_softmax(m(ids).logits.float(), -1) for d, m in models.items()}
    return float((lp["bfloat16"] - lp["float32"]).abs().mean())


def main(argv=None) -> dict:
    from ctrlg.kernels.packed_linear import native_bfloat16
    from ctrlg.lm.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/bench_lm_dtype.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    models = {d: load_model(None, adapter="commongen-human-balanced", dtype=getattr(torch, d)) for d in DTYPES}
    seconds = {(d, r): [] for d in DTYPES for r in args.rows}
    for _ in range(args.repeats):
        for rows in args.rows:
            for d in DTYPES:
                seconds[d, rows].append(_step_seconds(models[d], rows, args.steps))
    table = []
    for rows in args.rows:
        ratios = [f / b for f, b in zip(seconds["float32", rows], seconds["bfloat16", rows])]
        table.append({"rows": rows,
                      "float32_ms_per_step": 1000 * statistics.median(seconds["float32", rows]),
                      "bfloat16_ms_per_step": 1000 * statistics.median(seconds["bfloat16", rows]),
                      "speedup_bfloat16_median": statistics.median(ratios)})
        print(f"rows {rows:4d}: float32 {table[-1]['float32_ms_per_step']:7.1f} ms, bfloat16 "
              f"{table[-1]['bfloat16_ms_per_step']:7.1f} ms per step, "
              f"×{table[-1]['speedup_bfloat16_median']:.2f}")
    result = {"threads": 1, "steps": args.steps, "repeats": args.repeats,
              "native_bfloat16": native_bfloat16(), "rows": table,
              "bf16_vs_fp32_mean_abs_logprob_diff": _logprob_gap(models),
              "note": "same-round ratios; absolute times depend on the machine's load"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"mean |log p_bf16 - log p_fp32| = {result['bf16_vs_fp32_mean_abs_logprob_diff']:.4f}; "
          f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
