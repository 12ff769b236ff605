"""Benchmark: grammar constraints — compile time and per-token mask time, ctrlg vs llguidance.

The example grammars (:mod:`ctrlg.dfa.cfg.examples`: arithmetic, SQL subset, recursive lists, JSON)
over SmolLM2's vocabulary (V = 49,152). Both libraries walk the *same* token sequences: each
sample sentence tokenised by the tokenizer, then EOS. Per step:

* ctrlg: the exact mask under the remaining budget (``GrammarMask.allowed`` — or the regular
  superset's own feasibility when that is exact, as the processor does) plus the cursor's
  advance (the recogniser over the token's bytes) and A's step;
* llguidance: ``fill_next_token_bitmask`` + ``consume_token`` (no budget: prefix viability).

``dfa.lazy_grammar`` (columns ``lazy_*``): compile time, and the mask + step time per token along
the same walks, one fresh constraint per walk (first visits to a state included), prefix viability
without a budget as llguidance, and the mean of compile + the walk's masks (``*_walk_total_ms``).
The SQL subset is regular as written (``lazy_kind: exact``); the self-embedding grammars get
``max_nesting`` = the least number of levels their sample sentences need (``lazy_kind: nesting ≤
n``: a subset of the language), with the nesting-bounded automaton built on demand (``lazy_*``,
the default) and as a minimal DFA compiled first (``lazy_minimal_*``). Columns ``earley_*``: the
same grammars' default ``dfa.lazy_grammar`` constraint, the Earley-driven one of the whole
language (superset R_1, the token index's runs on first use): compile, the processor's
feasibility table and the exact masks with the loose budget along each walk, one fresh
constraint per walk, and the mean of compile + table + the walk's masks
(``earley_walk_total_ms``). ``earley_*``: with the grammars read from Lark text, the terminal
DFAs' memo and the vocabulary's shared terminal runs emptied before each walk (a grammar and
terminals the process has not seen: every run's first use inside the walk); ``earley_warm_*``:
with all three kept (a process that has served the grammar before).
The vocabulary trie and numba's compiled walk are built once before any timing (as llguidance's
tokenizer is).

Budgets: ``loose`` (n = 4 × the walk's length: the masks are the grammar's prefix masks) and
``tight`` (n = the walk's length: the last steps must decide which tokens still fit, the case
only ctrlg handles). Reported per grammar: compile time (ctrlg: ``dfa.grammar`` + the tables'
feasibility; llguidance: ``LLMatcher`` construction, its tokenizer built once beforehand), mask
time p50 / p99 over every step of every walk, and the share of steps where the two masks (on
non-EOS tokens, loose budget) agree exactly — they can differ where llguidance lexes greedily.
Beside each of ctrlg's p99, ``*_p99_without_full_gc_ms`` takes the process's full (generation-2)
garbage collections out of the steps they fell in (timed by ``gc.callbacks``; with torch and
transformers loaded one takes ≈ 180 ms and falls wherever the count of new objects runs over),
and ``*_steps_with_full_gc`` counts those steps: what the masks' own code costs at the p99.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_grammar
    python -m benchmarks.bench_grammar --grammars json --repeats 1

Writes ``benchmarks/results/bench_grammar.json``. llguidance is optional (``pip install
ctrlg[bench]``): without it only ctrlg's columns are filled.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import numpy as np

from ctrlg import dfa
from ctrlg.dfa.cfg.examples import EXAMPLES, SAMPLES
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.guide.feasibility import Feasibility
from ctrlg.guide.masks import token_mask
from ctrlg.lm.models import load_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
UNDECIDED: list = []          # the mask providers of a grammar's runs: their abandoned searches


class FullCollections:
    """Seconds the process spent in full (generation-2) garbage collections, kept up to date
    by ``gc.callbacks``: a timed step reads :attr:`total` before and after (:class:`Step`)."""

    def __init__(self):
        self.total = 0.0
        self._start = None

    def __call__(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.total += time.perf_counter() - self._start
            self._start = None


FULL_GC = FullCollections()
gc.callbacks.append(FULL_GC)


class Step(float):
    """A step's wall seconds (the float) and ``gc``: the seconds of full collections in it."""

    gc: float = 0.0


def timed_step(t0: float, gc0: float) -> Step:
    """The :class:`Step` begun at ``t0`` with ``FULL_GC.total`` at ``gc0``."""
    step = Step(time.perf_counter() - t0)
    step.gc = FULL_GC.total - gc0
    return step


