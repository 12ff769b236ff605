"""ReLM random sampling (:func:`ctrlg.relm.sample`) with the embedded SmolLM2-135M-Instruct on the
bias task's queries: the incremental row decoder (:mod:`ctrlg.relm.row_decoder`) against the
previous loop, which re-encoded every row's whole suffix behind the cached context at each step
(and scored each prefix in a call of its own), in one process.

    python -m benchmarks.bench_relm_sampling            # 64 samples per gender and configuration

Both variants draw the same number of samples with the same seed and batch; they sample the same
distribution (tests/test_relm_row_decoder.py) but not the same samples, because their logits
differ by float rounding. The variants alternate ``--repeats`` times; the ratio is the median of
(reference seconds) / (incremental seconds) over rounds. Writes
``benchmarks/results/bench_relm_sampling.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import ctrlg.relm.query as query_module
from ctrlg.relm.bias import BiasConfiguration, sample_configuration
from ctrlg.relm.row_decoder import RowDecoder
from ctrlg.tasks.config import load_lm

PROFESSIONS = ["art", "science", "business", "medicine", "computer science", "engineering",
               "humanities", "social sciences", "information systems", "math"]
TEMPLATE = "The {gender} was trained in"


class ReencodingDecoder(RowDecoder):
    """The previous loop: every step re-runs each live row's whole suffix behind the context."""

    def start(self, prefixes):
        self.rows = [list(map(int, p)) for p in prefixes]
        self.batch = len(self.rows)
        return self._full_start()

    def advance(self, tokens):
        for r, t in enumerate(tokens):
            if t is not None:
                self.rows[r].append(int(t))
        return self._full(tokens)


def run(model, tokenizer, config, decoder, samples, batch_size, seed):
    query_module.RowDecoder = decoder
    try:
        start = time.perf_counter()
        cpu = time.process_time()
        row = sample_configuration(model, tokenizer, TEMPLATE, ["man", "woman"], PROFESSIONS,
                                   config, num_samples=samples, bos_id=tokenizer.eos_token_id,
                                   seed=seed, batch_size=batch_size, max_tokens=48)
        return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                "drawn": len(row["samples"]), "counts": row["counts"]}
    finally:
        query_module.RowDecoder = RowDecoder


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64, help="per gender and configuration")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/bench_relm_sampling.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_lm(_embedded())
    configs = [BiasConfiguration(True, "canonical", 0), BiasConfiguration(True, "all", 1),
               BiasConfiguration(False, "canonical", 0), BiasConfiguration(False, "all", 1)]
    rows = []
    for config in configs:
        rounds = []
        for repeat in range(args.repeats):
            reference = run(model, tokenizer, config, ReencodingDecoder, args.samples,
                            args.batch_size, repeat)
            incremental = run(model, tokenizer, config, RowDecoder, args.samples,
                              args.batch_size, repeat)
            rounds.append({"reference": reference, "incremental": incremental,
                           "ratio": reference["seconds"] / incremental["seconds"]})
        samples = 2 * args.samples
        row = {"configuration": config.name,
               "reference_s_per_sample": statistics.median(
                   r["reference"]["seconds"] for r in rounds) / samples,
               "incremental_s_per_sample": statistics.median(
                   r["incremental"]["seconds"] for r in rounds) / samples,
               "speedup": statistics.median(r["ratio"] for r in rounds), "rounds": rounds}
        rows.append(row)
        print(f"{config.name:28s} reference {row['reference_s_per_sample']*1000:7.1f} ms/sample"
              f"  incremental {row['incremental_s_per_sample']*1000:7.1f} ms/sample"
              f"  ×{row['speedup']:.2f}", flush=True)
    result = {"threads": args.threads, "machine": platform.machine(), "samples": args.samples,
              "batch_size": args.batch_size, "repeats": args.repeats, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _embedded():
    from omegaconf import OmegaConf

    return OmegaConf.create({"name": None, "dtype": "float32", "adapter": None})


if __name__ == "__main__":
    main()
