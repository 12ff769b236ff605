"""Cost of the LM-conditioned prior head per generated token, as a ratio to the LM's decoding step.

    python -m benchmarks.bench_prior_head                 # batch 1 and 8, the default HMM's head

Both are timed in the same process, interleaved, on the embedded SmolLM2-135M-Instruct (float32,
as generation runs it): one cached decoding step of the LM (a 48-token context) against one
call of the head on the step's [B, d] features (log q over the HMM's h hidden states). The
ratio is the median over ``--repeats`` rounds of (head time) / (LM step time) in the same round.
Writes ``benchmarks/results/bench_prior_head.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from ctrlg.lm.shared_context import cache_keyword, returned_cache


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def main(argv=None) -> dict:
    from ctrlg.lm import models
    from ctrlg.hmm import load_default_hmm
    from ctrlg.hmm.prior_head import PriorHead

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--context", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20, help="calls per timing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/bench_prior_head.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = models.load_model(None)
    hmm = load_default_hmm()
    d = model.get_output_embeddings().in_features
    head = hmm.prior_head
    if head is None:  # no head shipped yet: time one of the default shape
        head = PriorHead(d, hmm.hidden_size, inner_size=256).eval()
    rows = []
    for B in (int(b) for b in args.batch.split(",")):
        ids = torch.randint(0, model.config.vocab_size, (B, args.context), generator=torch.Generator().manual_seed(0))
        out = model(ids, use_cache=True)
        cache = returned_cache(out)
        step = ids[:, -1:]
        features = torch.randn(B, d)

        def lm_step():  # one cached decoding step, then drop the appended position again
            model(step, **{cache_keyword(model): cache}, use_cache=True)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys[..., :args.context, :], layer.values[..., :args.context, :]

        def head_step():
            head(features)

        lm_times, head_times, ratios = [], [], []
        for _ in range(args.rounds):
            lm_t = median_time(lm_step, args.repeats)
            head_t = median_time(head_step, args.repeats)
            lm_times.append(lm_t)
            head_times.append(head_t)
            ratios.append(head_t / lm_t)
        rows.append({"batch": B, "lm_step_ms": statistics.median(lm_times) * 1e3,
                     "head_ms": statistics.median(head_times) * 1e3,
                     "head_over_lm_step": statistics.median(ratios)})
        print(f"batch {B}: LM step {rows[-1]['lm_step_ms']:.2f} ms, head {rows[-1]['head_ms']:.3f} ms, "
              f"ratio {rows[-1]['head_over_lm_step']:.4f}")
    result = {"lm_hidden_size": d, "hmm_hidden_size": head.hidden_size, "inner_size": head.inner_size,
              "head_parameters": sum(p.numel() for p in head.parameters()), "threads": args.threads,
              "rows": rows, "note": "absolute times depend on the shared machine's load; the ratio is "
                                    "measured within each round"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
