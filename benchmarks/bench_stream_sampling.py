"""Distillation sampling throughput of the adapted LM: the batch-synchronous sampler
(:func:`ctrlg.hmm.sampling.sample_to_disk`) against the continuously batched one
(:func:`ctrlg.hmm.stream_sampling.stream_sample_to_disk`), in one process, same LM and prompt.

    python -m benchmarks.bench_stream_sampling --device cpu --sequences 512
    python -m benchmarks.bench_stream_sampling --device cuda --sequences 65536 --batch 2048 --rows 4096

The LM is the embedded SmolLM2-135M-Instruct with the CommonGen adapter merged (the adapted
pipeline's sampling LM), prompted with the BOS token alone, in ``--dtype``; sequences of
``--length`` tokens, EOS-padded. Rates: sequence slots per second (N·L/s: how the data set counts
tokens, EOS padding included; the figure earlier rounds reported), real tokens per second (up to
and including each sequence's EOS) and sequences per second. Each variant runs ``--repeats``
times round-robin (after one warm-up each); the ratio is the median over rounds of stream / batched
in the same round. Writes JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _real_tokens(folder: Path, eos_ids) -> int:
    from ctrlg.hmm.sampling import load_chunks
    from ctrlg.hmm.stream_sampling import _real_lengths

    return int(_real_lengths(load_chunks(folder)["tokens"], eos_ids).sum())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128, help="batched sampler: rows per batch")
    parser.add_argument("--rows", type=int, default=256, help="stream sampler: decoding slots")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from ctrlg.lm import models
    from ctrlg.data.commongen_prompts import bos_text
    from ctrlg.hmm.sampling import sample_to_disk
    from ctrlg.hmm.stream_sampling import stream_sample_to_disk
    from ctrlg.vocab import eos_token_ids

    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    tokenizer = models.load_tokenizer(None)
    model = models.load_model(None, device=args.device, dtype=dtype, adapter="commongen-human-balanced")
    prompt = bos_text(tokenizer, "<|endoftext|>")
    eos = eos_token_ids(tokenizer, model)
    N, L = args.sequences, args.length

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def batched(folder: Path):
        sample_to_disk(model, tokenizer, [prompt], folder, num_sequences=N, length=L, chunk_size=N,
                       batch_size=args.batch, return_hidden=False, progress=False)

    def stream(folder: Path):
        stream_sample_to_disk(model, tokenizer, prompt, folder, num_sequences=N, length=L, chunk_size=N,
                              rows=args.rows, progress=False)

    variants = {"batched": batched, "stream": stream}
    times: dict[str, list[float]] = {k: [] for k in variants}
    real: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats + 1):
            for name, run in variants.items():
                folder = Path(tmp) / f"{name}_{round_}"
                sync()
                start = time.perf_counter()
                run(folder)
                sync()
                if round_ > 0:  # round 0 warms up (kernels, buffers)
                    times[name].append(time.perf_counter() - start)
                real[name] = _real_tokens(folder, eos)
    rows = {}
    for name in variants:
        seconds = statistics.median(times[name])
        rows[name] = {"seconds": seconds, "slots_per_s": N * L / seconds,
                      "real_tokens_per_s": real[name] / seconds, "sequences_per_s": N / seconds,
                      "real_tokens_per_sequence": real[name] / N}
    ratio = statistics.median(b / s for b, s in zip(times["batched"], times["stream"]))
    device_name = (torch.cuda.get_device_name() if args.device.startswith("cuda")
                   else open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t"))
    result = {"device": device_name, "dtype": str(dtype), "sequences": N, "length": L,
              "batch": args.batch, "rows": args.rows, "threads": args.threads, "variants": rows,
              "stream_over_batched": ratio}
    print(f"{device_name}, {dtype}, N = {N}, L = {L}, batch {args.batch}, {args.rows} slots")
    print("| sampler | s | slots/s | real tokens/s | sequences/s |\n|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['seconds']:.2f} | {row['slots_per_s']:,.0f} | "
              f"{row['real_tokens_per_s']:,.0f} | {row['sequences_per_s']:,.1f} |")
    print(f"stream / batched (median over rounds of the time ratio): {ratio:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
