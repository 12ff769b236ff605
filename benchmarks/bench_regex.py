"""Regex → token automaton: compile time and per-token mask time, ctrlg vs outlines-core
(and llguidance when installed), on the same regexes and the same vocabulary (SmolLM2, 49,152
tokens), measured side by side in one process; plus canonical vs all-encodings compile time.

    python -m benchmarks.bench_regex [--repeats 3]

Compile time: building the regex's token index from a ready vocabulary (each library's
vocabulary object is built once, outside the timing, and reported separately). ctrlg: the raw
index (``minimize=False``) over letters (tokens with the same transformation of the states);
the JSON also records the minimised DFA's time and the time including the per-token view
(``exc_ptr``/``exc_tokens``). Mask time: mean time to produce the allowed-token set as a boolean
mask over the vocabulary at each step of the same accepted token walk, plus the step to the next
state (ctrlg: the minimised DFA's masks precomputed per state by :class:`ctrlg.dfa.masks.TokenMasks`,
its build time recorded as ``ctrlg_mask_table_s``; ``ctrlg_mask_cold_us`` builds each mask afresh
from the letter-level exceptions; outlines-core: ``Index.get_allowed_tokens`` scattered into a mask;
llguidance: ``fill_next_token_bitmask`` + ``consume_token``).

Ratios are taken from interleaved runs (ctrlg and outlines-core in turn, all-encodings and
canonical in turn, best of ``--repeats`` each), so that both sides see the same machine load.
Canonical mode is timed with the tokenizer-level tables built beforehand
(like the vocabularies: first-token verdicts, the tokens' edge-character categories and the
merge-rank junction signatures of :mod:`ctrlg.dfa.bpe_merges`) but an empty token-pair cache at every repeat, with a budget of
``--max-pair-checks`` pair checks. ``regex(encodings="canonical")`` returns the product automaton
for small patterns and a :class:`ctrlg.dfa.canonical_filter.CanonicalDFA` (all-encodings DFA +
decode-time filter) for patterns with loops over large token classes (``ctrlg_canonical_form``);
for the latter the canonical masks are computed at decode time, and ``ctrlg_canonical_mask_us``
is their mean cost per step of the walk (budget: walk length + 8 tokens) with an empty pair
cache and fresh masks, ``ctrlg_canonical_mask_warm_us`` the same walk again (pair verdicts
cached), and ``ctrlg_canonical_check_s`` the satisfiability check that precedes decoding.
Prints a table and writes benchmarks/results/bench_regex.json. A competitor that is not
installed is skipped and reported as such.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REGEXES = {
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,6}",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "url": r"https?://[a-zA-Z0-9.-]+(/[a-zA-Z0-9._~%-]*){0,4}",
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "time": r"([01]\d|2[0-3]):[0-5]\d(:[0-5]\d)?",
    "ssn": r"\d{3}-\d{2}-\d{4}",
    "json": (r'\{[ ]?"name"[ ]?:[ ]?"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt]){0,20}"[ ]?,'
             r'[ ]?"age"[ ]?:[ ]?(-)?(0|[1-9][0-9]*)[ ]?\}'),
    "sentence": r"[A-Z][^\n.!?]* in the park\.",
}
SAMPLES = {
    "email": "john.doe42@example.com", "phone": "(555) 123-4567",
    "url": "https://www.example.org/path/to/page", "date": "2024-02-29", "time": "23:59:07",
    "ssn": "123-45-6789", "json": '{"name": "Ada Lovelace", "age": 36}',
    "sentence": "The friendly dog was on a walk in the park.",
}


def _interleaved(fns, repeats):
    """Best time of each function, the functions run in turn within every repeat (so that a
    ratio of two of them sees the same machine load)."""
    times = [[] for _ in fns]
    outs = [None] * len(fns)
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            outs[k] = fn()
            times[k].append(time.perf_counter() - t)
    return [min(t) for t in times], outs


def _best(fn, repeats):
    times = []
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def _canonical_lower_bound(rows, all_dfas, ctx, notes):
    """For the patterns canonical mode refuses: whether their all-encodings DFA has a live state
    that loops on every ``[a-z]+`` token, and the Myhill–Nerode lower bound
    (:func:`ctrlg.dfa.bpe_merges.loop_transition_bound`) on the states and transitions of any
    canonical DFA containing such a loop."""
    from ctrlg.dfa.bpe_merges import loop_transition_bound

    refused = [r for r in rows if r.get("ctrlg_canonical_form") == "filter"]
    if not refused:
        return
    checker = ctx.checker
    letters = np.array([t for t, b in enumerate(checker.tokens) if b.isalpha()
                        and b.islower() and b.isascii() and checker._is_whole(t)])
    t0 = time.perf_counter()
    states, transitions = loop_transition_bound(checker.merge_tables(), letters)  # built in setup
    seconds = time.perf_counter() - t0
    loops = []
    for r in refused:
        d_all = all_dfas[r["regex"]]
        r["loops_over_lowercase_tokens"] = any(
            bool(np.all(d_all.step_many(q, letters) == q))
            for q in np.flatnonzero(d_all.live_states()))
        if r["loops_over_lowercase_tokens"]:
            r["canonical_lower_bound_states"] = states
            r["canonical_lower_bound_transitions"] = transitions
            loops.append(r["regex"])
    notes.append(f"canonical = all-encodings DFA + decode-time filter on "
                 f"{', '.join(r['regex'] for r in refused)}; "
                 f"{', '.join(loops) or 'none'} loop(s) over all {len(letters)} [a-z]+ tokens, "
                 f"and any canonical DFA of such a loop needs >= {states} states and >= "
                 f"{transitions} transitions (Myhill-Nerode classes from the merge ranks, "
                 f"computed in {seconds:.1f} s)")


def _setup(tok):
    """Per-tokenizer objects of every library, built once outside the timings:
    ``(ctx, setup seconds, notes)``."""
    from ctrlg import dfa
    from ctrlg.dfa.canonical import pair_checker
    from ctrlg.dfa.vocab_trie import vocab_trie, vocabulary_index

    ctx = SimpleNamespace(tok=tok, V=len(tok), eos=tok.eos_token_id, Index=None, llguidance=None)
    t0 = time.perf_counter()
    index = vocabulary_index(tok)
    trie = vocab_trie(tok)
    trie.levels, trie.node_of_token   # noqa: B018 - the per-tokenizer trie levels
    setup = {"ctrlg_vocab_index_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    ctx.checker = checker = pair_checker(tok)
    checker.starts_nonspace(np.zeros(1, dtype=np.int64))
    checker.singles_array(np.arange(ctx.V))   # first-token verdicts: per tokenizer, like the trie
    checker.forced_boundary(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))  # edge chars
    checker.merge_tables()              # merge-rank junction signatures: per tokenizer
    checker.ascii_runs()
    setup["ctrlg_canonical_tables_s"] = time.perf_counter() - t0
    dfa.regex("[0-9]", tok, encodings="canonical")   # warm-up of the tokenizers backend
    notes = []
    try:
        from outlines_core import Index, Vocabulary
        t0 = time.perf_counter()
        mapping: dict[bytes, list[int]] = {}
        for i, b in enumerate(index.tokens):
            if b and i != ctx.eos:
                mapping.setdefault(b, []).append(i)
        ctx.oc_vocab = Vocabulary(ctx.eos, mapping)
        ctx.Index = Index
        setup["outlines_core_vocabulary_s"] = time.perf_counter() - t0
    except ImportError:
        notes.append("outlines-core not installed: skipped")
    try:
        import llguidance
        import llguidance.hf
        import llguidance.numpy as llnp
        t0 = time.perf_counter()
        ctx.ll_tok = llguidance.hf.from_tokenizer(tok)
        ctx.llguidance, ctx.llnp = llguidance, llnp
        setup["llguidance_tokenizer_s"] = time.perf_counter() - t0
    except Exception as exc:  # not installed or incompatible
        notes.append(f"llguidance unavailable: {exc.__class__.__name__}: {exc}")
    return ctx, setup, notes


def _compile_times(row, ctx, pattern, repeats):
    """ctrlg all-encodings vs outlines-core compile times (interleaved), plus ctrlg's variants:
    ``(raw DFA, minimised DFA, outlines-core index or None)``."""
    from ctrlg import dfa

    tok = ctx.tok
    compile_all = lambda: dfa.regex(pattern, tok, minimize=False)  # noqa: E731
    oc = None
    if ctx.Index is not None:
        try:
            (row["ctrlg_all_s"], row["outlines_core_s"]), (d_all, oc) = _interleaved(
                [compile_all, lambda: ctx.Index(pattern, ctx.oc_vocab)], repeats)
            row["compile_ratio_ctrlg_over_outlines"] = row["ctrlg_all_s"] / row["outlines_core_s"]
        except Exception as exc:
            row["outlines_core_error"] = f"{exc.__class__.__name__}: {exc}"
    if "ctrlg_all_s" not in row:
        row["ctrlg_all_s"], d_all = _best(compile_all, repeats)
    row["ctrlg_all_with_token_view_s"], _ = _best(
        lambda: dfa.regex(pattern, tok, minimize=False).exc_tokens, repeats)
    row["ctrlg_letters"] = d_all.num_letters
    row["ctrlg_all_minimized_s"], d_min = _best(lambda: dfa.regex(pattern, tok), repeats)
    row["ctrlg_minimized_exceptions"] = d_min.num_exceptions
    row["ctrlg_exceptions"] = d_all.num_exceptions
    row["ctrlg_states"] = d_all.num_states
    return d_all, d_min, oc


def _canonical_times(row, ctx, pattern, walk, repeats, max_pair_checks):
    """Canonical vs all-encodings compile time, interleaved (or the refusal's message); for a
    CanonicalDFA also its decode-time masks along the walk."""
    from ctrlg import dfa
    from ctrlg.dfa.canonical_filter import CanonicalDFA
    from ctrlg.errors import ConstraintError

    def canonical():
        ctx.checker.pair_cache.clear()     # every repeat checks its token pairs afresh
        return dfa.regex(pattern, ctx.tok, encodings="canonical", max_pair_checks=max_pair_checks)
    try:
        canonical()
        (row["ctrlg_all_paired_s"], row["ctrlg_canonical_s"]), (_, d_can) = _interleaved(
            [lambda: dfa.regex(pattern, ctx.tok, minimize=False), canonical], repeats)
        assert d_can.accepts(walk), row["regex"]
        row["canonical_over_all"] = row["ctrlg_canonical_s"] / row["ctrlg_all_paired_s"]
        row["ctrlg_canonical_states"] = d_can.num_states
        row["ctrlg_canonical_form"] = "filter" if isinstance(d_can, CanonicalDFA) else "product"
        if isinstance(d_can, CanonicalDFA):
            _canonical_masks(row, ctx, d_can, walk)
    except ConstraintError as exc:
        row["ctrlg_canonical_s"] = None
        row["ctrlg_canonical_error"] = str(exc)


def _canonical_masks(row, ctx, d_can, walk):
    """Decode-time masks of a CanonicalDFA along the walk: fresh (empty pair cache), then the
    same walk again."""
    from ctrlg.guide.canonical_masks import CanonicalFeasibility
    from ctrlg.guide.feasibility import Feasibility

    n = len(walk) + 8
    ctx.checker.pair_cache.clear()
    t0 = time.perf_counter()
    masks = CanonicalFeasibility(Feasibility(d_can.dfa, n, eos_token_id=ctx.eos), d_can)
    masks.check_satisfiable()
    row["ctrlg_canonical_check_s"] = time.perf_counter() - t0

    def mask_walk():
        for k, t in enumerate(walk):
            prefix = walk[:k]
            mask = masks.token_mask(*masks.row_state(d_can.dfa.run(prefix), prefix), n - k)
            assert mask[t], (row["regex"], k)
    for key in ("ctrlg_canonical_mask_us", "ctrlg_canonical_mask_warm_us"):
        t0 = time.perf_counter()
        mask_walk()
        row[key] = (time.perf_counter() - t0) / len(walk) * 1e6


def _ctrlg_masks(row, d_min, walk, repeats):
    """The minimised DFA's allowed-token masks, precomputed per state (ctrlg.dfa.masks): a step
    costs a row view plus the DFA step; "cold" builds each mask afresh instead."""
    from ctrlg.dfa.masks import TokenMasks

    t0 = time.perf_counter()
    masks = TokenMasks(d_min)
    row["ctrlg_mask_table_s"] = time.perf_counter() - t0

    def mask_walk(mask_of):
        s = d_min.initial
        for t in walk:
            assert mask_of(s)[t]
            s = d_min.step(s, t)
    row["ctrlg_mask_cold_us"] = _best(lambda: mask_walk(masks.build), repeats)[0] / len(walk) * 1e6
    row["ctrlg_mask_us"] = _best(lambda: mask_walk(masks), repeats)[0] / len(walk) * 1e6


def _outlines_masks(row, ctx, oc, walk, repeats):
    """outlines-core: ``get_allowed_tokens`` scattered into a mask at each step of the walk."""
    try:
        def oc_masks():
            s = oc.get_initial_state()
            for t in walk:
                mask = np.zeros(ctx.V, dtype=bool)
                mask[oc.get_allowed_tokens(s)] = True
                assert mask[t], (f"outlines-core disallows token {t} "
                                 f"({ctx.tok.convert_ids_to_tokens(t)!r}) of the sample")
                if t != ctx.eos:
                    s = oc.get_next_state(s, t)
        row["outlines_core_mask_us"] = _best(oc_masks, repeats)[0] / len(walk) * 1e6
        row["compile_ratio_outlines_over_ctrlg"] = row["outlines_core_s"] / row["ctrlg_all_s"]
        row["compile_ratio_ctrlg_with_token_view_over_outlines"] = (
            row["ctrlg_all_with_token_view_s"] / row["outlines_core_s"])
    except Exception as exc:
        row["outlines_core_error"] = f"{exc.__class__.__name__}: {exc}"


def _llguidance_row(row, ctx, pattern, walk, repeats):
    """llguidance: matcher construction time, and ``fill_next_token_bitmask`` +
    ``consume_token`` per step (the construction subtracted)."""
    llguidance, llnp, ll_tok = ctx.llguidance, ctx.llnp, ctx.ll_tok
    try:
        grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
        row["llguidance_s"], _ = _best(lambda: llguidance.LLMatcher(ll_tok, grammar), repeats)
        bitmask = llnp.allocate_token_bitmask(1, ll_tok.vocab_size)

        def ll_masks():
            m = llguidance.LLMatcher(ll_tok, grammar)
            for t in walk:
                llnp.fill_next_token_bitmask(m, bitmask, 0)
                m.consume_token(t)
        t_total, _ = _best(ll_masks, repeats)
        t_init, _ = _best(lambda: llguidance.LLMatcher(ll_tok, grammar), repeats)
        row["llguidance_mask_us"] = max(t_total - t_init, 0.0) / len(walk) * 1e6
        row["compile_ratio_llguidance_over_ctrlg"] = row["llguidance_s"] / row["ctrlg_all_s"]
    except Exception as exc:
        row["llguidance_error"] = f"{exc.__class__.__name__}: {exc}"


def _print_table(rows, V, setup, notes):
    header = (f"{'regex':8} {'ctrlg all':>10} {'canonical':>10} {'can/all':>8} {'form':>7} "
              f"{'outlines':>10} {'llguid.':>10} {'ctrlg/oc':>9} {'mask ctrlg':>11} {'cold':>6} "
              f"{'can.mask':>9} {'mask oc':>9} {'mask llg':>9}")
    print(f"vocabulary: SmolLM2, V={V}; setup {json.dumps({k: round(v, 3) for k, v in setup.items()})}")
    print(header)
    fmt = lambda v, unit="s": "-" if v is None else (f"{v * 1e3:.1f}ms" if unit == "s" else f"{v:.0f}us")  # noqa: E731
    for r in rows:
        oc = r.get("outlines_core_s")
        ratio = r["ctrlg_all_s"] / oc if oc else float("nan")
        print(f"{r['regex']:8} {fmt(r['ctrlg_all_s']):>10} {fmt(r['ctrlg_canonical_s']):>10} "
              f"{r.get('canonical_over_all', float('nan')):>7.2f}x "
              f"{r.get('ctrlg_canonical_form', '-'):>7} "
              f"{fmt(oc):>10} {fmt(r.get('llguidance_s')):>10} "
              f"{ratio:>8.2f}x "
              f"{fmt(r['ctrlg_mask_us'], 'us'):>11} {fmt(r['ctrlg_mask_cold_us'], 'us'):>6} "
              f"{fmt(r.get('ctrlg_canonical_mask_us'), 'us'):>9} "
              f"{fmt(r.get('outlines_core_mask_us'), 'us'):>9} "
              f"{fmt(r.get('llguidance_mask_us'), 'us'):>9}")
    for n in notes:
        print("note:", n)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-pair-checks", type=int, default=300_000,
                        help="budget of the canonical construction (beyond it: reported, skipped)")
    parser.add_argument("--out", default="benchmarks/results/bench_regex.json")
    args = parser.parse_args(argv)

    from ctrlg.lm.models import load_tokenizer

    ctx, setup, notes = _setup(load_tokenizer())
    rows, all_dfas = [], {}
    for name, pattern in REGEXES.items():
        row = {"regex": name, "pattern": pattern}
        d_all, d_min, oc = _compile_times(row, ctx, pattern, args.repeats)
        all_dfas[name] = d_all
        walk = ctx.tok.encode(SAMPLES[name], add_special_tokens=False) + [ctx.eos]
        assert d_all.accepts(walk), name
        _canonical_times(row, ctx, pattern, walk, args.repeats, args.max_pair_checks)
        _ctrlg_masks(row, d_min, walk, args.repeats)
        if oc is not None:
            _outlines_masks(row, ctx, oc, walk, args.repeats)
        if ctx.llguidance is not None:
            _llguidance_row(row, ctx, pattern, walk, args.repeats)
        rows.append(row)
    _canonical_lower_bound(rows, all_dfas, ctx, notes)
    _print_table(rows, ctx.V, setup, notes)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "vocab_size": ctx.V, "setup": setup,
                               "notes": notes, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
