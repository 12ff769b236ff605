"""Per-token guidance overhead: the Ctrl-G LogitsProcessor step against the LM's decoding step.

For each LM and batch size we decode ``max_new_tokens`` tokens by hand (KV cache, sampling from
the guided scores with a seeded generator) and time, per generated token,

* the LM step: one cached forward of the batch's newest tokens (the prompt's prefill is timed
  separately and excluded), and
* the guidance step: ``ConstraintLogitsProcessor(input_ids, scores)`` (``ctrlg.sampler``), which
  updates each row's DFA state and HMM forward message and computes
  log p_hmm(α | x≤t, v) for all v: O(h² + h·V + h·|exc(s)|) per row (DESIGN.md).

Both are wall-clock times with the device synchronised before and after, so the host work of the
processor counts. overhead = median guidance step / median LM step. The one-time cost of building
the backward tables (processor construction, once per HMM and reused for every LM and batch
size) is reported separately.

LMs: at ``--size full`` the embedded SmolLM2-135M-Instruct and a ~1.07 B-parameter Llama with
random weights (hidden 2048, 16 layers, SmolLM2's 49,152-token vocabulary), both in bf16 on
CUDA; the HMM is random with h = 1024 over the same vocabulary; the constraint is CommonGen's
"4 concepts ∧ 5–20 words ∧ EOS" on the SmolLM2 tokenizer. At ``--size tiny`` a tiny random Llama,
a random HMM with h = 8 and a keyword-and-length DFA over a 64-token vocabulary.
"""

from __future__ import annotations

import math

import torch

from benchmarks.gpu.fixtures import LLAMA_1B, llama_config, random_hmm, random_llama
from benchmarks.gpu.timing import Stopwatch
from ctrlg.lm.shared_context import cache_keyword, returned_cache

__all__ = ["SIZES", "run", "MARKDOWN_COLUMNS", "guided_decode"]

SIZES = {
    "tiny": dict(models=["tiny-random-llama"], batches=[1, 4], hidden_size=8, vocab_size=64,
                 max_new_tokens=6, prompt_length=5),
    "full": dict(models=["smollm2-135m", "random-llama-1b"], batches=[1, 64], hidden_size=1024,
                 vocab_size=49152, max_new_tokens=32, prompt_length=24,
                 concepts="dog_N#frisbee_N#catch_V#throw_V", min_words=5, max_words=20),
}

MARKDOWN_COLUMNS = [
    ("model", "LM", "{}"), ("params_m", "params (M)", "{:.0f}"), ("batch", "batch", "{}"),
    ("hidden_size", "HMM h", "{}"), ("dfa_states", "DFA states", "{}"),
    ("lm_step_s", "LM step (ms)", "ms"), ("guidance_step_s", "guidance (ms)", "ms"),
    ("overhead", "guidance / LM", "pct"), ("table_build_s", "tables built (s)", "{:.3g}"),
]


def _constraint(params: dict, tokenizer):
    """The benchmark's DFA and EOS id (module docstring)."""
    from ctrlg import dfa

    V = params["vocab_size"]
    if tokenizer is None:  # tiny: token 5 and the phrase [7, 8] must appear, ≤ n tokens
        d = dfa.intersect(dfa.phrase([5], V), dfa.phrase([7, 8], V),
                          dfa.length(0, params["max_new_tokens"], vocab_size=V))
        return d, None
    d = dfa.commongen_constraint(params["concepts"], tokenizer, params["min_words"],
                                 params["max_words"], vocab_size=V)
    return d, int(tokenizer.eos_token_id)


def _load_lm(name: str, params: dict, device: torch.device, seed: int):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if name == "tiny-random-llama":
        return random_llama(llama_config(params["vocab_size"]), seed=seed, device=device, dtype=dtype)
    if name == "random-llama-1b":
        return random_llama(llama_config(**LLAMA_1B), seed=seed, device=device, dtype=dtype)
    from ctrlg.lm.models import load_model

    return load_model(None if name == "smollm2-135m" else name, device=device, dtype=dtype)


