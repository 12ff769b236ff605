"""Benchmark: guidance for a batch of items (one DFA each) at a few rows per item, in one process.

CommonGen's main job decodes 10 items per batch at 8 beams: 10 guide tables of one HMM, 8 rows
each. Per generated token the guide multiplies each table's [2R, h] left operand by the emission
B [h, V] (V = 49,152); at R = 8 that product is memory-bound, so what it costs is reading B. Two
ways, timed alternately on the same rows (ratios in one process are robust to other load):

* per table (the reference): ``GuideTables.log_ratio`` table by table — B read once per item;
* shared: ``ctrlg.guide.token_weights.log_ratios`` — the operands of all tables stacked, B read
  once per step (what ``guidance_log_ratio`` does).

Also timed: building the tables of the batch with the HMM-only operands (Bᵀ, its packed copy,
rowsum(B), min_v B) built per table (cache cleared before each table: the reference) and shared
(:mod:`ctrlg.guide.emission_operands`).

The constraints are those of the first ``--items`` CommonGen dev items (the main job's), the HMM
a random Dirichlet HMM of size ``--hidden`` over SmolLM2's vocabulary (timings do not depend on
its values).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_guide_items --hidden 256 512

Writes ``benchmarks/results/bench_guide_items.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_guide import dirichlet_hmm
from ctrlg.data.commongen import load_commongen
from ctrlg.dfa import commongen_constraint
from ctrlg.guide import build_tables
from ctrlg.guide import emission_operands as operands_module
from ctrlg.guide.token_weights import log_ratios
from ctrlg.lm.models import load_tokenizer
from ctrlg.vocab import eos_token_ids

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB_SIZE = 49152   # SmolLM2's output size


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _build_batch(hmm, dfas, max_new_tokens, eos, shared: bool) -> list:
    tables = []
    for d in dfas:
        if not shared:
            operands_module._CACHE.clear()
        tables.append(build_tables(hmm, d, max_new_tokens, eos_token_id=eos, progress=False))
    return tables


def bench(hidden: int, dfas, eos, rows: int, steps: int, max_new_tokens: int) -> dict:
    hmm = dirichlet_hmm(hidden, dfas[0].vocab_size, seed=hidden)
    build = {"per_table": [], "shared": []}
    for _ in range(2):
        for mode in ("per_table", "shared"):
            operands_module._CACHE.clear()
            build[mode].append(_timed(lambda: _build_batch(hmm, dfas, max_new_tokens, eos, mode == "shared")))
    tables = _build_batch(hmm, dfas, max_new_tokens, eos, shared=True)
    g = torch.Generator().manual_seed(0)
    per_table, shared = [], []
    for step in range(steps):
        remaining = max_new_tokens - step % 8
        queries = []
        for t in tables:
            states = np.flatnonzero(t.feasible[remaining])[:rows]
            states = np.resize(states, rows)
            priors = torch.softmax(torch.randn(rows, hidden, generator=g), -1)
            queries.append((t, states, priors, remaining))
        per_table.append(_timed(lambda: [t.log_ratio(s, p, r, shifted=True) for t, s, p, r in queries]))
        shared.append(_timed(lambda: log_ratios(queries, shifted=True)))
    med = {k: statistics.median(v) for k, v in (("per_table", per_table), ("shared", shared))}
    return {
        "hidden": hidden, "items": len(tables), "rows_per_item": rows, "steps": steps,
        "guide_ms_per_step": {k: 1e3 * v for k, v in med.items()},
        "guide_speedup": med["per_table"] / med["shared"],
        "tables_s": {k: min(v) for k, v in build.items()},
        "tables_speedup": min(build["per_table"]) / min(build["shared"]),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--rows", type=int, default=8, help="rows (beams) per item")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_guide_items.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer()
    eos = eos_token_ids(tokenizer)
    dfas = [commongen_constraint([f"{c}_{p[0]}" if p else c for c, p in zip(item.concepts, item.pos)],
                                 tokenizer, min_words=1, eos_token_id=eos[0], vocab_size=VOCAB_SIZE)
            for item in load_commongen(limit=args.items)]
    results = []
    for hidden in args.hidden:
        r = bench(hidden, dfas, eos, args.rows, args.steps, args.max_new_tokens)
        results.append(r)
        print(f"h = {hidden}, {r['items']} items × {r['rows_per_item']} rows: guidance "
              f"{r['guide_ms_per_step']['per_table']:.1f} → {r['guide_ms_per_step']['shared']:.1f} ms per step "
              f"(× {r['guide_speedup']:.2f}); tables {r['tables_s']['per_table']:.2f} → "
              f"{r['tables_s']['shared']:.2f} s per batch (× {r['tables_speedup']:.2f})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": args.threads, "results": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
