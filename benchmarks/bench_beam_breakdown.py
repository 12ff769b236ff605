"""Where a guided beam search's time goes: the adapted CommonGen pipeline at 8 / 32 / 128 beams,
broken down by manual timers, beside the LM-only floor, measured in one process.

    python -m benchmarks.bench_beam_breakdown                       # float32, 8/32/128 beams
    python -m benchmarks.bench_beam_breakdown --dtype auto --beams 8 32 --repeats 3
    python -m benchmarks.bench_beam_breakdown --variants before dense after   # all three codes
    python -m benchmarks.bench_beam_breakdown --variants after kept   # keep_top against all scores
    python -m benchmarks.bench_beam_breakdown --variants kept_dense_pick kept   # the search's pick
    python -m benchmarks.bench_beam_breakdown --tables-only --items 40 --repeats 3   # the tables alone
    python -m benchmarks.bench_beam_breakdown --beams 128 --lift 4        # the cost at h = 2,048

Setting: ``pipeline=adapted`` with its defaults (the embedded SmolLM2-135M-Instruct + the
``commongen-human-balanced`` LoRA adapter, the h = 512 HMM ``commongen_human_h512`` stored as
``topk8-4096``, prompt = BOS, ``dfa.commongen_constraint`` with inflections, length_penalty 0.2,
no_repeat_ngram_size 4, 5–32 new tokens, beams ranked by the lookahead score, every beam
reranked by its LM log-likelihood summed during the search; no widening and no judge: the
pipeline's judge costs ≈ 0.15 of a decode, docs/notes/commongen_selection.md), method ``ctrlg``,
guidance products in float32 (``--precision auto``: bfloat16 where the CPU has it), one torch
thread. CommonGen dev items from
``--offset``; at each width ``--items`` of them are decoded together as the main job does (one
``generate`` call, K = B rows per item; ``--items-128`` at 128 beams).

Timers (wall clock, ``time.perf_counter``; nested parts are subtracted from their parents so the
rows add up to the batch's total):

* ``lm_forward``   — the model's forward (prefill + one call per step), forward pre/post hooks;
* ``cache_reorder`` — ``Cache.reorder_cache`` (transformers gathers every layer's K/V by the
  surviving beams' parents after each step);
* ``guide_tables`` — building the guide's tables (``ConstraintLogitsProcessor._build_tables``);
* ``guide_rows``   — per-step row bookkeeping (``RowStates.update``: parents, DFA step, prior
  advance = one [B, h]·[h, h] product);
* ``guide_products`` — per-step guidance (``guided_log_probs``, or ``lookahead_scores`` when
  beams are ranked by the lookahead: the emission products and the [B, V] combination; in the
  ``kept`` variant ``top_lookahead_scores``, the scores of the entries the search can keep);
* ``guide_other``  — the rest of the processor's ``__call__``;
* ``recorder``     — :class:`ctrlg.lm.beam_likelihood.BeamLogLikelihoods` (the rerank's sums);
* ``hf_processors`` — transformers' own processors (no-repeat-n-gram, min-new-tokens);
* ``beam_search``  — everything else inside ``model.generate`` (top-k over B·V, gathers,
  stopping criteria, input preparation);
* ``rerank``       — after ``generate``: reading the recorded log-likelihoods, the pick, decoding
  texts;
* ``total``        — the whole batch (``ctrlg.tasks.commongen.pipeline.decode_batch``).

One untimed decode of one item per variant at the first width comes first (``--warmup 0``: none),
so one-time costs (numba's compiled loops loaded from their cache, oneDNN's first calls) are
not charged to the first width's items.

``total/LM forward`` divides by the LM's own time inside the same decode instead (prefill
included; it moves with the machine's load as the rest of the decode does, where the floor's
separate samples may not). The LM-only floor: the median of single-token forwards of the same
model at the same number of rows with a KV cache of 16 tokens (``--floor-repeats`` before each
repeat of the variants), times the number of LM calls the search made. Writes
``benchmarks/results/bench_beam_breakdown[_<dtype>].json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import weakref
from collections import defaultdict
from pathlib import Path

import torch
from ctrlg.lm.shared_context import cache_keyword, returned_cache

PARTS = ["lm_forward", "cache_reorder", "guide_tables", "guide_rows", "guide_products",
         "guide_other", "recorder", "hf_processors", "beam_search", "rerank"]


class Timers:
    """Accumulated seconds per part; ``exclusive`` parts are subtracted from the enclosing one."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list] = []

    @contextlib.contextmanager
    def part(self, name: str):
        frame = [name, 0.0]            # [name, seconds of nested parts]
        self._stack.append(frame)
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self._stack.pop()
            self.seconds[name] += spent - frame[1]
            self.calls[name] += 1
            if self._stack:
                self._stack[-1][1] += spent

    def wrap(self, owner, attr: str, name: str):
        """Time ``owner.attr`` (a function or method) as ``name``; returns an undo callable."""
        original = getattr(owner, attr)
        timers = self

        def timed(*args, **kwargs):
            with timers.part(name):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)
        return lambda: setattr(owner, attr, original)