@torch.no_grad()
def guided_decode(model, processor, prompt: torch.Tensor, max_new_tokens: int, *, seed: int,
                  lm_watch: Stopwatch | None = None, guide_watch: Stopwatch | None = None) -> torch.Tensor:
    """Decode ``max_new_tokens`` tokens from ``prompt`` [B, P] with ``processor`` applied to each
    step's scores, sampling from the guided distribution; returns the generated ids [B, n]."""
    from transformers import DynamicCache

    device = prompt.device
    generator = torch.Generator(device=device).manual_seed(int(seed))
    processor.reset()
    ids = prompt
    cache = DynamicCache()
    out = model(input_ids=prompt, **{cache_keyword(model): cache}, use_cache=True)  # prefill (not timed)
    logits = out.logits[:, -1].float()
    for t in range(max_new_tokens):
        if guide_watch is not None:
            with guide_watch:
                scores = processor(ids, logits)
        else:
            scores = processor(ids, logits)
        probs = torch.softmax(scores, dim=-1)
        dead = ~torch.isfinite(scores).any(-1)  # rows the processor left without a feasible token
        probs[dead] = 1.0 / probs.shape[-1]
        nxt = torch.multinomial(probs, 1, generator=generator)
        ids = torch.cat([ids, nxt], dim=1)
        if t + 1 == max_new_tokens:
            break
        if lm_watch is not None:
            with lm_watch:
                out = model(input_ids=nxt, **{cache_keyword(model): returned_cache(out)}, use_cache=True)
        else:
            out = model(input_ids=nxt, **{cache_keyword(model): returned_cache(out)}, use_cache=True)
        logits = out.logits[:, -1].float()
    return ids[:, prompt.shape[1]:]


def run(size: str, device: torch.device, *, seed: int = 0, peak=None, hidden_sizes=None) -> dict:
    """Time the LM step and the guidance step for every LM × batch of ``SIZES[size]``."""
    from ctrlg.sampler import ConstraintLogitsProcessor

    params = dict(SIZES[size])
    hs = list(hidden_sizes) if hidden_sizes else [params["hidden_size"]]
    tokenizer = None
    if size != "tiny":
        from ctrlg.lm.models import load_tokenizer
        tokenizer = load_tokenizer()
    dfa_watch = Stopwatch("cpu", wall=True)
    with dfa_watch:
        dfa, eos_id = _constraint(params, tokenizer)
    n, V = params["max_new_tokens"], params["vocab_size"]
    rows, skipped = [], []
    # The tables depend on the DFA and the HMM only: build them once per h, reuse for every LM
    # and batch size (one DFA shared by all rows).
    processors = {}
    for h in hs:
        hmm = random_hmm(h, V, seed=seed, device=device)
        build = Stopwatch(device, wall=True)
        with build:
            proc = ConstraintLogitsProcessor(hmm, dfa, prompt_length=params["prompt_length"],
                                             max_new_tokens=n, eos_token_id=eos_id)
        processors[h] = (proc, build.last_s)
    for name in params["models"]:
        try:
            model = _load_lm(name, params, device, seed)
        except Exception as err:  # e.g. the embedded model's wheel is missing
            skipped.append({"model": name, "reason": f"{type(err).__name__}: {err}"})
            continue
        n_params = sum(p.numel() for p in model.parameters())
        for h, (proc, build_s) in processors.items():
            for batch in params["batches"]:
                g = torch.Generator().manual_seed(seed + batch)
                prompt = torch.randint(2, V, (1, params["prompt_length"]), generator=g)
                prompt = prompt.expand(batch, -1).contiguous().to(device)
                guided_decode(model, proc, prompt, n, seed=seed)  # warm-up (kernels, caches)
                lm_watch, guide_watch = Stopwatch(device, wall=True), Stopwatch(device, wall=True)
                generated = guided_decode(model, proc, prompt, n, seed=seed, lm_watch=lm_watch,
                                          guide_watch=guide_watch)
                rows.append({
                    "model": name, "params_m": n_params / 1e6, "batch": batch, "hidden_size": h,
                    "vocab_size": V, "dfa_states": dfa.num_states, "max_new_tokens": n,
                    "lm_step_s": lm_watch.median_s, "guidance_step_s": guide_watch.median_s,
                    "overhead": guide_watch.median_s / lm_watch.median_s,
                    "table_build_s": build_s, "accepted_fraction": _accepted(dfa, generated, eos_id),
                    "lm_steps_timed": len(lm_watch.laps), "guidance_steps_timed": len(guide_watch.laps),
                })
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for row in rows:
        for key in ("lm_step_s", "guidance_step_s"):
            if not (math.isfinite(row[key]) and row[key] > 0):
                raise RuntimeError(f"non-positive timing {key}={row[key]} in {row}")
    return {"description": "per generated token: guidance step vs LM decoding step (wall clock)",
            "constraint": "keywords [5] and [7, 8], <= n tokens" if tokenizer is None else
            f"CommonGen {params['concepts']} with {params['min_words']}-{params['max_words']} words, EOS",
            "dfa_states": dfa.num_states, "dfa_build_s": dfa_watch.last_s,
            "target": "guidance <= 10% of the LM step (DESIGN.md)", "rows": rows, "skipped": skipped}


def _accepted(dfa, generated: torch.Tensor, eos_id: int | None) -> float:
    """Fraction of rows whose generation (cut after the first EOS) the DFA accepts."""
    ok = 0
    for row in generated.tolist():
        if eos_id is not None and eos_id in row:
            row = row[:row.index(eos_id) + 1]
        ok += bool(dfa.accepts(row))
    return ok / max(1, len(generated))
