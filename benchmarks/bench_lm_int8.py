"""Benchmark: the editing LM with int8 weights (PyTorch's dynamic quantisation of every
``nn.Linear``: int8 weights with one scale per output channel, activations quantised per call) and
in bfloat16, against float32, on the CPU, in one process — whether a lower precision could make
the editor's decoding steps, which are bound by reading the weights, fast enough.

* speed: one decoding step of 4 rows after a shared prompt (the editor's insertion: 4 candidates),
  the two models alternated, median of ``--steps`` steps each;
* fidelity, teacher-forced on the ``tune`` passages (never evaluated on; the editing LM's prompt
  "Continue the given text:" + the passage): NLL per token under each model, the mean
  KL(p_float32 ‖ p_variant) per position over the whole vocabulary, and how often the two agree on
  the most likely token.

    python -m benchmarks.bench_lm_int8 --threads 2 --passages 40

Writes ``benchmarks/results/bench_lm_int8.json``. The answer was no (docs/app.md): int8 runs a
step 2.7× faster but moves the distribution by KL ≈ 0.95 nats per token (the activations' outlier
channels do not survive per-tensor int8), and bfloat16 keeps it (KL ≈ 0.002) but is not faster on
this CPU, which has no native bfloat16 arithmetic.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def int8_linear(model):
    """``model`` with every ``nn.Linear`` dynamically quantised to int8 (per-channel weights), in
    place. PyTorch has deprecated this eager API in favour of torchao, hence the filter."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig},
                                dtype=torch.qint8, inplace=True)


def step_ms(model, prompt_ids, steps: int) -> list[float]:
    import torch

    from ctrlg.lm.shared_context import SharedContext, cache_keyword, returned_cache

    context = SharedContext(model, prompt_ids)
    cache = context.cache(4)
    ids = torch.tensor([[prompt_ids[-1]]] * 4)
    times = []
    with torch.no_grad():
        for _ in range(steps):
            start = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, **{cache_keyword(model): cache})
            times.append(1000 * (time.perf_counter() - start))
            cache = returned_cache(out)
            ids = out.logits[:, -1].argmax(-1, keepdim=True)
    return times


def fidelity(reference, quantized, texts, tokenizer, name: str) -> dict:
    import torch

    nll = {"float32": 0.0, name: 0.0}
    kl = agree = tokens = 0.0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text, add_special_tokens=False).input_ids])
            p = torch.log_softmax(reference(input_ids=ids).logits[0, :-1].float(), -1)
            q = torch.log_softmax(quantized(input_ids=ids).logits[0, :-1].float(), -1)
            target = ids[0, 1:, None]
            nll["float32"] -= float(p.gather(-1, target).sum())
            nll[name] -= float(q.gather(-1, target).sum())
            kl += float((p.exp() * (p - q)).sum())
            agree += float((p.argmax(-1) == q.argmax(-1)).sum())
            tokens += ids.shape[1] - 1
    return {"tokens": int(tokens), "nll_per_token": {k: v / tokens for k, v in nll.items()},
            "kl_per_token": kl / tokens, "top1_agreement": agree / tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--passages", type=int, default=40)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()

    import torch

    from ctrlg.app.__main__ import DEFAULT_ADAPTER, load_editor
    from ctrlg.app.examples import load_examples
    from ctrlg.data.stories import load_stories
    from ctrlg.data.story_prompts import continuation_prompt

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, _, header, description = load_editor(None, DEFAULT_ADAPTER, "none")
    variants = {}
    start = time.perf_counter()
    variants["int8"] = int8_linear(copy.deepcopy(model))
    quantize_seconds = time.perf_counter() - start
    variants["bfloat16"] = copy.deepcopy(model).to(torch.bfloat16)
    pig = next(e["text"] for e in load_examples() if e["code"] == "pig")
    prompt = tokenizer(header + pig, add_special_tokens=False).input_ids
    times = {name: [] for name in ["float32", *variants]}
    for _ in range(2):                     # alternated, so that all see the same machine
        for name in times:
            times[name] += step_ms(variants.get(name, model), prompt, args.steps)
    texts = [continuation_prompt(s.text, tokenizer) for s in
             load_stories("tune", limit=args.passages)]
    row = {"threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
           "lm": description, "prompt_tokens": len(prompt), "quantize_seconds": quantize_seconds,
           "step_ms_4_rows": {name: statistics.median(t) for name, t in times.items()},
           "fidelity_tune_passages": {name: {"passages": len(texts),
                                             **fidelity(model, variant, texts, tokenizer, name)}
                                      for name, variant in variants.items()}}
    row["speedup"] = {name: row["step_ms_4_rows"]["float32"] / row["step_ms_4_rows"][name]
                      for name in variants}
    print(json.dumps(row, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_lm_int8.json").write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
