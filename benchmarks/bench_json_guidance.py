"""Ctrl-G guidance over JSON Schemas: time to the first guided step, lazy guide against tables.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_json_guidance --data /path/to/jsonschemabench/data \\
        [--sample-of benchmarks/results/bench_jsonschemabench_2049.json] [--limit N] [--seed 0]
        [--engines horizon,tables] [--budget 256] [--horizon 4] [--first-horizon 1]
        [--timeout 20] [--steps 16]
        [--hmm stories-h512] [--precision auto] [--isolation fork|server]
        [--out benchmarks/results/bench_json_guidance.json]

Takes the schemas of an earlier JSONSchemaBench run (``--sample-of``: its rows' category and file,
e.g. the 2,049 of ``bench_jsonschemabench_2049.json``; ``--limit``: a seeded subsample of them)
from a local checkout of guidance-ai/jsonschemabench (not part of this repository). One process
loads the SmolLM2 tokenizer, the HMM and warms both engines once; every (schema, engine) then runs
in a forked child killed at ``--timeout`` seconds (a timeout), as
:mod:`benchmarks.bench_jsonschemabench` does: with ``--isolation fork`` (the default) a fresh
child per schema (cold: its first touches of memory and the caches of earlier schemas are its
own cost), with ``--isolation server`` one long-lived child per engine that takes schema after
schema, as a serving process does (restarted after a timeout). The time to the first guided
step is:

* **horizon**: :func:`ctrlg.dfa.lazy_json_schema` + :class:`ctrlg.guide.horizon.HorizonGuide`
  (budget check of the initial state) + one :meth:`~ctrlg.guide.horizon.HorizonGuide.log_ratio`
  at the initial state with the prior π. Then ``--steps`` further steps of a walk that draws each
  token from the guide's own distribution (exp of the log ratio: an LM that is uniform), each
  timed (ratio + automaton step + filter step); the walk's document is checked to finish.
* **tables** (what ``ConstraintLogitsProcessor`` without ``horizon`` does): the same compile,
  the token DFA within the budget (:meth:`~ctrlg.dfa.lazy.LazyTokenDFA.within_budget`,
  :func:`~ctrlg.dfa.ops.restrict_to_budget`), :class:`~ctrlg.guide.GuideTables` over it, and one
  guidance ratio at the initial state.

Writes per-schema rows and a summary (first-step p50 / p90 / p99 over the schemas that finish,
timeouts over those not refused) and prints the summary table (markdown).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from benchmarks.bench_jsonschemabench import EngineServer, run_forked  # noqa: E402

RESULTS = Path(__file__).parent / "results"
ENGINES = ("horizon", "tables")
WARM_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
               "required": ["a"]}


def _compile(schema, ctx):
    from ctrlg import dfa
    from ctrlg.dfa.lazy import LazyTokenDFA

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = dfa.lazy_json_schema(schema, ctx.trie)
    if not isinstance(d, LazyTokenDFA):
        raise ValueError(f"not a lazy automaton ({type(d).__name__}): a grammar constraint")
    return d


def run_horizon(schema, ctx, args, seed, emit):
    import torch

    from ctrlg.guide.horizon import HorizonGuide

    t0 = time.perf_counter()
    d = _compile(schema, ctx)
    t1 = time.perf_counter()
    guide = HorizonGuide(d, ctx.hmm, args.budget, horizon=args.horizon,
                         max_region_states=args.region_states, precision=args.precision,
                         first_horizon=args.first_horizon)
    t2 = time.perf_counter()
    prior = guide.initial_prior()
    ratio = guide.log_ratio(d.initial, prior, args.budget)
    t3 = time.perf_counter()
    emit({"status": "ok", "compile_s": t1 - t0, "init_s": t2 - t1, "step_s": t3 - t2,
          "first_s": t3 - t0, "allowed": int(torch.isfinite(ratio).sum())})
    g = torch.Generator().manual_seed(seed)
    q, left, times, tokens = d.initial, args.budget, [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        if tokens:
            ratio = guide.log_ratio(q, prior, left)
        v = int(torch.multinomial(torch.softmax(ratio, 0), 1, generator=g))
        q = d.step(q, v)
        prior = guide.advance_prior(prior, v)
        times.append(time.perf_counter() - t0)
        tokens.append(v)
        left -= 1
        if v == d.eos_token_id:
            break
    emit({"walk_steps": len(tokens), "walk_step_ms": [1e3 * t for t in times],
          "walk_live": bool(guide.feasibility.within(q, left))})


def run_tables(schema, ctx, args, seed, emit):
    from ctrlg.dfa.ops import restrict_to_budget
    from ctrlg.guide import GuideTables
    from ctrlg.guide.guidance import guidance_log_ratio

    t0 = time.perf_counter()
    d = _compile(schema, ctx)
    t1 = time.perf_counter()
    a = restrict_to_budget(d.within_budget(args.budget), args.budget)
    t2 = time.perf_counter()
    emit({"compile_s": t1 - t0, "materialize_s": t2 - t1, "states": int(a.num_states)})
    tables = GuideTables(a, ctx.hmm, args.budget, eos_token_id=d.eos_token_id,
                         precision=args.precision)
    t3 = time.perf_counter()
    prior = tables.initial_prior(1)
    guidance_log_ratio([tables], [0], [a.initial], prior, args.budget)
    t4 = time.perf_counter()
    emit({"status": "ok", "tables_s": t3 - t2, "step_s": t4 - t3, "first_s": t4 - t0})


RUNNERS = {"horizon": run_horizon, "tables": run_tables}


def _setup(args):
    from types import SimpleNamespace

    import torch

    from ctrlg.dfa.vocab_trie import vocab_trie
    from ctrlg.hmm import load_embedded_hmm
    from ctrlg.lm.models import load_tokenizer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tok = load_tokenizer()
    ctx = SimpleNamespace(trie=vocab_trie(tok), hmm=load_embedded_hmm(args.hmm))
    t0 = time.perf_counter()
    for engine in args.engines:      # numba caches, the shared emission operands, token index
        RUNNERS[engine](WARM_SCHEMA, ctx, argparse.Namespace(**{**vars(args), "steps": 2}), 0,
                        lambda d: None)
    return ctx, time.perf_counter() - t0


def _schemas(args) -> list[dict]:
    rows = json.loads(args.sample_of.read_text())["rows"]
    chosen = [{"category": r["category"], "file": r["file"]} for r in rows]
    if args.limit is not None and args.limit < len(chosen):
        chosen = random.Random(args.seed).sample(chosen, args.limit)
    return chosen


def _pct(values, q):
    return float(np.percentile(values, q)) if len(values) else None


def summarise(rows, engines) -> dict:
    out = {}
    for e in engines:
        res = [r[e] for r in rows if e in r]
        ok = [x for x in res if x["status"] == "ok" and "first_s" in x]
        refused = sum(x["status"] == "refused" for x in res)
        timeouts = sum(x["status"] == "timeout" for x in res)
        first = [x["first_s"] for x in ok]
        steps = [t for x in ok for t in x.get("walk_step_ms", [])]
        out[e] = {"schemas": len(res), "ok": len(ok), "refused": refused, "timeout": timeouts,
                  "crash": sum(x["status"] == "crash" for x in res),
                  "timeout_share": timeouts / max(1, len(res) - refused),
                  "first_p50_ms": _pct(first, 50) and 1e3 * _pct(first, 50),
                  "first_p90_ms": _pct(first, 90) and 1e3 * _pct(first, 90),
                  "first_p99_ms": _pct(first, 99) and 1e3 * _pct(first, 99),
                  "walk_step_p50_ms": _pct(steps, 50), "walk_step_p99_ms": _pct(steps, 99),
                  "walks_live": sum(bool(x.get("walk_live")) for x in ok if "walk_live" in x),
                  "walks": sum("walk_live" in x for x in ok)}
        for part in ("compile_s", "init_s", "step_s", "materialize_s", "tables_s"):
            vals = [x[part] for x in ok if part in x]
            if vals:
                out[e][part.replace("_s", "_p50_ms")] = 1e3 * _pct(vals, 50)
                out[e][part.replace("_s", "_p90_ms")] = 1e3 * _pct(vals, 90)
    return out


def table(summary) -> str:
    lines = ["| engine | schemas | ok | refused | timeouts | first step p50 / p90 / p99 (ms) | "
             "later steps p50 / p99 (ms) |", "|---|---|---|---|---|---|---|"]
    fmt = (lambda v: "–" if v is None else f"{v:.1f}")
    for e, s in summary.items():
        lines.append(f"| {e} | {s['schemas']} | {s['ok']} | {s['refused']} | {s['timeout']} "
                     f"({100 * s['timeout_share']:.1f} %) | {fmt(s['first_p50_ms'])} / "
                     f"{fmt(s['first_p90_ms'])} / {fmt(s['first_p99_ms'])} | "
                     f"{fmt(s['walk_step_p50_ms'])} / {fmt(s['walk_step_p99_ms'])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from ctrlg.guide.horizon import DEFAULT_HORIZON, MAX_REGION_STATES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True,
                   help="the data/ folder of a guidance-ai/jsonschemabench checkout")
    p.add_argument("--sample-of", type=Path, default=RESULTS / "bench_jsonschemabench_2049.json")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", default="horizon,tables")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--horizon", type=int, default=DEFAULT_HORIZON)
    p.add_argument("--first-horizon", type=int, default=None,
                   help="the first token's horizon (HorizonGuide's first_horizon; "
                        "default: --horizon)")
    p.add_argument("--region-states", type=int, default=MAX_REGION_STATES)
    p.add_argument("--precision", default="auto")
    p.add_argument("--hmm", default="stories-h512")
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--isolation", choices=("fork", "server"), default="fork",
                   help="fork: every (schema, engine) in a fresh forked child (cold); server: "
                        "each engine in one long-lived child that takes schema after schema "
                        "(caches warm, as a serving process), restarted after a timeout")
    p.add_argument("--gc-freeze", action="store_true",
                   help="gc.freeze() once the tokenizer and HMM are loaded and warm, before any "
                        "child is forked: the loaded objects leave later full collections, "
                        "which then come more often (docs/regex.md)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_json_guidance.json")
    args = p.parse_args(argv)
    args.engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in args.engines if e not in RUNNERS]
    if unknown:
        p.error(f"unknown engines {unknown}; choose from {ENGINES}")
    ctx, warm_s = _setup(args)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    schemas = _schemas(args)
    rows, start = [], time.perf_counter()
    servers = {e: EngineServer(e, args.timeout, work=lambda task, emit, e=e: RUNNERS[e](
                   json.loads((args.data / task["cat"] / task["name"]).read_text()), ctx, args,
                   task["k"], emit)) for e in args.engines} if args.isolation == "server" else {}
    for i, row in enumerate(schemas):
        schema = None if servers else \
            json.loads((args.data / row["category"] / row["file"]).read_text())
        for e in args.engines:
            if e in servers:             # the server reads the schema itself
                row[e] = servers[e].run(i, row["category"], row["file"])
            else:
                row[e] = run_forked(lambda emit, e=e: RUNNERS[e](schema, ctx, args, i, emit),
                                    args.timeout)
        rows.append(row)
        if (i + 1) % 100 == 0:
            print(f"{i + 1}/{len(schemas)} schemas, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
    for server in servers.values():
        server.stop()
    summary = summarise(rows, args.engines)
    result = {"command": "python -m benchmarks.bench_json_guidance " + " ".join(
                  f"--{k.replace('_', '-')}" if v is True else
                  f"--{k.replace('_', '-')} {','.join(v) if isinstance(v, list) else v}"
                  for k, v in vars(args).items() if k not in ("data", "out") and v is not False),
              "wall_s": time.perf_counter() - start, "warmup_s": warm_s,
              "machine": {"cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count(), "threads": os.environ.get("OMP_NUM_THREADS")},
              "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(table(summary))


if __name__ == "__main__":
    main()