def mask_percentiles(key: str, times: list) -> dict:
    """``<key>p50_ms`` / ``<key>p99_ms`` over the steps, ``<key>p99_without_full_gc_ms`` with
    the full collections' seconds taken out of each step, ``<key>steps_with_full_gc`` and
    ``<key>full_gc_ms`` (their milliseconds in all)."""
    net = [t - getattr(t, "gc", 0.0) for t in times]
    return {f"{key}p50_ms": 1e3 * float(np.median(times)),
            f"{key}p99_ms": 1e3 * float(np.percentile(times, 99)),
            f"{key}p99_without_full_gc_ms": 1e3 * float(np.percentile(net, 99)),
            f"{key}steps_with_full_gc": int(sum(getattr(t, "gc", 0.0) > 0 for t in times)),
            f"{key}full_gc_ms": 1e3 * float(sum(getattr(t, "gc", 0.0) for t in times))}


def walks_of(tok, name: str) -> list[list[int]]:
    return [tok.encode(s, add_special_tokens=False) + [tok.eos_token_id] for s in SAMPLES[name]]


def ctrlg_masks(constraint, walk: list[int], n: int, eos: int, table=None
                ) -> tuple[list[float], list]:
    """Seconds per step (mask + advance) and the masks, along ``walk`` with budget ``n``
    (``table``: the feasibility table, when already built)."""
    table = table if table is not None else Feasibility(constraint.dfa, n, eos_token_id=eos)
    mask = token_mask(constraint, table)
    UNDECIDED.append(mask)
    cursor, q, times, masks = mask.start(), constraint.dfa.initial, [], []
    for k, t in enumerate(walk):
        t0, gc0 = time.perf_counter(), FULL_GC.total
        allowed = mask.allowed(cursor, q, n - k) if mask.refines else \
            table.token_feasible(np.array([q]), np.array([n - k])).numpy()[0]
        cursor, q = mask.advance(cursor, t), constraint.dfa.step(q, t)
        times.append(timed_step(t0, gc0))
        masks.append(allowed)
        if not allowed[t]:
            raise AssertionError(f"ctrlg's mask refuses token {t} of a valid walk at step {k}")
    return times, masks


def least_nesting(text: str, tok, walks: list[list[int]], most: int = 8) -> int | None:
    """The fewest ``max_nesting`` levels whose lazy automaton accepts every walk (None: none
    up to ``most``)."""
    for levels in range(most + 1):
        lazy = dfa.lazy_grammar(text, tok, max_nesting=levels, warn=False)
        if all(lazy.accepts(walk) for walk in walks):
            return levels
    return None


def lazy_masks(text: str, tok, walk: list[int], levels: int | None,
               nesting_automaton: str = "on_demand") -> tuple[float, list[float]]:
    """(compile seconds, seconds per step of mask + step) of a fresh ``dfa.lazy_grammar``."""
    t0 = time.perf_counter()
    lazy = dfa.lazy_grammar(text, tok, max_nesting=levels, warn=False,
                            nesting_automaton=nesting_automaton)
    compile_s = time.perf_counter() - t0
    q, times = lazy.initial, []
    for t in walk:
        t0, gc0 = time.perf_counter(), FULL_GC.total
        allowed = lazy.mask(q)
        q = lazy.step(q, t)
        times.append(timed_step(t0, gc0))
        if not allowed[t]:
            raise AssertionError(f"the lazy mask refuses token {t} of a valid walk")
    return compile_s, times


def earley_masks(text: str, tok, walk: list[int], eos: int, cold: bool
                 ) -> tuple[float, float, list[float]]:
    """(compile seconds, table seconds, seconds per step) of a fresh default
    ``dfa.lazy_grammar`` of a self-embedding grammar (the Earley-driven constraint), loose
    budget; ``cold``: the per-process grammar caches emptied first (``clear_shared_caches``)."""
    from ctrlg.dfa.cfg.constraint import clear_shared_caches

    if cold:
        clear_shared_caches()
    t0 = time.perf_counter()
    constraint = dfa.lazy_grammar(text, tok)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = 4 * len(walk)
    table = Feasibility(constraint.dfa, n, eos_token_id=eos)
    token_mask(constraint, table)
    table_s = time.perf_counter() - t0
    times, _ = ctrlg_masks(constraint, walk, n, eos, table=table)
    return compile_s, table_s, times


def llguidance_masks(ll, ll_tok, grammar, walk: list[int]) -> tuple[list[float], list]:
    import llguidance.numpy as llnp

    m = ll.LLMatcher(ll_tok, grammar)
    bitmask = llnp.allocate_token_bitmask(1, ll_tok.vocab_size)
    times, masks = [], []
    for t in walk:
        t0 = time.perf_counter()
        llnp.fill_next_token_bitmask(m, bitmask, 0)
        m.consume_token(t)
        times.append(time.perf_counter() - t0)
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:ll_tok.vocab_size]
        masks.append(bits.astype(bool))
    if m.is_error():
        raise RuntimeError(m.get_error())
    return times, masks


