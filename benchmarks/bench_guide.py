"""Benchmark: Ctrl-G guidance cost per generated token vs the LM's own forward step.

Measures, in one process on CPU (float32):

1. per-token guidance time (``ConstraintLogitsProcessor.__call__``) vs SmolLM2-135M's KV-cached
   forward step, for random Dirichlet HMMs with V = 49152 and h ∈ {128, 256, 1024, 4096}, under the
   CommonGen 5-concept constraint (concepts ∧ 5–20 words ∧ EOS) — plus the table build time
   (h = 128 is the size of the embedded distilled HMM);
2. per-step guidance cost vs the number of tokens generated so far (should be flat), with the
   same concepts and no upper word bound (a few hundred states, so tables for n = 513 stay small);
3. per-step guidance cost vs the number of DFA states at a fixed number of exceptions per state
   (should be flat), on synthetic chain DFAs.

Prints a table and writes ``benchmarks/results/bench_guide.json`` and ``bench_guide.png``.

    python -m benchmarks.bench_guide                 # full run (a few minutes on 2 cores)
    python -m benchmarks.bench_guide --hidden 256 --steps 8 --quick
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from ctrlg.lm.shared_context import cache_keyword, returned_cache

RESULTS = Path(__file__).resolve().parent / "results"
#: precision of the guidance products (``--precision``; float32 as in the recorded results)
PRECISION = "float32"


def dirichlet_hmm(h: int, V: int, seed: int, emission_concentration: float = 0.05):
    """A random HMM: Dirichlet rows (small concentration → peaked emissions, like a real HMM).
    Normalised in place in float32 to keep the peak memory near one copy of B."""
    from ctrlg import HMM

    g = torch.Generator().manual_seed(seed)
    pi = torch._standard_gamma(torch.ones(h), generator=g)
    A = torch._standard_gamma(torch.full((h, h), 0.5), generator=g)
    B = torch._standard_gamma(torch.full((h, V), emission_concentration), generator=g)
    B.add_(1e-12)
    for t in (pi, A, B):
        t.div_(t.sum(-1, keepdim=True))
    return HMM(pi, A, B)


def commongen_dfa(tokenizer, concepts, min_words=5, max_words=20):
    from ctrlg import dfa

    return dfa.commongen_constraint(list(concepts), tokenizer, min_words, max_words)


def time_lm_and_guide(model, proc, prompt_ids, steps: int, seed: int = 0):
    """Manual KV-cached decoding; returns per-step LM times and guidance times (seconds)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt_ids])
    lm_times, guide_times = [], []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        past = returned_cache(out)
        logits = out.logits[:, -1].float()
        for step in range(steps):
            t1 = time.perf_counter()
            scores = proc(ids, torch.log_softmax(logits, -1))
            t2 = time.perf_counter()
            guide_times.append(t2 - t1)
            probs = torch.softmax(scores, -1)
            nxt = torch.multinomial(probs, 1, generator=g)
            ids = torch.cat([ids, nxt], 1)
            if proc.eos_ids and int(nxt) in proc.eos_ids:
                break
            t3 = time.perf_counter()
            out = model(input_ids=nxt, **{cache_keyword(model): past}, use_cache=True)
            t4 = time.perf_counter()
            lm_times.append(t4 - t3)
            past = returned_cache(out)
            logits = out.logits[:, -1].float()
    return lm_times, guide_times, ids[0, len(prompt_ids):].tolist()


def bench_overhead(model, tokenizer, concepts, hidden_sizes, steps, max_new_tokens):
    from ctrlg.sampler import ConstraintLogitsProcessor

    constraint = commongen_dfa(tokenizer, concepts)
    prompt = tokenizer("Write a sentence using the words: " + ", ".join(concepts) + ".\n").input_ids
    rows = []
    for h in hidden_sizes:
        hmm = dirichlet_hmm(h, constraint.vocab_size, seed=h)
        t0 = time.perf_counter()
        proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=len(prompt), precision=PRECISION,
                                         max_new_tokens=max_new_tokens,
                                         eos_token_id=tokenizer.eos_token_id)
        build = time.perf_counter() - t0
        table_mb = proc.tables[0].w_hat.numel() * 4 / 2**20
        lm, guide, generated = time_lm_and_guide(model, proc, prompt, steps)
        lm_ms, guide_ms = 1e3 * statistics.median(lm), 1e3 * statistics.median(guide)
        row = dict(hidden=h, states=constraint.num_states,
                   letter_exceptions=constraint.num_stored_exceptions,
                   max_new_tokens=max_new_tokens, table_build_s=build, table_mb=table_mb,
                   lm_step_ms=lm_ms, guide_step_ms=guide_ms, overhead=guide_ms / lm_ms,
                   lm_min_ms=1e3 * min(lm), guide_min_ms=1e3 * min(guide),
                   overhead_min=min(guide) / min(lm),
                   guide_ms_per_step=[1e3 * t for t in guide], lm_ms_per_step=[1e3 * t for t in lm],
                   sample=tokenizer.decode(generated))
        rows.append(row)
        print(f"h={h:5d}  states={constraint.num_states}  build {build:6.1f} s  tables {table_mb:7.1f} MB  "
              f"LM {lm_ms:7.2f} ms  guide {guide_ms:7.2f} ms  overhead {100 * guide_ms / lm_ms:6.1f} % "
              f"(min-based {100 * min(guide) / min(lm):5.1f} %)",
              flush=True)
        del proc, hmm
    return rows


