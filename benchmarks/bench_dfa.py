"""Benchmark: building token DFAs on the SmolLM2 tokenizer (V = 49,152).

Measures, in one process on CPU:

1. the CommonGen constraint (all concepts in any inflection ∧ 5–20 words ∧ EOS discipline) for
   4 concepts (DESIGN.md's target: ≤ 1 s, ≤ 50 MB; the published implementation: 787 states,
   311 s, 4.2 GB) and for 5 concepts — states, stored (letter) exceptions, per-token exceptions,
   letters, build time and peak Python memory (tracemalloc);
   — with the end-of-word check for keywords (the default) and without it (``whole_word=False``,
   the variant comparable to the published automaton);
2. the 4-concept constraint without the end-of-word check built by a per-token reference: a
   product over reachable pairs that iterates over the union of the two states' exception
   *tokens* (no letters), as a ratio, and checked to accept the same language;
3. the intersection of 10 keyword DFAs: states of the full product (Π |Q_i|) vs the reachable
   pairs our product visits (``minimal=False``) vs the minimal DFA, and the build time.

The tokenizer's vocabulary index (token → bytes) is built once per tokenizer and cached; it is
timed separately ("vocabulary index") and warmed before the constraint timings.

Prints a table and writes ``benchmarks/results/bench_dfa.json``.

    python -m benchmarks.bench_dfa            # ~2 minutes on 2 cores (the reference is slow)
    python -m benchmarks.bench_dfa --quick    # skip the per-token reference
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
CONCEPTS_4 = "field_N#look_V#stand_V#dog_N"
CONCEPTS_5 = "field_N#look_V#stand_V#dog_N#throw_V"
KEYWORDS_10 = ["dog", "cat", "field", "look", "stand", "throw", "ball", "tree", "run", "water"]


def measure(fn, repeats: int = 3):
    """(result, best wall time in s, peak traced memory in MB of one run)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return result, best, peak