def bench_grammar(name: str, tok, ll, ll_tok, repeats: int) -> dict:
    eos = tok.eos_token_id
    row: dict = {"grammar": name}
    t0 = time.perf_counter()
    constraint = dfa.grammar(EXAMPLES[name], tok)
    row["ctrlg_compile_s"] = time.perf_counter() - t0
    row.update(depth=constraint.depth, exact_superset=constraint.exact,
               superset_states=constraint.num_states)
    UNDECIDED.clear()
    walks = walks_of(tok, name)
    exact = constraint.exact               # regular as written: lazy_grammar's exact path
    levels = None if exact else least_nesting(EXAMPLES[name], tok, walks)
    row["lazy_kind"] = "exact" if exact else f"nesting ≤ {levels}"
    kinds = {"lazy": "on_demand"} if exact else {"lazy": "on_demand", "lazy_minimal": "minimal"}
    if exact or levels is not None:
        for prefix, kind in kinds.items():
            compiles, times = [], []
            for _ in range(repeats):
                for walk in walks:
                    c, t = lazy_masks(EXAMPLES[name], tok, walk, levels, kind)
                    compiles.append(c)
                    times += t
            row[f"{prefix}_compile_p50_s"] = float(np.median(compiles))
            row.update(mask_percentiles(f"{prefix}_mask_", times))
            row[f"{prefix}_walk_total_ms"] = 1e3 * (float(np.median(compiles))
                                                    + sum(times) / (repeats * len(walks)))
    if not exact:
        for prefix, cold in (("earley", True), ("earley_warm", False)):
            compiles, tables, times = [], [], []
            for _ in range(repeats):
                for walk in walks:
                    c, b, t = earley_masks(EXAMPLES[name], tok, walk, eos, cold=cold)
                    compiles.append(c)
                    tables.append(b)
                    times += t
            row[f"{prefix}_compile_p50_s"] = float(np.median(compiles))
            row[f"{prefix}_table_p50_s"] = float(np.median(tables))
            row.update(mask_percentiles(f"{prefix}_mask_", times))
            row[f"{prefix}_walk_total_ms"] = 1e3 * (float(np.median(compiles))
                                                    + float(np.median(tables))
                                                    + sum(times) / (repeats * len(walks)))
    for budget in ("loose", "tight"):
        times, agree, steps = [], 0, 0
        for _ in range(repeats):
            for walk in walks:
                n = 4 * len(walk) if budget == "loose" else len(walk)
                t, masks = ctrlg_masks(constraint, walk, n, eos)
                times += t
        row[f"ctrlg_undecided_{budget}"] = sum(getattr(m, "masks", m).__dict__.get("undecided", 0)
                                                for m in UNDECIDED)
        UNDECIDED.clear()
        row.update(mask_percentiles(f"ctrlg_mask_{budget}_", times))
    if ll is not None:
        try:
            grammar = ll.LLMatcher.grammar_from_lark(EXAMPLES[name])
            t0 = time.perf_counter()
            ll.LLMatcher(ll_tok, grammar)
            row["llguidance_compile_s"] = time.perf_counter() - t0
            times = []
            for _ in range(repeats):
                for walk in walks:
                    t, theirs = llguidance_masks(ll, ll_tok, grammar, walk)
                    times += t
                    _, ours = ctrlg_masks(constraint, walk, 4 * len(walk), eos)
                    for a, b in zip(ours, theirs):
                        V = min(len(a), len(b))
                        keep = np.ones(V, dtype=bool)
                        keep[eos] = False
                        agree += bool(np.array_equal(a[:V][keep], b[:V][keep]))
                        steps += 1
            row["llguidance_mask_p50_ms"] = 1e3 * float(np.median(times))
            row["llguidance_mask_p99_ms"] = 1e3 * float(np.percentile(times, 99))
            row["masks_agree_share"] = agree / max(steps, 1)
        except Exception as exc:  # noqa: BLE001 — recorded, the ctrlg columns still count
            row["llguidance_error"] = f"{exc.__class__.__name__}: {exc}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grammars", nargs="+", default=list(EXAMPLES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_grammar.json")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() once everything is loaded: the loaded objects "
                             "(transformers, the tokenizer) leave later full collections, which "
                             "then come more often (docs/grammar.md)")
    args = parser.parse_args()
    tok = load_tokenizer()
    vocab_trie(tok)                                    # built once, before any timing
    warm = dfa.lazy_regex("ab", tok)
    warm.mask(warm.initial)                            # numba's trie walk compiled / loaded
    ll = ll_tok = None
    notes = []
    try:
        import llguidance
        import llguidance.hf

        ll, ll_tok = llguidance, llguidance.hf.from_tokenizer(tok)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"llguidance unavailable: {exc.__class__.__name__}: {exc}")
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
        notes.append("gc.freeze() after loading")
    rows = [bench_grammar(name, tok, ll, ll_tok, args.repeats) for name in args.grammars]
    for r in rows:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"vocab_size": len(tok), "rows": rows, "notes": notes},
                                   indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
