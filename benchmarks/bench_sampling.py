"""Distillation sampling throughput: tokens/s of :func:`ctrlg.hmm.sampling.sample_to_disk` with the
embedded SmolLM2-135M-Instruct on CommonGen train prompts, old settings against new, in one process.

    python -m benchmarks.bench_sampling                  # 256 sequences × 32 tokens per variant

Variants (each a full ``sample_to_disk`` call, hidden states stored, into a temporary folder):

- ``before``: the first defaults — float32 weights, PyTorch SDPA attention,
  ``torch.multinomial``, transformers' DynamicCache, batch 128, one thread;
- ablations switching one thing at a time: the sampler (inverse CDF, its [B, V] temporaries in
  reused buffers), the attention (grouped-query, no K/V repetition), bfloat16 weights
  (``after_dynamic_cache``);
- ``after``: bfloat16 + grouped attention + inverse-CDF sampler + the preallocated KV cache
  (:mod:`ctrlg.hmm.kv_cache`; the defaults), one thread;
- ``after_batch_256``: ``after`` with 256 rows per forward (``sampling.batch_size=256``; the
  batch is part of the seeding, so other samples from the same distribution);
- ``after_2_workers``: ``after`` with two chunks made at once by two threads of this process
  (``sample_to_disk(workers=2)``, each chunk half the sequences): both cores.

The variants run round-robin ``--repeats`` times so that a shared machine's load hits them
alike; each ratio is the median over rounds of (variant tokens/s) / (``before`` tokens/s) in the
same round. Besides wall-clock time the script records each variant's CPU time
(``time.process_time``, all threads of the process): on a machine shared with other jobs the
tokens per CPU-second of a one-thread variant measure its cost without the waiting, so their
ratios are the robust ones; the two-worker variant needs wall-clock time. Tokens are counted as the data set counts them (sequences × length, EOS padding
included); real (pre-EOS) tokens are reported too. The script also checks that the new settings
reproduce the same chunk bit for bit, and reports how close the bfloat16 LM's log-probabilities
are to the float32 LM's on the sampled tokens. Writes ``benchmarks/results/bench_sampling.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

VARIANTS = {
    "before": dict(dtype="float32", attention="sdpa", sampler="multinomial", kv_cache="dynamic"),
    "inverse_cdf": dict(dtype="float32", attention="sdpa", sampler="inverse_cdf", kv_cache="dynamic"),
    "inverse_cdf+grouped": dict(dtype="float32", attention="ctrlg_grouped", sampler="inverse_cdf",
                                kv_cache="dynamic"),
    "after_dynamic_cache": dict(dtype="bfloat16", attention="ctrlg_grouped", sampler="inverse_cdf",
                                kv_cache="dynamic"),
    "after": dict(dtype="bfloat16", attention="ctrlg_grouped", sampler="inverse_cdf",
                  kv_cache="preallocated"),
    "after_batch_256": dict(dtype="bfloat16", attention="ctrlg_grouped", sampler="inverse_cdf",
                            kv_cache="preallocated", batch_size=256),
    "after_2_workers": dict(dtype="bfloat16", attention="ctrlg_grouped", sampler="inverse_cdf",
                            kv_cache="preallocated", workers=2),
}


def main(argv=None) -> dict:
    from ctrlg.lm import models
    from ctrlg.hmm.distill import build_prompts
    from ctrlg.hmm.grouped_attention import register
    from ctrlg.hmm.sampling import load_chunks, sample_to_disk

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default="benchmarks/results/bench_sampling.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    register()
    names = args.variants.split(",")
    if "before" not in names:
        names.insert(0, "before")
    tokenizer = models.load_tokenizer(None)
    prompts = build_prompts({}, tokenizer)
    lms = {}
    for name in names:
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; choose from {sorted(VARIANTS)}")
        key = (VARIANTS[name]["dtype"], VARIANTS[name]["attention"])
        if key not in lms:
            lms[key] = models.load_model(None, dtype=getattr(torch, key[0]), attn_implementation=key[1])
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    real_tokens: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            for name in names:
                v = VARIANTS[name]
                model = lms[(v["dtype"], v["attention"])]
                folder = Path(tmp) / f"{name}_{round_}"
                start, start_cpu = time.perf_counter(), time.process_time()
                workers = v.get("workers", 1)
                sample_to_disk(model, tokenizer, prompts, folder, num_sequences=args.sequences,
                               length=args.length, chunk_size=-(-args.sequences // workers),
                               batch_size=min(v.get("batch_size", args.batch_size),
                                              -(-args.sequences // workers)),
                               seed=0, sampler=v["sampler"], kv_cache=v["kv_cache"], workers=workers,
                               progress=False)
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
                data = load_chunks(folder, ("tokens", "logprob", "hidden"))
                real_tokens[name] = int((data["logprob"] != 0).sum())
                print(f"round {round_} {name:>22}: {times[name][-1]:6.1f} s "
                      f"(CPU {cpu[name][-1]:6.1f} s)", flush=True)
        last = names[-1]
        after = load_chunks(Path(tmp) / f"{last}_0", ("tokens", "logprob", "hidden"))
        again = load_chunks(Path(tmp) / f"{last}_{args.repeats - 1}", ("tokens", "logprob", "hidden"))
        reproducible = all(torch.equal(after[k], again[k]) for k in after)
        same_as_dynamic = None  # the preallocated cache against the DynamicCache, same settings
        if "after" in names and "after_dynamic_cache" in names:
            a, b = (load_chunks(Path(tmp) / f"{n}_0", ("tokens", "logprob", "hidden"))
                    for n in ("after", "after_dynamic_cache"))
            same_as_dynamic = all(torch.equal(a[k], b[k]) for k in a)
        # bfloat16 vs float32 LM on the same (bf16-sampled) tokens: teacher-forced log-probs
        fp32 = lms.get(("float32", "sdpa")) or models.load_model(None)
        rescored = _rescore(fp32, tokenizer, prompts, Path(tmp) / f"{last}_0", args.length)
    n_tokens = args.sequences * args.length
    rows = []
    for name in names:
        ratios = [times["before"][r] / times[name][r] for r in range(args.repeats)]
        cpu_ratios = [cpu["before"][r] / cpu[name][r] for r in range(args.repeats)]
        rows.append({"variant": name, "workers": 1, "batch_size": args.batch_size, **VARIANTS[name],
                     "seconds": times[name], "cpu_seconds": cpu[name],
                     "tokens_per_s": [n_tokens / t for t in times[name]],
                     "real_tokens_per_s": [real_tokens[name] / t for t in times[name]],
                     "tokens_per_cpu_s": [n_tokens / t for t in cpu[name]],
                     "speedup_vs_before_median": statistics.median(ratios),
                     "cpu_speedup_vs_before_median": statistics.median(cpu_ratios)})
    result = {"sequences": args.sequences, "length": args.length, "batch_size": args.batch_size,
              "threads": args.threads, "repeats": args.repeats, "rows": rows,
              "after_reproducible_bit_for_bit": reproducible,
              "after_equals_dynamic_cache_bit_for_bit": same_as_dynamic,
              "bf16_vs_fp32_logprob": rescored,
              "note": "absolute tokens/s depend on the shared machine's load; the speed-ups are "
                      "same-round ratios; CPU-time ratios of one-thread variants do not count "
                      "the time spent waiting for a core"}
    for row in rows:
        print(f"{row['variant']:>22}: {statistics.median(row['tokens_per_s']):7.1f} tokens/s "
              f"({statistics.median(row['real_tokens_per_s']):6.1f} before EOS), "
              f"× {row['speedup_vs_before_median']:.2f} vs before; "
              f"{statistics.median(row['tokens_per_cpu_s']):7.1f} tokens per CPU-s, "
              f"× {row['cpu_speedup_vs_before_median']:.2f}")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return result


@torch.no_grad()
def _rescore(model, tokenizer, prompts, folder: Path, length: int) -> dict:
    """Mean |Δ| and mean difference (per real token) between the stored log-probs and the
    float32 LM's teacher-forced log-probs of the same tokens."""
    from ctrlg.hmm.sampling import load_chunks

    data = load_chunks(folder, ("tokens", "logprob", "prompt_index"))
    diffs = []
    for row in range(min(32, data["tokens"].shape[0])):
        n = int((data["logprob"][row] != 0).sum())
        if n == 0:
            continue
        prompt = tokenizer(prompts[int(data["prompt_index"][row])], add_special_tokens=False)["input_ids"]
        ids = torch.tensor(prompt + data["tokens"][row, :n].tolist())[None]
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
        want = logp.gather(1, ids[0, len(prompt):, None])[:, 0]
        diffs.append(data["logprob"][row, :n] - want)
    d = torch.cat(diffs)
    return {"tokens": int(d.numel()), "mean_abs_diff": float(d.abs().mean()), "mean_diff": float(d.mean())}


if __name__ == "__main__":
    main()
