"""Benchmark: the CommonGen+ constraint automata (5…9 concepts) on the SmolLM2 tokenizer.

For the first ``--items`` items of each size of the bundled CommonGen+ set
(:mod:`ctrlg.data.commongen_plus`), in one process on CPU:

* ``dfa.commongen_constraint`` as the experiment builds it (every concept in some inflection ∧
  ≥ 5 words ∧ EOS ends the generation: ``configs/constraint/commongen.yaml``) and with a 5-30
  word range (the word counter multiplies the states by ~30): states, stored (letter)
  exceptions and build time (best of ``--repeats``; lemminflect and the vocabulary index are
  warmed first);
* the previous builder (every part minimised, then their minimised intersection, as
  ``commongen_constraint`` built it before the one trimmed product) on the same items with 5-30
  words, for sizes up to ``--reference-max`` (it needs minutes beyond): the time ratio, the
  minimal state count, and a check that both accept the same language.

Prints a table and writes ``benchmarks/results/bench_commongen_plus.json`` (with the machine's
load average, since the machine is shared).

    nice -n 10 python -m benchmarks.bench_commongen_plus            # ~3 minutes on 2 cores
    python -m benchmarks.bench_commongen_plus --items 2 --reference-max 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"experiment (>= 5 words)": (5, None), "5-30 words": (5, 30)}


def _concepts(item) -> list[str]:
    return [f"{c}_{p[0]}" if p else c for c, p in zip(item.concepts, item.pos)]


def _best(fn, repeats: int):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def previous_builder(concepts, tokenizer, min_words, max_words):
    """The construction ``commongen_constraint`` replaced: each part minimised, then their
    minimised intersection."""
    from ctrlg import dfa

    groups = [dfa.inflections(w, p) for w, p in dfa.words.parse_concepts(concepts)]
    return dfa.intersect(dfa.keywords(groups, tokenizer),
                         dfa.word_count(min_words, max_words, tokenizer),
                         dfa.eos(tokenizer.eos_token_id, len(tokenizer), required=True))


def same_language(a, b) -> bool:
    from ctrlg import dfa

    return (dfa.intersect(a, dfa.complement(b, allow_empty=True), allow_empty=True).is_empty()
            and dfa.intersect(b, dfa.complement(a, allow_empty=True), allow_empty=True).is_empty())


def measure_size(items, tokenizer, repeats: int, reference: bool) -> dict:
    from ctrlg import dfa

    out = {}
    for name, (lo, hi) in SETTINGS.items():
        rows = []
        for item in items:
            concepts = _concepts(item)
            d, seconds = _best(lambda: dfa.commongen_constraint(concepts, tokenizer, lo, hi),
                               repeats)
            row = {"concepts": item.key, "states": d.num_states,
                   "stored_exceptions": d.num_stored_exceptions, "build_s": seconds}
            if reference and hi is not None:
                ref, ref_s = _best(lambda: previous_builder(concepts, tokenizer, lo, hi), 1)
                row.update(previous_s=ref_s, minimal_states=ref.num_states,
                           same_language=same_language(d, ref))
            rows.append(row)
        summary = {key: statistics.median(r[key] for r in rows)
                   for key in ("states", "stored_exceptions", "build_s")}
        summary["max_states"] = max(r["states"] for r in rows)
        summary["max_build_s"] = max(r["build_s"] for r in rows)
        if reference and hi is not None:
            summary["previous_s"] = statistics.median(r["previous_s"] for r in rows)
            summary["speedup"] = statistics.median(r["previous_s"] / r["build_s"] for r in rows)
            summary["extra_states_vs_minimal"] = max(r["states"] / r["minimal_states"] - 1
                                                     for r in rows)
            summary["same_language"] = all(r["same_language"] for r in rows)
        out[name] = {"summary": summary, "items": rows}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=5, help="items per size")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--reference-max", type=int, default=7,
                        help="largest size also built by the previous builder")
    parser.add_argument("--out", default=str(RESULTS / "bench_commongen_plus.json"))
    args = parser.parse_args(argv)

    from ctrlg import dfa
    from ctrlg.data import load_commongen
    from ctrlg.data.commongen_plus import BUNDLED_NAME
    from ctrlg.lm.models import load_tokenizer

    tokenizer = load_tokenizer()
    items = load_commongen(f"bundled:{BUNDLED_NAME}")
    dfa.commongen_constraint(["dog_N"], tokenizer, 1, 3)            # warm lemminflect, vocabulary
    results = {"load_average": os.getloadavg(), "items_per_size": args.items, "sizes": {}}
    print(f"load average {results['load_average'][0]:.2f} (2 cores shared)")
    print(f"{'size':>4} | {'setting':<24} | {'states (median/max)':>20} | {'build s (median/max)':>21}"
          f" | previous builder")
    for size in range(5, 10):
        chosen = [item for item in items if len(item.concepts) == size][:args.items]
        entry = measure_size(chosen, tokenizer, args.repeats, size <= args.reference_max)
        results["sizes"][size] = entry
        for name, value in entry.items():
            s = value["summary"]
            extra = (f"{s['previous_s']:.2f} s ({s['speedup']:.1f}x the time); ours has "
                     f"≤ {100 * s['extra_states_vs_minimal']:.1f} % more states than the minimal "
                     f"one; same language: {s['same_language']}") if "previous_s" in s else ""
            print(f"{size:>4} | {name:<24} | {s['states']:>10,.0f} / {s['max_states']:>7,} | "
                  f"{s['build_s']:>9.2f} / {s['max_build_s']:>9.2f} | {extra}")
    results["load_average_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