def bench_vs_length(tokenizer, concepts, h, lengths, repeats=9):
    """Guide time per call when `t` tokens were generated already (processor state cached)."""
    from ctrlg.sampler import ConstraintLogitsProcessor

    constraint = commongen_dfa(tokenizer, concepts, 1, None)
    n = max(lengths) + 1
    hmm = dirichlet_hmm(h, constraint.vocab_size, seed=1)
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=n,
                                      precision=PRECISION)
    g = torch.Generator().manual_seed(0)
    scores = torch.log_softmax(torch.randn(1, constraint.vocab_size, generator=g), -1)
    ids = torch.zeros(1, 1, dtype=torch.long)
    out, times = [], {}
    for t in range(max(lengths) + 1):
        if t in lengths:
            samples = []
            parents = copy.copy(proc.rows)  # the row states after t - 1 tokens
            for _ in range(repeats):  # same prefix, parent kept: the row is recomputed each time
                proc.rows = copy.copy(parents)
                proc._last_width = ids.shape[1] - 1  # else an equal width means "new generation"
                t0 = time.perf_counter()
                guided = proc(ids, scores)
                samples.append(time.perf_counter() - t0)
            times[t] = 1e3 * statistics.median(samples)
            out.append(dict(generated=t, guide_ms=times[t], guide_min_ms=1e3 * min(samples)))
            print(f"  t={t:4d}  guide {times[t]:6.2f} ms (min {1e3 * min(samples):6.2f})", flush=True)
        else:
            guided = proc(ids, scores)
        feasible = torch.isfinite(guided[0])
        choice = torch.multinomial(torch.softmax(guided[0], -1) * feasible, 1, generator=g)
        ids = torch.cat([ids, choice[None]], 1)
    return out


def chain_dfa(num_states: int, exceptions_per_state: int, V: int, seed: int):
    """Synthetic DFA: state s defaults to s+1 (last: itself), plus k exception tokens per state
    to random states; the last state accepts."""
    from ctrlg.dfa.core import DFABuilder

    rng = np.random.default_rng(seed)
    builder = DFABuilder(V)
    for s in range(num_states):
        builder.add_state(accepting=s == num_states - 1)
    for s in range(num_states):
        toks = rng.choice(V, size=exceptions_per_state, replace=False)
        dst = rng.integers(0, num_states, size=exceptions_per_state)
        builder.set_transitions(s, min(s + 1, num_states - 1), dict(zip(toks.tolist(), dst.tolist())))
    return builder.build()


