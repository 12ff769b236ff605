"""The lean Llama forward against transformers' own, in one process: decoding steps of the story LM.

    python -m benchmarks.bench_lean_decoder --threads 2

For each weight format (float32, bfloat16 weights: :mod:`ctrlg.lm.bf16_weights`) and each step
shape (rows × new positions per row, on a 96-token cache), the median over interleaved rounds of
the median of three steps (:func:`benchmarks.bench_infill_floor.step_seconds`) by

* ``model``: ``LlamaForCausalLM.forward`` with transformers' ``DynamicCache`` (grown by ``cat``);
* ``lean``: :class:`ctrlg.lm.lean_decoder.LeanLlama` with :class:`ctrlg.lm.growing_cache.GrowingCache`
  (fused q/k/v and gate/up products, ``rms_norm``, the KV written in place),

(rounds interleaved: a shared machine's drift hits both), their ratio, and the largest |Δ logit|
and the next-token KL(model ‖ lean) over a tuning passage's prefill: float rounding only. The step's
matrix products read the weights once whatever the rows, so at a few rows the step is bound by
those bytes (float32 540 MB, bfloat16 270 MB for SmolLM2-135M) plus the per-operation overhead
the lean forward removes. Writes ``benchmarks/results/bench_lean_decoder.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
from pathlib import Path

import torch
from benchmarks.bench_infill_floor import step_seconds
from ctrlg.lm.bf16_weights import native_bf16, use_bf16_weights
from ctrlg.lm.growing_cache import GrowingCache
from ctrlg.lm.lean_decoder import lean_llama

SHAPES = ((1, 1), (4, 1), (4, 8), (16, 1), (4, 16))


def agreement(model, tokenizer, text: str) -> dict:
    """max |Δ logit| and mean next-token KL(model ‖ lean) over ``text``'s prefill."""
    ids = tokenizer(tokenizer.eos_token + text, return_tensors="pt").input_ids
    with torch.no_grad():
        reference = model(ids).logits.float()
        lean = lean_llama(model)(ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None], GrowingCache())
    p, q = torch.log_softmax(reference, -1), torch.log_softmax(lean, -1)
    return {"max_abs_logit_difference": float((reference - lean).abs().max()),
            "kl_model_to_lean": float((p.exp() * (p - q)).sum(-1).mean())}


def flat_rows(result: dict) -> list[dict]:
    """Every format's steps as one list, each row naming its format (the report's table)."""
    return [{"format": name, **step} for name, entry in result["formats"].items() for step in entry["steps"]]


def main(argv=None) -> dict:
    from hydra import compose, initialize_config_dir

    from ctrlg.data.stories import load_stories
    from ctrlg.tasks.config import load_lm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds of steps per shape")
    parser.add_argument("--out", default="benchmarks/results/bench_lean_decoder.json")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose("infill", overrides=["model.bf16_weights=false"])
    float_model, tokenizer = load_lm(cfg.model)
    formats = {"float32": float_model}
    if native_bf16():
        formats["bf16_weights"] = copy.deepcopy(float_model)
        use_bf16_weights(formats["bf16_weights"])
    text = load_stories("tune", None, offset=0, limit=1)[0].text
    result = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "cache_tokens": 96, "formats": {}}
    for name, model in formats.items():
        rows_out = []
        for rows, positions in SHAPES:
            times = {"model": [], "lean": []}
            for _ in range(args.repeats):          # interleaved rounds of a few steps each
                for kind in times:
                    times[kind].append(step_seconds(model, rows, positions=positions, steps=3, forward=kind))
            model_s, lean_s = statistics.median(times["model"]), statistics.median(times["lean"])
            rows_out.append({"rows": rows, "positions": positions, "model_ms": 1000 * model_s,
                             "lean_ms": 1000 * lean_s, "speedup": model_s / lean_s})
            print(name, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows_out[-1].items()}),
                  flush=True)
        result["formats"][name] = {"steps": rows_out, **agreement(model, tokenizer, text)}
        print(name, json.dumps({k: v for k, v in result["formats"][name].items() if k != "steps"}), flush=True)
    result["rows"] = flat_rows(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
