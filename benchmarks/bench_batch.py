"""Benchmark: Ctrl-G guidance ÷ LM step at batch 1 / 8 / 32, in one process.

SmolLM2-135M (the embedded model, :func:`ctrlg.lm.models.load_model`), a random Dirichlet HMM with
h = 256 over its V = 49152 tokens, and the CommonGen 4-concept constraint
(:func:`ctrlg.dfa.commongen_constraint`: the concepts in some inflection ∧ 5–20 words ∧ EOS).
For each batch size B the prompt is repeated B times and decoded with a KV cache by hand, so the
two costs are timed separately on the same rows:

* LM step: ``model(next_tokens [B, 1], cache)``;
* guidance: ``ConstraintLogitsProcessor.__call__(input_ids [B, T], scores [B, V])`` (row
  bookkeeping + guided log-probs), exactly what ``model.generate`` calls.

Rows sample independently (torch.multinomial on the guided distribution); finished rows are
padded with EOS, as transformers does. Reported: median ms per step of each, their ratio
(median guide / median LM) and the min-based ratio (fastest guide step / fastest LM step, less
sensitive to other load on the machine). Both run under the same torch intra-op thread count (``--threads``;
set ``OMP_NUM_THREADS`` to the same value). Ratios measured in one process are robust to other
load on the machine; absolute times are not.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_batch --threads 1
    python -m benchmarks.bench_batch --batch 1 8 --steps 8 --profile   # cProfile of the guidance

Writes ``benchmarks/results/bench_batch.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time
from pathlib import Path

import torch

from benchmarks.bench_guide import dirichlet_hmm
from ctrlg import dfa
from ctrlg.lm.models import load_model, load_tokenizer
from ctrlg.sampler import ConstraintLogitsProcessor
from ctrlg.vocab import Vocabulary
from ctrlg.lm.shared_context import cache_keyword, returned_cache

RESULTS = Path(__file__).resolve().parent / "results"
CONCEPTS = ["dog_N", "frisbee_N", "catch_V", "throw_V"]


@torch.no_grad()
def time_batch(model, proc, prompt_ids: list[int], batch: int, steps: int, eos: int, seed: int = 0,
               profiler: cProfile.Profile | None = None) -> tuple[list[float], list[float]]:
    """Per-step LM and guidance times (seconds) for ``batch`` rows decoded by hand."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt_ids] * batch)
    proc.reset()
    out = model(input_ids=ids, use_cache=True)
    past, logits = returned_cache(out), out.logits[:, -1].float()
    lm_times, guide_times = [], []
    done = torch.zeros(batch, dtype=torch.bool)
    for _ in range(steps):
        scores = torch.log_softmax(logits, -1)
        if profiler is not None:
            profiler.enable()
        t0 = time.perf_counter()
        guided = proc(ids, scores)
        guide_times.append(time.perf_counter() - t0)
        if profiler is not None:
            profiler.disable()
        nxt = torch.multinomial(torch.softmax(guided.float(), -1), 1, generator=g)
        nxt[done] = eos
        done |= nxt[:, 0] == eos
        ids = torch.cat([ids, nxt], 1)
        if bool(done.all()):
            break
        t1 = time.perf_counter()
        out = model(input_ids=nxt, **{cache_keyword(model): past}, use_cache=True)
        lm_times.append(time.perf_counter() - t1)
        past, logits = returned_cache(out), out.logits[:, -1].float()
    return lm_times, guide_times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=24, help="decoding steps timed per batch size")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="decoding runs per batch size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", nargs="+", default=["float32", "bfloat16"],
                        help="guidance precisions to measure (ConstraintLogitsProcessor(precision=))")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the guidance")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_batch.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer, model = load_tokenizer(), load_model()
    model.eval()
    vocab = Vocabulary.from_model(model, tokenizer)
    t0 = time.perf_counter()
    constraint = dfa.commongen_constraint(CONCEPTS, vocab, 5, 20)
    dfa_s = time.perf_counter() - t0
    hmm = dirichlet_hmm(args.hidden, constraint.vocab_size, seed=args.hidden)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a sentence using the words: dog, frisbee, catch, throw."}],
        tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    print(f"torch threads {torch.get_num_threads()} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}); "
          f"DFA {constraint.num_states} states in {dfa_s:.2f} s", flush=True)
    rows = []
    profiler = cProfile.Profile() if args.profile else None
    for precision in args.precision:
        t0 = time.perf_counter()
        proc = ConstraintLogitsProcessor(hmm, constraint, max_new_tokens=args.max_new_tokens,
                                         eos_token_id=vocab.eos_token_ids, precision=precision)
        tables_s = time.perf_counter() - t0
        print(f"precision {precision}: h={args.hidden} tables in {tables_s:.1f} s", flush=True)
        for batch in args.batch:
            lm, guide = [], []
            for r in range(args.repeats):
                times = time_batch(model, proc, prompt_ids, batch, args.steps, vocab.eos_token_id,
                                   seed=r, profiler=profiler)
                lm += times[0]
                guide += times[1][1:]   # the first call of a generation also sets up the rows
            lm_ms, guide_ms = 1e3 * statistics.median(lm), 1e3 * statistics.median(guide)
            row = dict(precision=precision, batch=batch, lm_step_ms=lm_ms, guide_step_ms=guide_ms,
                       ratio=guide_ms / lm_ms, ratio_min=min(guide) / min(lm), lm_steps=len(lm),
                       guide_steps=len(guide), table_build_s=tables_s)
            rows.append(row)
            print(f"  batch {batch:3d}: LM {lm_ms:8.2f} ms  guidance {guide_ms:7.2f} ms  "
                  f"guidance/LM {100 * row['ratio']:5.1f} % (min-based {100 * row['ratio_min']:5.1f} %)",
                  flush=True)
        del proc
    if profiler is not None:
        pstats.Stats(profiler).sort_stats(os.environ.get("SORT","cumulative")).print_stats(int(os.environ.get("NSTAT","25")))
    result = dict(model="SmolLM2-135M-Instruct (embedded)", hidden=args.hidden, concepts=CONCEPTS,
                  words=[5, 20], dfa_states=constraint.num_states, max_new_tokens=args.max_new_tokens,
                  threads=torch.get_num_threads(), omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                  cpu_count=os.cpu_count(), load_average=os.getloadavg(), rows=rows,
                  command="OMP_NUM_THREADS=%s python -m benchmarks.bench_batch --threads %d"
                          % (os.environ.get("OMP_NUM_THREADS", "?"), args.threads))
    if not args.profile:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