def _commongen():
    """The CommonGen pipeline's pieces this benchmark drives (ctrlg.tasks.commongen)."""
    from types import SimpleNamespace

    from ctrlg.tasks.commongen import decoding, items, methods, pipeline

    return SimpleNamespace(pipeline=pipeline, method_spec=methods.method_spec, eos_ids=decoding.eos_ids,
                           prepare_batch=pipeline.prepare_batch,
                           decode_batch=lambda *a, **k: pipeline.decode_batch(*a, **k),
                           select_items=items.select_items)

def instrument(timers: Timers, model):
    """Install the timers (module docstring); returns an undo callable."""
    import transformers.cache_utils as cache_utils
    from transformers.generation.logits_process import LogitsProcessorList

    import ctrlg.sampler as sampler
    from ctrlg.lm.beam_likelihood import BeamLogLikelihoods
    from ctrlg.guide.row_state import RowStates
    cg = _commongen()

    undo = [timers.wrap(sampler.ConstraintLogitsProcessor, "_build_tables", "guide_tables"),
            timers.wrap(RowStates, "update", "guide_rows"),
            timers.wrap(sampler, "guided_log_probs", "guide_products"),
            timers.wrap(sampler, "lookahead_scores", "guide_products"),
            timers.wrap(sampler, "top_lookahead_scores", "guide_products"),
            timers.wrap(sampler.ConstraintLogitsProcessor, "__call__", "guide_other"),
            timers.wrap(BeamLogLikelihoods, "__call__", "recorder"),
            timers.wrap(LogitsProcessorList, "__call__", "hf_processors"),
            timers.wrap(cg.pipeline, "decode_batch", "rerank")]
    for cls in {cache_utils.Cache, *cache_utils.Cache.__subclasses__()}:
        if "reorder_cache" in cls.__dict__:
            undo.append(timers.wrap(cls, "reorder_cache", "cache_reorder"))
    undo.append(timers.wrap(model, "generate", "beam_search"))
    frames = []

    def pre(module, args, kwargs):
        cm = timers.part("lm_forward")
        cm.__enter__()
        frames.append(cm)

    def post(module, args, kwargs, output):
        frames.pop().__exit__(None, None, None)

    handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
               model.register_forward_hook(post, with_kwargs=True)]
    undo += [h.remove for h in handles]
    return lambda: [u() for u in reversed(undo)]