def bench_vs_states(h, state_counts, exceptions_per_state, V, repeats=7):
    from ctrlg.sampler import ConstraintLogitsProcessor

    hmm = dirichlet_hmm(h, V, seed=2)
    out = []
    for S in state_counts:
        constraint = chain_dfa(S, exceptions_per_state, V, seed=S)
        proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=4,
                                          precision=PRECISION)
        scores = torch.log_softmax(torch.randn(1, V), -1)
        ids = torch.zeros(1, 1, dtype=torch.long)
        samples = []
        for _ in range(repeats):
            proc.reset()
            t0 = time.perf_counter()
            proc(ids, scores)
            samples.append(time.perf_counter() - t0)
        ms = 1e3 * statistics.median(samples)
        out.append(dict(states=S, exceptions_per_state=exceptions_per_state, guide_ms=ms,
                        guide_min_ms=1e3 * min(samples)))
        print(f"  S={S:6d}  guide {ms:6.2f} ms (min {1e3 * min(samples):6.2f})", flush=True)
    return out


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    over = results["overhead"]
    hs = [r["hidden"] for r in over]
    x = np.arange(len(hs))
    axes[0].bar(x - 0.2, [r["lm_step_ms"] for r in over], 0.4, label="LM step (SmolLM2-135M)")
    axes[0].bar(x + 0.2, [r["guide_step_ms"] for r in over], 0.4, label="Ctrl-G guidance")
    for xi, r in zip(x, over):
        axes[0].text(xi + 0.2, r["guide_step_ms"], f"{100 * r['overhead']:.0f}%", ha="center", va="bottom")
    axes[0].set_xticks(x, [f"h={h}" for h in hs])
    axes[0].set_ylabel("ms per token (median, batch 1, CPU)")
    axes[0].set_title("guidance vs LM step, CommonGen 5 concepts")
    axes[0].legend()
    ln = results["vs_length"]
    axes[1].plot([r["generated"] for r in ln], [r["guide_ms"] for r in ln], "o-", label="median")
    if "guide_min_ms" in ln[0]:
        axes[1].plot([r["generated"] for r in ln], [r["guide_min_ms"] for r in ln], "s--", label="min")
        axes[1].legend()
    axes[1].set_xscale("log", base=2)
    axes[1].set_ylim(bottom=0)
    axes[1].set_xlabel("tokens generated so far")
    axes[1].set_ylabel("guidance ms per token")
    axes[1].set_title(f"cost vs sequence length (h={results['config']['length_hidden']})")
    st = results["vs_states"]
    axes[2].plot([r["states"] for r in st], [r["guide_ms"] for r in st], "o-", label="median")
    if "guide_min_ms" in st[0]:
        axes[2].plot([r["states"] for r in st], [r["guide_min_ms"] for r in st], "s--", label="min")
        axes[2].legend()
    axes[2].set_xscale("log")
    axes[2].set_ylim(bottom=0)
    axes[2].set_xlabel("DFA states")
    axes[2].set_ylabel("guidance ms per token")
    axes[2].set_title(f"cost vs DFA states ({st[0]['exceptions_per_state']} exceptions/state, "
                      f"h={results['config']['states_hidden']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 256, 1024, 4096])
    parser.add_argument("--steps", type=int, default=16, help="generated tokens timed per h")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="small length/state sweeps")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16", "auto"],
                        help="of the guidance products (ConstraintLogitsProcessor(precision=))")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    parser.add_argument("--sections", nargs="+", default=["length", "states", "overhead"],
                        help="run only these sections, keeping the others from the existing JSON")
    args = parser.parse_args(argv)
    global PRECISION
    PRECISION = args.precision
    if args.plot_only:
        plot(json.loads((args.out / "bench_guide.json").read_text()), args.out / "bench_guide.png")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from ctrlg.data import load_commongen
    from ctrlg.lm.models import load_model, load_tokenizer

    tokenizer, model = load_tokenizer(), load_model()
    example = next(e for e in load_commongen() if len(e.concepts) == 5)
    concepts = [f"{c}_{(p or 'N')[0]}" for c, p in zip(example.concepts, example.pos)]
    print(f"CommonGen concepts: {concepts}; torch threads: {torch.get_num_threads()}")
    args.out.mkdir(parents=True, exist_ok=True)
    old = args.out / "bench_guide.json"
    results = json.loads(old.read_text()) if old.exists() and len(args.sections) < 3 else {}
    results["config"] = dict(concepts=concepts, threads=torch.get_num_threads(), vocab=len(tokenizer),
                              length_hidden=256, states_hidden=256, cpu=os.cpu_count(),
                              precision=args.precision)
    save = lambda: (args.out / "bench_guide.json").write_text(json.dumps(results, indent=2))  # noqa: E731
    if "length" in args.sections:
        lengths = [1, 4, 16, 64] if args.quick else [1, 4, 16, 64, 256, 512]
        print("guidance vs tokens generated")
        results["vs_length"] = bench_vs_length(tokenizer, concepts, 256, lengths)
        save()
    if "states" in args.sections:
        states = [10, 100, 1000] if args.quick else [10, 100, 1000, 10000]
        print("guidance vs DFA states (8 exceptions per state)")
        results["vs_states"] = bench_vs_states(256, states, 8, len(tokenizer))
        save()
    print("guidance vs LM step")
    # sizes measured now replace earlier entries of the same size (others are kept)
    results["overhead"] = [o for o in results.get("overhead", [])
                           if len(args.sections) < 3 and o["hidden"] not in args.hidden]
    for h in (args.hidden if "overhead" in args.sections else []):  # saved after each size
        results["overhead"] += bench_overhead(model, tokenizer, concepts, [h], args.steps,
                                              args.max_new_tokens)
        results["overhead"].sort(key=lambda o: o["hidden"])
        save()

    if all(key in results for key in ("overhead", "vs_length", "vs_states")):
        plot(results, args.out / "bench_guide.png")
    else:  # a first partial run into a new folder: nothing to draw the other panels from
        print("plot skipped: run every section once into this --out folder")
    print(f"wrote {args.out / 'bench_guide.json'} and {args.out / 'bench_guide.png'}")


if __name__ == "__main__":
    main()