def reference_intersect(a, b):
    """Per-token reference: BFS over reachable pairs; for each pair the union of both states'
    exception tokens (numpy), default pair for the rest. Returns (states, exceptions)."""
    from ctrlg.dfa import DFABuilder

    a, b = a.without_letters(), b.without_letters()
    ids = {(a.initial, b.initial): 0}
    queue = [(a.initial, b.initial)]
    rows = []
    head = 0
    while head < len(queue):
        s1, s2 = queue[head]
        head += 1
        t1, n1 = a.exceptions(s1)
        t2, n2 = b.exceptions(s2)
        tokens = np.union1d(t1, t2)
        next1 = np.full(len(tokens), a.default[s1])
        next1[np.searchsorted(tokens, t1)] = n1
        next2 = np.full(len(tokens), b.default[s2])
        next2[np.searchsorted(tokens, t2)] = n2
        keys = next1 * b.num_states + next2
        uniq, inverse = np.unique(keys, return_inverse=True)
        targets = []
        for key in uniq.tolist():
            pair = divmod(key, b.num_states)
            if pair not in ids:
                ids[pair] = len(queue)
                queue.append(pair)
            targets.append(ids[pair])
        default_pair = (int(a.default[s1]), int(b.default[s2]))
        if default_pair not in ids:
            ids[default_pair] = len(queue)
            queue.append(default_pair)
        rows.append((ids[default_pair], tokens, np.asarray(targets)[inverse.ravel()]))
    builder = DFABuilder(a.vocab_size)
    for _ in queue:
        builder.add_state()
    for s, (default, tokens, targets) in enumerate(rows):
        builder.set_transitions(s, default, dict(zip(tokens.tolist(), targets.tolist())))
        s1, s2 = queue[s]
        if a.accepting[s1] and b.accepting[s2]:
            builder.set_accepting(s)
    result = builder.build()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the per-token reference")
    args = parser.parse_args()

    from ctrlg import dfa
    from ctrlg.lm.models import load_tokenizer
    from ctrlg.vocab import token_bytes

    tokenizer = load_tokenizer()
    start = time.perf_counter()
    token_bytes(tokenizer)
    vocab_index_s = time.perf_counter() - start
    dfa.inflections("stand", "V")          # load lemminflect's tables once
    rows = []
    results: dict = {"vocab_size": len(token_bytes(tokenizer)), "vocab_index_s": vocab_index_s}

    for name, concepts, whole in (("commongen_4", CONCEPTS_4, True),
                                  ("commongen_4_no_word_end", CONCEPTS_4, False),
                                  ("commongen_5", CONCEPTS_5, True)):
        d, seconds, peak = measure(
            lambda c=concepts, w=whole: dfa.commongen_constraint(c, tokenizer, min_words=5,
                                                                 max_words=20, whole_word=w))
        entry = {"concepts": concepts, "whole_word": whole, "states": d.num_states,
                 "letters": d.num_letters,
                 "stored_exceptions": d.num_stored_exceptions,
                 "per_token_exceptions": d.num_exceptions, "build_s": seconds, "peak_mb": peak}
        results[name] = entry
        rows.append((name + " (ours)", d.num_states, d.num_stored_exceptions, d.num_exceptions,
                     seconds, peak))

    if not args.quick:
        groups = [dfa.inflections(w, p) for w, p in
                  (c.split("_") for c in CONCEPTS_4.split("#"))]
        parts = (dfa.keywords(groups, tokenizer, whole_word=False), dfa.word_count(5, 20, tokenizer),
                 dfa.eos(tokenizer.eos_token_id, len(token_bytes(tokenizer)), required=True))

        def per_token():
            out = parts[0]
            for p in parts[1:]:
                out = reference_intersect(out, p).trim()
            return out

        start = time.perf_counter()
        ref = per_token()
        ref_s = time.perf_counter() - start
        ref_states = ref.num_states
        ref_min = dfa.minimize(ref).num_states
        ours = dfa.commongen_constraint(CONCEPTS_4, tokenizer, min_words=5, max_words=20,
                                        whole_word=False)
        same_language = (dfa.intersect(ref, dfa.complement(ours, allow_empty=True),
                                       allow_empty=True).is_empty()
                         and dfa.intersect(ours, dfa.complement(ref, allow_empty=True),
                                           allow_empty=True).is_empty())
        results["commongen_4_per_token_reference"] = {
            "states_trimmed": ref_states, "states_minimal": ref_min,
            "exceptions": ref.num_exceptions, "build_s": ref_s, "same_language": same_language,
            "ratio_vs_ours": ref_s / results["commongen_4_no_word_end"]["build_s"]}
        rows.append(("commongen_4_no_word_end (per-token ref)", ref_states, ref.num_exceptions,
                     ref.num_exceptions, ref_s, float("nan")))

    keyword_dfas = [dfa.keywords([dfa.inflections(w)], tokenizer) for w in KEYWORDS_10]
    full_product = int(np.prod([float(k.num_states) for k in keyword_dfas]))
    reach, reach_s, reach_mb = measure(lambda: dfa.intersect(*keyword_dfas, minimal=False), 1)
    mini, mini_s, mini_mb = measure(lambda: dfa.intersect(*keyword_dfas), 1)
    results["keywords_10"] = {
        "keywords": KEYWORDS_10, "states_each": [k.num_states for k in keyword_dfas],
        "full_product_states": full_product, "reachable_trimmed_states": reach.num_states,
        "minimal_states": mini.num_states, "build_reachable_s": reach_s,
        "build_minimal_s": mini_s, "peak_mb_minimal": mini_mb,
        "letters": mini.num_letters, "stored_exceptions": mini.num_stored_exceptions}
    rows.append(("10 keywords: full product", full_product, None, None, None, None))
    rows.append(("10 keywords: reachable (trimmed)", reach.num_states, reach.num_stored_exceptions,
                 reach.num_exceptions, reach_s, reach_mb))
    rows.append(("10 keywords: minimal", mini.num_states, mini.num_stored_exceptions,
                 mini.num_exceptions, mini_s, mini_mb))

    print(f"vocabulary index (once per tokenizer): {vocab_index_s:.2f} s; V = "
          f"{results['vocab_size']}")
    header = f"{'automaton':42} {'states':>12} {'stored exc':>11} {'token exc':>11} " \
             f"{'build s':>8} {'peak MB':>8}"
    print(header)
    print("-" * len(header))
    fmt = lambda v, f: ("" if v is None else (f.format(v) if v == v else "-"))  # noqa: E731
    for name, states, stored, per_token, seconds, peak in rows:
        print(f"{name:42} {states:>12,} {fmt(stored, '{:,}'):>11} {fmt(per_token, '{:,}'):>11} "
              f"{fmt(seconds, '{:.3f}'):>8} {fmt(peak, '{:.1f}'):>8}")
    if "commongen_4_per_token_reference" in results:
        r = results["commongen_4_per_token_reference"]
        print(f"per-token reference / ours (4 concepts, no word-end check): "
              f"{r['ratio_vs_ours']:.1f}x build time; reference minimal states "
              f"{r['states_minimal']} vs ours {results['commongen_4_no_word_end']['states']}; "
              f"same language: {r['same_language']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_dfa.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