def lm_floor_samples(model, rows: int, repeats: int, context: int = 16) -> list[float]:
    """Seconds of ``repeats`` single-token forwards at ``rows`` rows, each after a
    ``context``-token prefill (a DynamicCache): the LM step with nothing else."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids = torch.randint(100, 1000, (rows, context), device=device)
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            cache = DynamicCache()
            model(input_ids=ids, **{cache_keyword(model): cache}, use_cache=True)
            step = torch.randint(100, 1000, (rows, 1), device=device)
            start = time.perf_counter()
            model(input_ids=step, **{cache_keyword(model): cache}, use_cache=True)
            times.append(time.perf_counter() - start)
    return times


def lifted_hmm(hmm, factor: int):
    """``hmm`` with each hidden state split into ``factor`` copies: π'(i, a) = π(i) / k,
    A'[(i, a), (j, b)] = A[i, j] / k, B'[(i, a)] = B[i]. Summing over the copies gives back
    the original chain, so every sequence (and every guidance value) has the same probability
    up to rounding, at h · k hidden states: the cost of a larger HMM on a real distribution.
    The emission keeps its rank-1 tail (rows are copies)."""
    if factor == 1:
        return hmm
    from ctrlg.hmm.model import HMM

    k = int(factor)
    initial = hmm.initial.double().repeat_interleave(k) / k
    transition = torch.kron(hmm.transition.double(), torch.full((k, k), 1.0 / k, dtype=torch.float64))
    emission = hmm.emission.repeat_interleave(k, 0)
    return HMM.from_params(initial, transition, emission, config=dict(hmm.config))


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        return hydra_compose(config_name="commongen", overrides=overrides)


def decode_once(cfg, model, tokenizer, hmm, items, beams: int) -> tuple[dict, list[str]]:
    """Decode ``items`` together at ``beams`` beams once: (seconds per part, the kept texts)."""
    from omegaconf import OmegaConf

    cg = _commongen()

    cfg = OmegaConf.merge(cfg, {"generation": {"num_beams": beams, "num_samples": beams}})
    specs = {"ctrlg": cg.method_spec(cfg, "ctrlg")}
    eos = cg.eos_ids(model, tokenizer)
    timers = Timers()
    ready = cg.prepare_batch(items, cfg, tokenizer, hmm.vocab_size, eos, lambda r: None)
    undo = instrument(timers, model)
    try:
        start = time.perf_counter()
        cg.decode_batch(ready, items[0][0], ["ctrlg"], specs, model, tokenizer, hmm, cfg)
        total = time.perf_counter() - start
    finally:
        undo()
    seconds = dict(timers.seconds)
    seconds["total"] = total
    seconds["lm_calls"] = timers.calls["lm_forward"]
    return seconds, [record["ctrlg"]["text"] for record, _, _ in ready]


def summarise(runs: list[dict], variant: str, beams: int, items: int, floor_step: float,
              outputs: list[str]) -> dict:
    """Per-part medians over ``runs`` and the floor."""
    med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in [*PARTS, "total", "lm_calls"]}
    return {"variant": variant, "beams": beams, "items": items, "rows": items * beams,
            "repeats": len(runs), "seconds": med, "per_item_s": med["total"] / items,
            "lm_floor_step_s": floor_step, "lm_floor_s": floor_step * med["lm_calls"],
            "outputs": outputs, "runs": runs}


@contextlib.contextmanager
def variant_code(variant: str):
    """The code of each variant (:func:`set_variant` has their settings):

    * ``before`` — the first round's code: the guide tables' backward step as it was
      (``backward_step_reference``: advanced-indexing gathers, the exceptions' emission rows
      gathered at every step), plus everything ``dense`` undoes;
    * ``dense`` — the guide's product x · B over all V columns (``PackedLinear``, no rank-1
      tail: ``ctrlg.guide.factored_emission``) and the lookahead's log p_hmm(α | x≤t) from a
      second product, as before the factored product;
    * ``after`` — the code as it is, every entry scored (``generation.score_kept_only=false``);
    * ``kept`` — the code as it is with the experiments' default ``score_kept_only=true``: the
      processor's ``keep_top`` (4 · ``beams``: transformers keeps max(2, 1 + #EOS) · beams, and
      the later steps read the exact number from the search's running scores, recorded around
      ``generate``): only the entries the search can keep are scored
      (:mod:`ctrlg.guide.beam_candidates`), and the search's top-2B taken among the entries the
      processor wrote (:func:`ctrlg.lm.beam_search.sparse_topk_values`);
    * ``kept_dense_pick`` — ``kept`` with the search's top-2B over all B · V entries of each
      input (:func:`ctrlg.lm.beam_search.two_stage_topk_values`), as before the processor
      published the entries it wrote."""
    import ctrlg.guide.emission_operands as operands
    import ctrlg.lm.beam_search as beam_search
    import ctrlg.guide.tables as tables
    import ctrlg.sampler as sampler
    from ctrlg.kernels.packed_linear import PackedLinear

    # The HMM's operands are cached per HMM (built once per process, as in a run): each variant
    # keeps its own cache, so alternating variants rebuild nothing.
    saved_cache = operands._CACHE
    operands._CACHE = _VARIANT_CACHES.setdefault(variant, weakref.WeakKeyDictionary())
    saved = (tables.compiled, operands.emission_product, sampler.lookahead_scores,
             beam_search.take_support)
    if variant == "before":
        tables.compiled = lambda: False
    if variant == "kept_dense_pick":
        beam_search.take_support = lambda steps, rows, width: None
    if variant not in ("after", "kept", "kept_dense_pick"):
        operands.emission_product = lambda low, emission_t: PackedLinear(low)
        sampler.lookahead_scores = _lookahead_scores_two_products
    try:
        yield
    finally:
        (tables.compiled, operands.emission_product, sampler.lookahead_scores,
         beam_search.take_support) = saved
        operands._CACHE = saved_cache


_VARIANT_CACHES: dict = {}


def _lookahead_scores_two_products(scores, tables, table_of_row, states, priors, remaining,
                                   strength=1.0, first=False):
    """``ctrlg.guide.guidance.lookahead_scores`` as it was: log p_hmm(α | x≤t) from a second
    [R, h]·[h, V] product per HMM (same values), and isfinite / where over [R, V]."""
    import math

    import numpy as np

    from ctrlg.guide.guidance import guidance_log_ratio

    table_of_row, states = np.asarray(table_of_row), np.asarray(states)
    ratio = guidance_log_ratio(tables, table_of_row, states, priors, remaining, scores.device)
    finite = torch.isfinite(ratio)
    prev = torch.zeros(len(states), device=scores.device)
    if not first:
        groups: dict = {}                       # the marginal p B again, one product per HMM
        for k in np.unique(table_of_row):
            groups.setdefault(tables[k]._emission_product, []).append(np.flatnonzero(table_of_row == k))
        for product, parts in groups.items():
            rows = torch.as_tensor(np.sort(np.concatenate(parts)), device=scores.device)
            marginal = product(priors[rows]).float().log_()
            prev[rows] = torch.logsumexp(marginal + ratio[rows], 1)
        prev = torch.where(torch.isfinite(prev), prev, 0.0)
    term = (ratio - prev[:, None]).mul_(strength) if strength else torch.zeros_like(ratio)
    return torch.where(finite, scores.float() + term, -math.inf)


def set_variant(cfg, variant: str):
    """Decoding settings of each variant: ``before`` (the first round's code: transformers'
    no-repeat / min-new-tokens processors and one top-k, plus :func:`variant_code`'s), ``dense``,
    ``after`` and ``kept`` (``generation.fast_search``, ``generation.score_kept_only``;
    :func:`variant_code` sets the rest: identical
    beams up to rounding)."""
    from omegaconf import OmegaConf

    if variant not in ("before", "dense", "after", "kept", "kept_dense_pick"):
        raise SystemExit(f"unknown variant {variant!r}: before | dense | after | kept | kept_dense_pick")
    return OmegaConf.merge(cfg, {"generation": {"fast_search": variant != "before",
                                                 "score_kept_only": variant.startswith("kept")}})


def tables_only(cfg, tokenizer, hmm, items, variants, repeats: int, batch: int) -> dict:
    """Median seconds per item of building the ``ctrlg`` processor's tables for ``items`` (the
    ``guide_tables`` part alone: the budget restriction, the feasibility and the HMM tables), in
    batches of ``batch`` items as the main job builds them, in the products' precision of
    ``generation.precision``; variants alternating, ``repeats`` times over all the items, after
    one untimed batch per variant."""
    from ctrlg.guide.tables import resolve_precision
    from ctrlg.sampler import ConstraintLogitsProcessor
    cg = _commongen()

    eos = [tokenizer.eos_token_id]
    ready = cg.prepare_batch(items, cfg, tokenizer, hmm.vocab_size, eos, lambda r: None)
    constraints = [c for _, c, _ in ready]
    precision = resolve_precision(cfg.generation.precision)
    build = lambda part: ConstraintLogitsProcessor(  # noqa: E731
        hmm, part, max_new_tokens=32, min_new_tokens=5, eos_token_id=eos, precision=precision)
    for variant in variants:
        with variant_code(variant):
            build(constraints[:batch])
    seconds = {v: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            with variant_code(variant):
                for start in range(0, len(constraints), batch):
                    part = constraints[start:start + batch]
                    begin = time.perf_counter()
                    build(part)
                    seconds[variant].append((time.perf_counter() - begin) / len(part))
    return {v: {"median_s_per_item": statistics.median(t), "mean_s_per_item": statistics.fmean(t),
                "batches": len(t), "precision": precision} for v, t in seconds.items()}


def format_rows(results: list[dict]) -> str:
    head = ["variant", "beams", "rows", "s/item", "LM floor s/item", "total/floor",
            "total/LM forward", *PARTS, "guide % of LM"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        s, n = r["seconds"], r["items"]
        guide = s["guide_rows"] + s["guide_products"] + s["guide_other"]
        cells = [r["variant"], r["beams"], r["rows"], f"{r['per_item_s']:.2f}",
                 f"{r['lm_floor_s'] / n:.2f}", f"{s['total'] / r['lm_floor_s']:.2f}",
                 f"{s['total'] / s['lm_forward']:.2f}", *(f"{s[p] / n:.3f}" for p in PARTS),
                 f"{100 * guide / s['lm_forward']:.1f}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    cg = _commongen()
    from ctrlg.tasks.config import load_hmm, load_lm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beams", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--items", type=int, default=4, help="items decoded together (< 128 beams)")
    parser.add_argument("--items-128", type=int, default=1, help="items at 128 beams")
    parser.add_argument("--offset", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repeats-128", type=int, default=1)
    parser.add_argument("--floor-repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", help="model.dtype: float32 | auto | bfloat16")
    parser.add_argument("--variants", nargs="+", default=["after", "kept"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="float32", help="generation.precision of the guidance "
                        "products: float32 | auto")
    parser.add_argument("--hmm", default=None, help="hmm.path: another HMM checkpoint folder "
                        "(e.g. one saved with output.emission_support_min_count)")
    parser.add_argument("--lift", type=int, default=1, help="split each hidden state into this many "
                        "(the same distribution at h × lift: the cost of a larger HMM, same outputs)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed decodes of one item at the "
                        "first width before any timing (1: on, 0: off)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--tables-only", action="store_true",
                        help="time only the guide tables of --items items (variants alternating)")
    parser.add_argument("--tables-batch", type=int, default=4,
                        help="with --tables-only: items whose tables are built together")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    cfg = compose([f"model.dtype={args.dtype}", f"device={args.device}",
                   f"generation.precision={args.precision}", "generation.widen_below_loglik=null",
                   "judge.weight=0",   # the search alone: the judge's pass is timed by the main job
                   *([f"hmm.path={args.hmm}"] if args.hmm else [])])
    model, tokenizer = load_lm(cfg.model, cfg.device)
    hmm = lifted_hmm(load_hmm(cfg.hmm, tokenizer), args.lift).to(cfg.device)
    n_max = max(args.items, args.items_128)
    examples = cg.select_items(compose([f"data.offset={args.offset}", f"data.limit={n_max}"]))
    if args.tables_only:
        medians = tables_only(cfg, tokenizer, hmm, examples[:args.items], args.variants, args.repeats,
                              args.tables_batch)
        print("guide tables, seconds per item:", medians)
        if args.out:
            Path(args.out).write_text(json.dumps({"tables_only": medians, "items": args.items,
                                                  "offset": args.offset, "cpu_threads": 1,
                                                  "hidden_size": hmm.hidden_size}, indent=1))
        return [medians]
    from ctrlg.guide.emission_operands import emission_operands
    from ctrlg.guide.tables import PRECISIONS, resolve_precision

    for variant in args.variants:      # the HMM's shared operands, built once per variant (as a run does)
        with variant_code(variant):
            emission_operands(hmm, PRECISIONS[resolve_precision(cfg.generation.precision)])
    if args.warmup and args.beams:       # numba's loops load from their cache on first call, oneDNN
        for variant in args.variants:    # picks its kernels: not a cost of the first width's items
            with variant_code(variant):
                decode_once(set_variant(cfg, variant), model, tokenizer, hmm, examples[:1],
                            args.beams[0])
    results = []
    for beams in args.beams:
        items = examples[:args.items_128 if beams >= 128 else args.items]
        repeats = args.repeats_128 if beams >= 128 else args.repeats
        runs = {v: [] for v in args.variants}
        outputs, floors = {}, []
        for _ in range(repeats):           # variants and the floor alternate: the same machine state
            floors += lm_floor_samples(model, len(items) * beams, args.floor_repeats)
            for variant in args.variants:
                with variant_code(variant):
                    seconds, texts = decode_once(set_variant(cfg, variant), model, tokenizer, hmm,
                                                 items, beams)
                runs[variant].append(seconds)
                if outputs.setdefault(variant, texts) != texts:
                    raise AssertionError(f"{variant}: a repeat changed the outputs")
        floor_step = statistics.median(floors)
        for variant in args.variants:
            results.append(summarise(runs[variant], variant, beams, len(items), floor_step,
                                     outputs[variant]))
            print(format_rows([results[-1]]).splitlines()[-1], flush=True)
        if len({tuple(v) for v in outputs.values()}) > 1:
            print(f"OUTPUTS DIFFER between variants at {beams} beams: {outputs}")
    print(format_rows(results))
    suffix = ("" if args.precision == "float32" else f"_products_{args.precision}") + \
        ("" if args.lift == 1 else f"_h{hmm.hidden_size}")
    out = Path(args.out or f"benchmarks/results/bench_beam_breakdown_{args.dtype}{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dtype": args.dtype, "precision": args.precision, "hmm": args.hmm,
                               "hidden_size": hmm.hidden_size, "lift": args.lift,
                               "cpu_threads": 1,
                               "device": args.device,
                               "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
