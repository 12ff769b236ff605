"""Where a guided infilling passage's seconds go, against the floor the LM alone sets, in one process.

    python -m benchmarks.bench_infill_floor                       # 6 tuning passages × 4 ratios
    python -m benchmarks.bench_infill_floor --quantization        # + two int8 LMs (below)

A passage of the infilling task (:mod:`ctrlg.tasks.infill`) is decoded by the experiment's own
:func:`~ctrlg.tasks.infill.pipeline.guided_completion` (``generation.num_samples`` samples with
:func:`ctrlg.fast_forward.sample_fast_forward`, the story LM and its HMM), which times three
phases: the constraint's DFA, the guide's tables and sampling (the rest: decoding the kept sample
and checking it with ``re``, in ``seconds`` only). The fast-forward sampler makes one LM
forward per *choice* (forced fragment tokens are fed in the same forward), so a passage cannot
take less than

    floor = forwards × t_step,    t_step = one LM step of ``num_samples`` rows (median, same process)

whatever the guide costs: every free token of a blank is one autoregressive step. The forced
tokens that ride along make many forwards larger than one step (a fragment of k tokens in each of
R rows is a forward of R·k positions), so the script also clocks the LM's forwards as the
experiment makes them (:class:`LMClock`, forward hooks on the model): ``lm_seconds`` and
``lm_share`` are the time inside the LM, ``lm_tokens`` the positions it computed; the rest of
sampling is the guide (per-choice guidance, feasibility, the HMM's filtering) and bookkeeping. The
script reports, per target ratio, seconds per passage, forwards, the floor and seconds ÷ floor,
the LM's clocked seconds and share, and the share of each phase. Passages are the tuning split's (the adapters' held-out training passages),
never the evaluation split's.

``--quantization`` also measures the levers that make t_step itself smaller on a CPU whose LM
step is bound by reading the weights, each by its step time and its KL divergence from the
float32 LM's next-token distribution on the same passages (against the float32 LM, loaded for
it when the decoding above used bfloat16 weights, the infilling default where the CPU has them):

* ``int8``: torch's dynamic int8 quantisation of the linear layers
  (``torch.ao.quantization.quantize_dynamic``, per-channel weights, activations quantised per
  batch);
* ``int8_weights``: weight-only int8 (:mod:`ctrlg.lm.int8_weights`, ``model.int8_weights=true``:
  one scale per output channel, ``torch._weight_int8pack_mm`` on bfloat16 activations), a
  quarter of float32's weight bytes, activations not quantised;
* ``bf16_weights``: bfloat16 weights (:mod:`ctrlg.lm.bf16_weights`, ``model.bf16_weights=true``),
  half of float32's weight bytes, products summed in float32, the rest of the LM in float32.

Writes ``benchmarks/results/bench_infill_floor.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from ctrlg.lm.bf16_weights import use_bf16_weights
from ctrlg.lm.growing_cache import GrowingCache
from ctrlg.lm.int8_weights import use_int8_weights
from ctrlg.lm.lean_decoder import lean_llama
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.lm.skinny_linear import SkinnyLinear


def step_seconds(model, rows: int, cache_tokens: int = 96, steps: int = 10, positions: int = 1,
                 forward: str = "sampler") -> float:
    """Median seconds of one decoding step of ``rows`` rows on a ``cache_tokens`` KV cache, each row
    bringing ``positions`` new tokens (1: a sampling step; more: a forward that carries a
    fragment's forced tokens, as the infilling sampler's do). ``forward``: ``"sampler"`` the one
    the sampler uses (the lean one where it covers the model, :mod:`ctrlg.lm.lean_decoder`, else
    the model's own), ``"lean"`` or ``"model"``."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (rows, cache_tokens), generator=generator)
    lean = None if forward == "model" else lean_llama(model)
    if forward == "lean" and lean is None:
        raise ValueError("the lean forward does not cover this model")
    times = []
    with torch.no_grad():
        if lean is not None:
            cache, length = GrowingCache(), cache_tokens
            lean(ids, torch.ones(rows, length, dtype=torch.long),
                 torch.arange(length).repeat(rows, 1), cache)
        else:
            keyword = cache_keyword(model)
            cache = returned_cache(model(ids, use_cache=True))
        for s in range(steps):
            step = torch.full((rows, positions), 200 + s)
            start = time.perf_counter()
            if lean is not None:
                mask = torch.ones(rows, length + positions, dtype=torch.long)
                lean(step, mask, torch.arange(length, length + positions).repeat(rows, 1), cache)
                length += positions
            else:
                cache = returned_cache(model(step, **{keyword: cache}, use_cache=True))
            times.append(time.perf_counter() - start)
    return statistics.median(times)


class LMClock:
    """Wall seconds and tokens (rows × positions) of every forward of ``model``, from forward hooks."""

    def __init__(self, model):
        self.seconds, self.tokens, self._start = 0.0, 0, None
        # from the input embedding to the LM head: both forwards (the model's and the lean one,
        # ctrlg.lm.lean_decoder) run them first and last
        self._hooks = [model.get_input_embeddings().register_forward_pre_hook(self._before, with_kwargs=True),
                       model.lm_head.register_forward_hook(self._after, with_kwargs=True)]

    def _before(self, module, args, kwargs):
        ids = kwargs.get("input", args[0] if args else None)
        self.tokens += 0 if ids is None else int(ids.numel())
        self._start = time.perf_counter()

    def _after(self, module, args, kwargs, output):
        self.seconds += time.perf_counter() - self._start

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def decode_passage(model, tokenizer, hmm, document, *, samples: int, seed: int, bos: str) -> dict:
    """One passage decoded by :func:`ctrlg.tasks.infill.pipeline.guided_completion` (as the
    experiment decodes it), with its phases' seconds, its forwards, and the seconds and tokens of
    the LM's forwards (:class:`LMClock`)."""
    from ctrlg.tasks.infill.pipeline import guided_completion

    clock = LMClock(model)
    try:
        done = guided_completion(model, tokenizer, document, hmm=hmm, eos_token_id=tokenizer.eos_token_id,
                                 num_samples=samples, seed=seed, bos_token=bos)
    finally:
        clock.close()
    return {**done.phase_seconds, "seconds": done.seconds, "forwards": done.forwards,
            "lm_seconds": clock.seconds, "lm_tokens": clock.tokens,
            "free_tokens": done.free_tokens, "accepted": done.accepted}


def with_weights(model, kind: str):
    """A copy of ``model`` with its linear layers as ``int8_weights`` (:mod:`ctrlg.lm.int8_weights`)
    or ``bf16_weights`` (:mod:`ctrlg.lm.bf16_weights`)."""
    quantized = copy.deepcopy(model)
    {"int8_weights": use_int8_weights, "bf16_weights": use_bf16_weights}[kind](quantized)
    return quantized


def quantization(model, tokenizer, texts, rows: int, kind: str = "int8") -> dict:
    """Step time and next-token KL(float32 ‖ approximation) of ``kind``: ``int8`` (torch's dynamic
    int8 quantisation), ``int8_weights`` or ``bf16_weights`` (:func:`with_weights`). The keys keep
    the names of the first measurement (``int8_step_ms``, ``kl_float32_to_int8``) whatever the kind."""
    if kind == "int8":
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        plain = copy.deepcopy(model)
        for module in plain.modules():          # quantize_dynamic maps exact nn.Linear types only
            if isinstance(module, SkinnyLinear):
                module.__class__ = torch.nn.Linear
        quantized = quantize_dynamic(plain, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    else:
        quantized = with_weights(model, kind)
    divergences, nll = [], {"float32": [], "int8": []}
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(tokenizer.eos_token + text, return_tensors="pt").input_ids
            reference = torch.log_softmax(model(ids).logits.float(), -1)[0, :-1]
            approximate = torch.log_softmax(quantized(ids).logits.float(), -1)[0, :-1]
            divergences.append(float((reference.exp() * (reference - approximate)).sum(-1).mean()))
            targets = ids[0, 1:, None]
            nll["float32"].append(float(-reference.gather(1, targets).mean()))
            nll["int8"].append(float(-approximate.gather(1, targets).mean()))
    float_steps, int8_steps, float_chunks, int8_chunks = [], [], [], []
    for _ in range(5):                          # interleaved: a shared machine's drift hits both
        float_steps.append(step_seconds(model, rows))
        int8_steps.append(step_seconds(quantized, rows))
        float_chunks.append(step_seconds(model, rows, steps=4, positions=16))
        int8_chunks.append(step_seconds(quantized, rows, steps=4, positions=16))
    float_step, int8_step = statistics.median(float_steps), statistics.median(int8_steps)
    float_chunk, int8_chunk = statistics.median(float_chunks), statistics.median(int8_chunks)
    return {"kind": kind, "rows": rows, "float32_step_ms": 1000 * float_step, "int8_step_ms": 1000 * int8_step,
            "speedup": float_step / int8_step, "float32_16_positions_ms": 1000 * float_chunk,
            "int8_16_positions_ms": 1000 * int8_chunk, "speedup_16_positions": float_chunk / int8_chunk,
            "kl_float32_to_int8": float(np.mean(divergences)),
            "nll_per_token": {k: float(np.mean(v)) for k, v in nll.items()}}


def main(argv=None) -> dict:
    from hydra import compose, initialize_config_dir

    from ctrlg.data.stories import load_stories
    from ctrlg.tasks.config import bf16_weights_setting, load_hmm, load_lm
    from ctrlg.tasks.infill import pipeline

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=6)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.13, 0.21, 0.32, 0.40])
    parser.add_argument("--samples", type=int, default=None, help="default: the experiment's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quantization", action="store_true")
    parser.add_argument("--override", nargs="*", default=[],
                        help="overrides of the infill config, e.g. model.bf16_weights=true")
    parser.add_argument("--out", default="benchmarks/results/bench_infill_floor.json")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose("infill", overrides=args.override)
    samples = args.samples or int(cfg.generation.num_samples)
    model, tokenizer = load_lm(cfg.model)
    hmm = load_hmm(cfg.hmm, tokenizer)
    stories = load_stories("tune", None, offset=0, limit=args.passages)
    texts = [s.text for s in stories]
    t_step = statistics.median(step_seconds(model, samples) for _ in range(3))
    rows = []
    for target in args.ratios:
        documents = pipeline.calibrate_masks(texts, target, 0, int(cfg.data.max_ngram)).documents
        items = [decode_passage(model, tokenizer, hmm, document, samples=samples, seed=story.index,
                                bos=cfg.model.bos_token)
                 for story, document in zip(stories, documents)]
        seconds = float(np.mean([i["seconds"] for i in items]))
        forwards = float(np.mean([i["forwards"] for i in items]))
        rows.append({"target_ratio": target, "passages": len(items), "seconds": seconds,
                     "forwards": forwards,
                     "free_tokens": float(np.mean([i["free_tokens"] for i in items])),
                     "floor_seconds": forwards * t_step, "seconds_vs_floor": seconds / (forwards * t_step),
                     "lm_seconds": float(np.mean([i["lm_seconds"] for i in items])),
                     "lm_share": float(sum(i["lm_seconds"] for i in items) / sum(i["seconds"] for i in items)),
                     "lm_tokens": float(np.mean([i["lm_tokens"] for i in items])),
                     **{f"{phase}_share": float(sum(i[phase] for i in items) / sum(i["seconds"] for i in items))
                        for phase in ("constraint", "tables", "sampling")},
                     "accepted": all(i["accepted"] for i in items)})
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}),
              flush=True)
    result = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "overrides": list(args.override), "bf16_weights": bf16_weights_setting(cfg.model),
              "lean_forward": lean_llama(model) is not None,
              "samples": samples, "lm_step_ms": 1000 * t_step, "rows": rows,
              "mean_seconds": float(np.mean([r["seconds"] for r in rows])),
              "mean_floor_seconds": float(np.mean([r["floor_seconds"] for r in rows]))}
    if args.quantization:                       # each format against the float32 LM
        reference = model if not result["bf16_weights"] else \
            load_lm(OmegaConf.merge(cfg.model, {"bf16_weights": False}))[0]
        result["quantization"] = quantization(reference, tokenizer, texts, samples)
        result["quantization_weights_only"] = quantization(reference, tokenizer, texts, samples, "int8_weights")
        result["bf16_weights_format"] = quantization(reference, tokenizer, texts, samples, "bf16_weights")
        for key in ("quantization", "quantization_weights_only", "bf16_weights_format"):
            print(json.dumps(result[key]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
