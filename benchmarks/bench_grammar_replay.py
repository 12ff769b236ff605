"""Benchmark: grammar masks along real outputs, the per-configuration costs memo on and off.

Replays the outputs of a ``benchmarks.demo_grammar`` run (both modes, every output that fits the
budget, then EOS) through the exact grammar masks (``GrammarMask.allowed`` + ``advance``, one
fresh mask provider per output, budget 48), with
:meth:`ctrlg.guide.grammar_masks.GrammarFeasibility.candidate_costs`' memo at its default size and
with it off (``MAX_MEMOISED_COSTS = 0``), alternating, ``--repeats`` times each; every replayed
token must be in its mask. Reports per grammar the seconds of each repeat, the memo's hits and the
ratio of the medians (memo ÷ no memo).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_grammar_replay \\
        --demo benchmarks/results/demo_grammar_superset/grammar.json [--constraint lazy_grammar]

Writes ``benchmarks/results/bench_grammar_replay.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET = 48


def replay(constraint, sequences, eos: int) -> tuple[float, int, int]:
    """(seconds in masks, steps, memo hits) over ``sequences``, one mask provider each."""
    from ctrlg.guide.feasibility import Feasibility
    from ctrlg.guide.masks import token_mask

    seconds, steps, hits = 0.0, 0, 0
    for seq in sequences:
        masks = token_mask(constraint, Feasibility(constraint.dfa, BUDGET, eos_token_id=eos))
        cursor, q = masks.start(), constraint.dfa.initial
        for k, t in enumerate(seq):
            t0 = time.perf_counter()
            allowed = masks.allowed(cursor, q, BUDGET - k)
            seconds += time.perf_counter() - t0
            if not allowed[t]:
                raise AssertionError(f"token {t} of a replayed output is not in its mask")
            cursor, q = masks.advance(cursor, t), constraint.dfa.step(q, t)
            steps += 1
        hits += masks.masks.memo_hits
    return seconds, steps, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, required=True)
    parser.add_argument("--constraint", choices=("grammar", "lazy_grammar"), default="grammar")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_grammar_replay.json")
    args = parser.parse_args()

    from ctrlg import dfa
    from ctrlg.dfa.cfg.examples import EXAMPLES
    from ctrlg.guide import grammar_masks
    from ctrlg.lm.models import load_tokenizer

    tok = load_tokenizer()
    eos = tok.eos_token_id
    demo = json.loads(args.demo.read_text())
    compile_fn = dfa.grammar if args.constraint == "grammar" else dfa.lazy_grammar
    default = grammar_masks.MAX_MEMOISED_COSTS
    rows = []
    for name, entry in demo["grammars"].items():
        constraint = compile_fn(EXAMPLES[name], tok, vocab_size=len(tok))
        if not hasattr(constraint, "recogniser"):
            continue                                   # a regular grammar: no grammar masks
        sequences = [seq for mode in entry["modes"].values() for r in mode["results"]
                     for seq in [tok.encode(r["text"], add_special_tokens=False) + [eos]]
                     if len(seq) <= BUDGET]
        row = {"grammar": name, "outputs": len(sequences), "memo_s": [], "no_memo_s": []}
        for _ in range(args.repeats):
            for key, size in (("memo_s", default), ("no_memo_s", 0)):
                grammar_masks.MAX_MEMOISED_COSTS = size
                try:
                    seconds, steps, hits = replay(constraint, sequences, eos)
                finally:
                    grammar_masks.MAX_MEMOISED_COSTS = default
                row[key].append(seconds)
                row["steps"] = steps
                if size:
                    row["memo_hits"] = hits
        row["ratio"] = float(np.median(row["memo_s"]) / np.median(row["no_memo_s"]))
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}),
              flush=True)
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"demo": str(args.demo), "constraint": args.constraint,
                                    "budget": BUDGET, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
