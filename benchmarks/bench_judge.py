"""The CommonGen judge's cost: candidates packed as prefix trees, a batch in one forward, against one
padded row per candidate after the prompt's cache (the judge before), in one process.

    OMP_NUM_THREADS=2 python -m benchmarks.bench_judge [--items 60] [--batch 10] [--repeats 2]

The judge is the adapted pipeline's: the embedded LM with the ``commongen-supervised`` adapter,
float32, prompted with the item's concepts. Its candidates are the eight beams of the first
``--items`` held-out items of the kept run ``commongen/human_balanced_b8_widen_float32_0-499``
(as the pipeline shortlists them: all of them, up to 32). Both ways score the same candidates;
the packed one in batches of ``--batch`` items, as ``generate_batch`` does. Prints milliseconds
per item for each (median over ``--repeats``), their ratio, the largest score difference and
how many items' best candidate by the judge differs. Writes ``benchmarks/results/bench_judge.json``.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
RUN = RESULTS / "commongen" / "human_balanced_b8_widen_float32_0-499" / "generations.jsonl.gz"


@torch.no_grad()
def padded_rows(model, prompt, candidates) -> list[float]:
    """The reference: the prompt run once, its cache copied for one right-padded row per candidate."""
    from ctrlg.lm.shared_context import cache_keyword, returned_cache

    start = model(input_ids=torch.tensor([prompt]), use_cache=True)
    first = torch.log_softmax(start.logits[0, -1].float(), -1)
    width = max(len(c) for c in candidates)
    ids = torch.zeros(len(candidates), width, dtype=torch.long)
    mask = torch.zeros(len(candidates), len(prompt) + width, dtype=torch.long)
    mask[:, :len(prompt)] = 1
    for i, c in enumerate(candidates):
        ids[i, :len(c)] = torch.tensor(c)
        mask[i, len(prompt):len(prompt) + len(c)] = 1
    cache = copy.deepcopy(returned_cache(start))
    cache.batch_repeat_interleave(len(candidates))
    logits = model(input_ids=ids, attention_mask=mask, use_cache=True,
                   **{cache_keyword(model): cache}).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return [float(first[c[0]]) + float(logp[i, :len(c) - 1].sum()) for i, c in enumerate(candidates)]


def main(argv=None) -> None:
    from omegaconf import OmegaConf

    from ctrlg.data.commongen_prompts import target_prefix
    from ctrlg.lm.judge import Judge, judge_log_likelihoods_many, prefix_tree
    from ctrlg.tasks.commongen.items import judge_prompt_ids, judge_style
    from ctrlg.tasks.config import load_lm

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_judge.json")
    args = parser.parse_args(argv)

    style = judge_style({"adapter": "commongen-supervised", "prompt_style": None})
    model, tokenizer = load_lm(OmegaConf.create({"name": None, "adapter": "commongen-supervised",
                                                 "dtype": "float32"}))
    judge = Judge(model, tokenizer, text_prefix=target_prefix(style["prompt_style"]))
    with gzip.open(RUN, "rt") as handle:
        records = [json.loads(line) for line, _ in zip(handle, range(args.items))]
    requests = [(judge_prompt_ids(r["concepts"], tokenizer, style),
                 [judge.encode(c["text"]) for c in r["ctrlg"]["candidates"][:32]]) for r in records]
    reference_ms, packed_ms = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        reference = [padded_rows(model, p, c) for p, c in requests]
        middle = time.perf_counter()
        packed = []
        for lo in range(0, len(requests), args.batch):
            packed += judge_log_likelihoods_many(model, requests[lo:lo + args.batch])
        end = time.perf_counter()
        reference_ms.append(1e3 * (middle - start) / len(requests))
        packed_ms.append(1e3 * (end - middle) / len(requests))
    argmax = (lambda xs: max(range(len(xs)), key=xs.__getitem__))
    row = {
        "items": len(requests), "batch": args.batch, "threads": torch.get_num_threads(),
        "candidates_per_item": statistics.mean(len(c) for _, c in requests),
        "tokens_per_item": statistics.mean(sum(map(len, c)) for _, c in requests),
        "tree_positions_per_item": statistics.mean(
            len({q for q in prefix_tree(c)[1] if q >= 0}) for _, c in requests),
        "reference_ms_per_item": statistics.median(reference_ms),
        "packed_ms_per_item": statistics.median(packed_ms),
        "max_abs_score_difference": max(abs(a - b) for x, y in zip(reference, packed) for a, b in zip(x, y)),
        "best_candidate_changed": sum(argmax(x) != argmax(y) for x, y in zip(reference, packed)),
    }
    row["speedup"] = row["reference_ms_per_item"] / row["packed_ms_per_item"]
    args.out.write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
