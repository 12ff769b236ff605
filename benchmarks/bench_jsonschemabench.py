"""JSONSchemaBench coverage, validity and speed: ctrlg vs outlines-core vs llguidance.

    nice -n 10 python -m benchmarks.bench_jsonschemabench --data /path/to/jsonschemabench/data \\
        [--per-category 30] [--seed 0] [--timeout 30] [--walks 3] [--budget 512] [--jobs 1]
        [--isolation fork|server] [--outlines-compile-only]
        [--failures-of benchmarks/results/<earlier run>.json]

Reads a local checkout of guidance-ai/jsonschemabench (``data/<category>/*.json``; not part of
this repository) and takes every schema, or a seeded sample of ``--per-category`` schemas of
each category. One process loads the SmolLM2 tokenizer (and each library's vocabulary object,
:func:`benchmarks.bench_regex._setup`) once. With ``--isolation fork`` (the default) every
schema and engine runs in a child forked from it: a cold process, with no cache or freed memory
left by an earlier schema (its first allocations are page faults). With ``--isolation server``
each engine runs in one long-lived child per job (:class:`EngineServer`) that takes schema
after schema, as a serving process (or MaskBench's single process) does: caches shared across
schemas stay warm. Either way a schema is killed after ``--timeout`` seconds (a timeout; a
server is then restarted), and its exceptions are refusals (``ValueError`` and the libraries'
own errors) or crashes (anything else, or a dead child).

* **ctrlg**: ``dfa.json_schema(schema, tokenizer)`` (a TokenDFA, or a grammar constraint for a
  recursive schema); compile time, states (of the regular automaton A). Then ``--walks``
  uniform random walks: at every step the next token is drawn uniformly among the tokens that
  keep the constraint satisfiable within the remaining budget of ``--budget`` tokens (the exact
  masks of :func:`ctrlg.guide.masks.token_mask` over :class:`~ctrlg.guide.feasibility.Feasibility`,
  timed per token), until EOS. Each document (the walk's token bytes, decoded) is checked with
  ``jsonschema`` (the validator of the schema's ``$schema``, formats checked where jsonschema
  can); ``invalid`` counts the documents it rejects.
* **outlines-core**: ``build_regex_from_schema`` + ``Index`` (compile time), then walks uniform
  over ``get_allowed_tokens`` (no budget: a walk stopped after ``--budget`` tokens is
  ``incomplete``), masks timed as in bench_regex; its finished documents are checked too.
* **llguidance**: ``LLMatcher(grammar_from_json_schema(schema))`` (an ``is_error`` matcher is a
  refusal), walks uniform over ``fill_next_token_bitmask``, timed with ``consume_token``.

Writes ``benchmarks/results/bench_jsonschemabench.json`` (per schema and per category) and a
PNG plot next to it, and prints the per-category table (markdown).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import resource
import select
import signal
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

ENGINES = ("ctrlg", "ctrlg_lazy", "outlines", "llguidance")
RESULTS = Path(__file__).parent / "results"


# ---------------------------------------------------------------------- isolation
def run_forked(fn, timeout: float, memory_gb: float = 8.0) -> dict:
    """Run ``fn(emit)`` in a forked child; ``emit(dict)`` sends partial results (kept when the
    child is killed at ``timeout`` seconds). Returns the merged dict with a ``status``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # child
        os.close(r)
        out, emit = _child_output(w, memory_gb)
        _run_reporting(fn, emit)
        out.close()
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout
    data, timed_out = b"", False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([r], [], [], left)
        if ready:
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            data += chunk
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    os.close(r)
    os.waitpid(pid, 0)
    merged: dict = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            merged.update(json.loads(line))
        except json.JSONDecodeError:
            pass
    return _final_status(merged, timed_out)


def _child_output(fd: int, memory_gb: float):
    """In a forked child: cap its address space, and ``(file, emit)`` writing JSON lines to
    ``fd``."""
    try:
        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass
    out = os.fdopen(fd, "w")

    def emit(d):
        out.write(json.dumps(d) + "\n")
        out.flush()
    return out, emit


def _run_reporting(fn, emit) -> None:
    """``fn(emit)``, its exceptions emitted as a refusal (ValueError) or a crash."""
    try:
        fn(emit)
    except ValueError as exc:
        emit({"status": "refused", "error": f"{type(exc).__name__}: {exc}"[:400]})
    except BaseException as exc:  # noqa: BLE001 - a crash is a result
        emit({"status": "crash", "error": f"{type(exc).__name__}: {exc}"[:400]})


def _final_status(merged: dict, timed_out: bool) -> dict:
    if timed_out:
        merged["timed_out"] = True
        merged.setdefault("status", "timeout")
        if merged["status"] == "compiled":
            merged["status"] = "ok"            # compiled; the walks ran out of time
    merged.setdefault("status", "crash")       # no status: the child died
    return merged


class EngineServer:
    """One engine in a long-lived forked process that runs schema after schema, as a server
    does (``--isolation server``): per-vocabulary and cross-schema caches stay warm, and
    memory freed by one schema is reused by the next. :meth:`run` sends a schema to it and
    merges what the runner emits, as :func:`run_forked`; at ``timeout`` seconds (or if the
    process dies) the process is killed, and the next schema starts a fresh one. ``work(task,
    emit)`` runs one task (the dict given to :meth:`run`) in the server; by default the
    engine's runner of this module on the schema ``task`` names."""

    def __init__(self, engine: str, timeout: float, memory_gb: float = 8.0, work=None):
        self.engine, self.timeout, self.memory_gb = engine, timeout, memory_gb
        self.work = work if work is not None else self._run_schema
        self.pid = None

    def _run_schema(self, task: dict, emit) -> None:
        ctx, args = _WORKER["ctx"], _WORKER["args"]
        schema = json.loads((args.data / task["cat"] / task["name"]).read_text())
        RUNNERS[self.engine](schema, ctx, args, args.seed + task["k"], emit)

    def _start(self):
        task_r, task_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # the server: run schemas until EOF
            os.close(task_w)
            os.close(out_r)
            _, emit = _child_output(out_w, self.memory_gb)
            for line in os.fdopen(task_r, "r"):
                task = json.loads(line)
                _run_reporting(lambda emit, task=task: self.work(task, emit), emit)
                emit({"__done__": True})
            os._exit(0)
        os.close(task_r)
        os.close(out_w)
        self.pid, self.task_w, self.out_r, self.buf = pid, task_w, out_r, b""

    def run(self, k: int, cat: str, name: str) -> dict:
        if self.pid is None:
            self._start()
        os.write(self.task_w, (json.dumps({"k": k, "cat": cat, "name": name}) + "\n").encode())
        deadline = time.monotonic() + self.timeout
        merged: dict = {}
        timed_out = False
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if d.get("__done__"):
                    return _final_status(merged, timed_out=False)
                merged.update(d)
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([self.out_r], [], [], left)
            if ready:
                chunk = os.read(self.out_r, 1 << 20)
                if not chunk:                          # the process died
                    break
                self.buf += chunk
        self.stop(kill=True)
        return _final_status(merged, timed_out)

    def stop(self, kill: bool = False):
        if self.pid is None:
            return
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        os.close(self.task_w)
        os.close(self.out_r)
        os.waitpid(self.pid, 0)
        self.pid = None


# ---------------------------------------------------------------------- checking documents
def checker(schema):
    """A function doc_text -> None (valid) or an error message (jsonschema, the schema's draft)."""
    import jsonschema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def check(text):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"not JSON: {exc}"
        try:
            err = next(iter(v.iter_errors(doc)), None)
        except Exception as exc:  # noqa: BLE001 - the validator itself failed
            return None if "validator" in str(exc) else f"validator error: {exc}"
        return None if err is None else f"{err.message[:200]} at {list(err.absolute_path)}"
    return check


def _walk_stats(emit, docs, times, check):
    invalid = []
    for text in docs:
        err = check(text)
        if err is not None:
            invalid.append({"doc": text[:300], "error": err})
    emit({"docs": len(docs), "invalid": len(invalid), "invalid_examples": invalid[:2],
          "mask_us": [round(t * 1e6, 2) for t in times]})


def _random_walks(ctx, args, seed, start, mask_of, step, *, time_step=True, allowed=None):
    """``args.walks`` uniform random walks of at most ``args.budget`` tokens, as
    ``([(tokens, reached EOS)], per-step seconds)``: from ``start()``, each step draws a token
    uniformly (``np.random.default_rng(seed)``) among ``allowed(state, mask_of(state))``
    (default: the mask itself) and moves to ``step(state, token)``; a walk ends at EOS, at an
    empty mask or after the budget. A step's time is ``mask_of`` plus (``time_step``) ``step``."""
    rng = np.random.default_rng(seed)
    walks, times = [], []
    for _ in range(args.walks):
        s, toks, done = start(), [], False
        for _ in range(args.budget):
            t1 = time.perf_counter()
            mask = mask_of(s)
            times.append(time.perf_counter() - t1)
            ids = np.flatnonzero(mask if allowed is None else allowed(s, mask))
            if not len(ids):
                break
            t = int(ids[rng.integers(len(ids))])
            if t == ctx.eos:
                done = True
                break
            t1 = time.perf_counter()
            s = step(s, t)
            if time_step:
                times[-1] += time.perf_counter() - t1
            toks.append(t)
        walks.append((toks, done))
    return walks, times


def _report_unbudgeted_walks(emit, ctx, walks, times, check, final=True):
    """The walks of an engine without a budget, ``[(tokens, reached EOS)]``: those that reached
    EOS are decoded and checked, the others counted as incomplete."""
    docs = [b"".join(ctx.token_bytes[t] for t in toks).decode("utf-8", "replace")
            for toks, done in walks if done]
    emit({"incomplete": len(walks) - len(docs)})
    _walk_stats(emit, docs, times, check)
    if final:
        emit({"status": "ok"})


# ---------------------------------------------------------------------- engines
def run_ctrlg(schema, ctx, args, seed, emit, constraint=None, compile_s=None):
    from ctrlg import dfa
    from ctrlg.dfa.cfg.constraint import GrammarConstraint
    from ctrlg.guide.feasibility import Feasibility
    from ctrlg.guide.masks import regular_automaton, token_mask

    d = constraint
    if d is None:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = dfa.json_schema(schema, ctx.trie)
        compile_s = time.perf_counter() - t0
    a = regular_automaton(d)
    emit({"status": "compiled", "compile_s": compile_s, "states": int(a.num_states),
          "kind": "grammar" if isinstance(d, GrammarConstraint) else "dfa"})
    t0 = time.perf_counter()
    table = Feasibility(a, max_new_tokens=args.budget, eos_token_id=ctx.eos)
    masks = token_mask(d, table)
    emit({"table_s": time.perf_counter() - t0})
    if not table.feasible[args.budget - 1, a.initial] and not table.feasible[args.budget, a.initial]:
        emit({"status": "ok", "walk_error": f"no document within {args.budget} tokens"})
        return
    check = checker(schema)
    walks, times = _random_walks(                 # state: (trie cursor, DFA state, tokens left)
        ctx, args, seed, lambda: (masks.start(), a.initial, args.budget),
        lambda q: masks.allowed(*q),
        lambda q, t: (masks.advance(q[0], t), a.step(q[1], t), q[2] - 1), time_step=False)
    docs = [b"".join(ctx.token_bytes[t] for t in toks).decode("utf-8", "replace")
            for toks, _ in walks]
    _walk_stats(emit, docs, times, check)
    emit({"status": "ok"})


def run_ctrlg_lazy(schema, ctx, args, seed, emit):
    """The lazy path (:func:`ctrlg.dfa.lazy_json_schema`): compile = the schema's regex and NFA;
    walks uniform over :meth:`~ctrlg.dfa.lazy.LazyTokenDFA.mask` without a budget (as the other
    libraries: a walk not finished after ``--budget`` tokens is incomplete), each step timed as
    mask + step (llguidance's fill + consume). With ``--lazy-tables`` the token DFA the
    processor's tables are built over is then built as the processor builds it
    (:meth:`~ctrlg.dfa.lazy.LazyTokenDFA.within_budget`, restricted to the budget) and its
    feasibility table F_r timed (what Ctrl-G / budgeted logical mode adds on top)."""
    from ctrlg import dfa
    from ctrlg.dfa.lazy import LazyTokenDFA

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = dfa.lazy_json_schema(schema, ctx.trie)
    compile_s = time.perf_counter() - t0
    if not isinstance(d, LazyTokenDFA):       # a recursive schema: the eager grammar path
        emit({"kind": "grammar"})
        return run_ctrlg(schema, ctx, args, seed, emit, constraint=d, compile_s=compile_s)
    emit({"status": "compiled", "compile_s": compile_s, "kind": "lazy"})
    check = checker(schema)
    walks, times = _random_walks(ctx, args, seed, lambda: d.initial, d.mask, d.step)
    emit({"states": int(d.num_states)})
    _report_unbudgeted_walks(emit, ctx, walks, times, check, final=not args.lazy_tables)
    if args.lazy_tables:
        from ctrlg.dfa.ops import restrict_to_budget
        from ctrlg.guide.feasibility import Feasibility
        t0 = time.perf_counter()
        a = restrict_to_budget(d.within_budget(args.budget), args.budget)
        emit({"materialize_s": time.perf_counter() - t0, "budget_states": int(a.num_states)})
        t0 = time.perf_counter()
        Feasibility(a, max_new_tokens=args.budget, eos_token_id=ctx.eos)
        emit({"table_s": time.perf_counter() - t0})
        emit({"status": "ok"})


def run_outlines(schema, ctx, args, seed, emit):
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    index = ctx.Index(build_regex_from_schema(json.dumps(schema)), ctx.oc_vocab)
    emit({"status": "compiled", "compile_s": time.perf_counter() - t0})
    if args.outlines_compile_only:      # its masks (~2 ms each) would dominate a large run
        emit({"status": "ok", "walks": "skipped"})
        return
    check = checker(schema)

    def mask_of(s):
        mask = np.zeros(ctx.V, dtype=bool)
        mask[index.get_allowed_tokens(s)] = True
        return mask

    walks, times = _random_walks(ctx, args, seed, index.get_initial_state, mask_of,
                                 index.get_next_state, time_step=False)
    _report_unbudgeted_walks(emit, ctx, walks, times, check)


def run_llguidance(schema, ctx, args, seed, emit):
    llguidance, llnp = ctx.llguidance, ctx.llnp
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    m = llguidance.LLMatcher(ctx.ll_tok, grammar)
    if m.is_error():
        emit({"status": "refused", "error": m.get_error()[:400]})
        return
    emit({"status": "compiled", "compile_s": time.perf_counter() - t0})
    check = checker(schema)
    bitmask = llnp.allocate_token_bitmask(1, ctx.ll_tok.vocab_size)

    def allowed(m, _):            # the bitmask unpacked (untimed); none once the matcher errs
        bits = np.unpackbits(np.asarray(bitmask[0]).view(np.uint8), bitorder="little")[:ctx.V]
        return bits if not m.is_error() else bits[:0]

    def consume(m, t):
        m.consume_token(t)
        return m

    walks, times = _random_walks(ctx, args, seed, lambda: llguidance.LLMatcher(ctx.ll_tok, grammar),
                                 lambda m: llnp.fill_next_token_bitmask(m, bitmask, 0), consume,
                                 allowed=allowed)
    _report_unbudgeted_walks(emit, ctx, walks, times, check)


RUNNERS = {"ctrlg": run_ctrlg, "ctrlg_lazy": run_ctrlg_lazy, "outlines": run_outlines,
           "llguidance": run_llguidance}


# ---------------------------------------------------------------------- driver
def sample_schemas(data: Path, per_category: int | None, seed: int):
    out = []
    for cat in sorted(p.name for p in data.iterdir() if p.is_dir()):
        files = sorted(p.name for p in (data / cat).glob("*.json"))
        if per_category is not None and per_category < len(files):
            files = sorted(random.Random(f"{seed}/{cat}").sample(files, per_category))
        out += [(cat, f) for f in files]
    return out


def _setup_context():
    from benchmarks.bench_regex import _setup
    from ctrlg.dfa.vocab_trie import vocab_trie
    from ctrlg.lm.models import load_tokenizer

    tok = load_tokenizer()
    ctx, setup, notes = _setup(tok)
    ctx.trie = vocab_trie(tok)
    ctx.token_bytes = [bytes(b) for b in ctx.trie.token_bytes]
    t0 = time.perf_counter()
    _warm_lazy(ctx.trie)
    setup["ctrlg_lazy_warmup_s"] = time.perf_counter() - t0
    return ctx, setup, notes


def _warm_lazy(trie):
    """Per-vocabulary work of the lazy path, done once before the schemas fork (as llguidance
    and outlines-core build their vocabulary objects once): the compiled trie walk and the
    loop slice of a JSON string's body (:func:`ctrlg.dfa.lazy.loop_slice`) and the counted slice
    of its character (:func:`ctrlg.dfa.lazy.class_slice`, strings with a ``maxLength``)."""
    from ctrlg import dfa

    d = dfa.lazy_json_schema({"type": "object", "properties": {"a": {"type": "string"}},
                              "required": ["a"]}, trie, whitespace="")
    q = d.initial
    for ch in b'{"a":"x':
        q = d.bdfa.row(q)[ch]
    d.mask(int(q))
    # the counted slice of a JSON string's character (:func:`ctrlg.dfa.lazy.class_slice`)
    d = dfa.lazy_json_schema({"type": "string", "maxLength": 300}, trie, whitespace="")
    d.mask(int(d.bdfa.row(d.initial)[ord('"')]))


def _pct(values, q):
    return float(np.percentile(values, q)) if len(values) else None


def summarise(rows, engines):
    cats = sorted({r["category"] for r in rows}) + ["all"]
    table = {}
    for cat in cats:
        sel = [r for r in rows if cat == "all" or r["category"] == cat]
        entry = {"schemas": len(sel)}
        for e in engines:
            res = [r[e] for r in sel if e in r]
            ok = [x for x in res if x["status"] == "ok"]
            comp = [x["compile_s"] for x in ok if "compile_s" in x]
            tables = [x["table_s"] + x.get("materialize_s", 0.0) for x in ok if "table_s" in x]
            masks = [t for x in ok for t in x.get("mask_us", [])]
            entry[e] = {
                "compiled": len(ok),
                "refused": sum(x["status"] == "refused" for x in res),
                "timeout": sum(x["status"] == "timeout" for x in res),
                "crash": sum(x["status"] == "crash" for x in res),
                "compile_median_s": _pct(comp, 50), "compile_p90_s": _pct(comp, 90),
                "compile_p99_s": _pct(comp, 99),
                "tables_median_s": _pct(tables, 50), "tables_p90_s": _pct(tables, 90),
                "mask_p50_us": _pct(masks, 50), "mask_p99_us": _pct(masks, 99),
                "docs": sum(x.get("docs", 0) for x in ok),
                "invalid_docs": sum(x.get("invalid", 0) for x in ok),
                "schemas_with_invalid_docs": sum(x.get("invalid", 0) > 0 for x in ok),
                "incomplete_walks": sum(x.get("incomplete", 0) for x in ok),
            }
            if e in ("ctrlg", "ctrlg_lazy"):
                states = [x["states"] for x in ok if "states" in x]
                entry[e]["states_median"] = _pct(states, 50)
                entry[e]["states_p90"] = _pct(states, 90)
                entry[e]["grammar"] = sum(x.get("kind") == "grammar" for x in ok)
        table[cat] = entry
    return table


def compact(rows):
    """Per-token mask times of each row as their count, median and 99th percentile (the pooled
    percentiles are in the summary)."""
    for r in rows:
        for e in ENGINES:
            x = r.get(e)
            if isinstance(x, dict) and isinstance(x.get("mask_us"), list):
                times = x.pop("mask_us")
                x["mask_steps"] = len(times)
                x["mask_p50_us"], x["mask_p99_us"] = _pct(times, 50), _pct(times, 99)


def markdown(table, engines):
    def f(v, unit=""):
        if v is None:
            return "—"
        if unit == "s":
            return f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.1f} s"
        if unit == "us":
            return f"{v:.0f} µs" if v < 1000 else f"{v / 1e3:.1f} ms"
        return f"{v:.0f}"
    lines = ["| category | n | " + " | ".join(
                 f"{e} compiled" for e in engines) + " | compile median / p90 (" +
             " · ".join(engines) + ") | mask p50 / p99 (" + " · ".join(engines) +
             ") | ctrlg states median / p90 | invalid docs (" + " · ".join(engines) + ") |",
             "|---" * (5 + len(engines)) + "|"]
    for cat, entry in table.items():
        cells = [cat, str(entry["schemas"])]
        cells += [f"{entry[e]['compiled']}" + (f" ({entry[e]['timeout']} t/o, "
                                               f"{entry[e]['crash']} crash)"
                                               if entry[e]['timeout'] or entry[e]['crash'] else "")
                  for e in engines]
        cells.append(" · ".join(f"{f(entry[e]['compile_median_s'], 's')} / "
                                f"{f(entry[e]['compile_p90_s'], 's')}" for e in engines))
        cells.append(" · ".join(f"{f(entry[e]['mask_p50_us'], 'us')} / "
                                f"{f(entry[e]['mask_p99_us'], 'us')}" for e in engines))
        c = entry.get("ctrlg", {})
        cells.append(f"{f(c.get('states_median'))} / {f(c.get('states_p90'))}")
        cells.append(" · ".join(f"{entry[e]['invalid_docs']}/{entry[e]['docs']}"
                                for e in engines))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def engine_table(entry, engines):
    """One row per engine over all schemas: coverage, compile p50/p90/p99, mask p50/p99,
    invalid documents, timeouts (markdown)."""
    def ms(v):
        return "—" if v is None else f"{v * 1e3:.1f} ms"

    def us(v):
        return "—" if v is None else f"{v:.0f} µs"
    n = entry["schemas"]
    lines = ["| engine | compiled | compile p50 / p90 / p99 | mask p50 / p99 | invalid / docs | "
             "incomplete walks | timeouts | refused | crash |", "|---" * 9 + "|"]
    for e in engines:
        x = entry[e]
        lines.append(f"| {e} | {x['compiled']} ({100 * x['compiled'] / max(n, 1):.1f} %) | "
                     f"{ms(x['compile_median_s'])} / {ms(x['compile_p90_s'])} / "
                     f"{ms(x['compile_p99_s'])} | {us(x['mask_p50_us'])} / {us(x['mask_p99_us'])} | "
                     f"{x['invalid_docs']} / {x['docs']} | {x['incomplete_walks']} | "
                     f"{x['timeout']} | {x['refused']} | {x['crash']} |")
    return "\n".join(lines)


def plot(table, engines, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = [c for c in table if c != "all"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
    width = 0.8 / len(engines)
    for k, e in enumerate(engines):
        cov = [table[c][e]["compiled"] / table[c]["schemas"] for c in cats]
        ax1.bar(np.arange(len(cats)) + k * width, cov, width, label=e)
        med = [table[c][e]["compile_median_s"] or np.nan for c in cats]
        ax2.bar(np.arange(len(cats)) + k * width, med, width, label=e)
    for ax, title in ((ax1, "schemas compiled (fraction)"), (ax2, "compile time, median (s)")):
        ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2)
        ax.set_xticklabels(cats, rotation=35, ha="right", fontsize=8)
        ax.set_title(title)
    ax2.set_yscale("log")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


_WORKER: dict = {}   # ctx, args, engines of the run, set before the workers fork


def _run_schema(task) -> dict:
    """One schema through every engine, each in its own forked child (:func:`run_forked`)."""
    k, cat, name = task
    ctx, args, engines = _WORKER["ctx"], _WORKER["args"], _WORKER["engines"]
    row = {"category": cat, "file": name}
    try:
        schema = json.loads((args.data / cat / name).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        row["skipped"] = f"{type(exc).__name__}: {exc}"
        return row
    for e in engines:
        if args.isolation == "server":
            server = _SERVERS.get(e)
            if server is None:
                server = _SERVERS[e] = EngineServer(e, args.timeout)
            row[e] = server.run(k, cat, name)
            continue
        runner = RUNNERS[e]
        row[e] = run_forked(lambda emit: runner(schema, ctx, args, args.seed + k, emit),
                            args.timeout)
    return row


_SERVERS: dict = {}   # engine -> EngineServer, per pool worker (--isolation server)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True,
                   help="the data/ folder of a guidance-ai/jsonschemabench checkout")
    p.add_argument("--per-category", type=int, default=None,
                   help="a seeded sample of N schemas per category (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per schema and engine")
    p.add_argument("--walks", type=int, default=3)
    p.add_argument("--budget", type=int, default=512, help="tokens per random walk")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--sample-of", type=Path, default=None,
                   help="a previous result JSON: run exactly its schemas (overrides the sampling)")
    p.add_argument("--limit", type=int, default=None,
                   help="only the first N schemas of the sample (seeded shuffle of it)")
    p.add_argument("--shuffle", action="store_true",
                   help="run the schemas in a seeded random order (an interrupted run's rows are "
                        "then a random subsample)")
    p.add_argument("--from-partial", type=Path, default=None,
                   help="summarise the rows of an interrupted run's .partial.jsonl instead of "
                        "running")
    p.add_argument("--lazy-tables", action="store_true",
                   help="ctrlg_lazy: also build the states within the budget and their table")
    p.add_argument("--failures-of", type=Path, default=None,
                   help="a previous result JSON: run only the schemas (of this sample) that ctrlg "
                        "refused or crashed on there")
    p.add_argument("--outlines-compile-only", action="store_true",
                   help="outlines-core: time the compile only, no walks (its masks take ~2 ms "
                        "each, so its walks dominate a run over thousands of schemas)")
    p.add_argument("--isolation", choices=("fork", "server"), default="fork",
                   help="fork: every schema in a fresh child forked from the set-up process "
                        "(cold: no cache or freed memory of an earlier schema); server: each "
                        "engine in one long-lived process per job that runs schema after "
                        "schema (as a serving process does), restarted after a timeout")
    p.add_argument("--jobs", type=int, default=1,
                   help="schemas run at once, one core each (run with OMP_NUM_THREADS=1)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_jsonschemabench.json")
    args = p.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    t_start = time.time()
    if args.from_partial:
        rows = [json.loads(line) for line in args.from_partial.read_text().splitlines() if line]
        engines = [e for e in engines if any(e in r for r in rows)]
        return _finish(args, engines, rows, {"from_partial": str(args.from_partial)}, {},
                       ["summarised from an interrupted run's rows"], t_start)
    ctx, setup, notes = _setup_context()
    missing = [e for e, absent in (("outlines", ctx.Index is None),
                                     ("llguidance", ctx.llguidance is None)) if absent and e in engines]
    if missing:   # a named engine is never dropped silently: the comparison would be one-sided
        raise SystemExit(f"engine(s) {missing} are not installed: pip install -e '.[bench]' "
                         f"(outlines-core==0.2.14, llguidance==1.9.1), or leave them out of --engines")
    schemas = sample_schemas(args.data, args.per_category, args.seed)
    if args.sample_of:
        schemas = [(r["category"], r["file"])
                   for r in json.loads(args.sample_of.read_text())["rows"]]
    if args.limit is not None:
        schemas = sorted(random.Random(args.seed).sample(schemas, min(args.limit, len(schemas))))
    if args.failures_of:   # re-check: only the schemas ctrlg refused or crashed on in that run
        failed = {(r["category"], r["file"]) for r in json.loads(args.failures_of.read_text())["rows"]
                  if r.get("ctrlg", {}).get("status") in ("refused", "crash")}
        schemas = [x for x in schemas if x in failed]
    if args.shuffle:
        random.Random(args.seed).shuffle(schemas)
    _WORKER.update(ctx=ctx, args=args, engines=engines)
    tasks = [(k, cat, name) for k, (cat, name) in enumerate(schemas)]
    try:
        from tqdm import tqdm
    except ImportError:
        def tqdm(it, **_):
            return it
    partial = args.out.with_suffix(".partial.jsonl")   # rows as they finish (kept if interrupted)
    partial.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(partial, "w", encoding="utf-8") as log:
        def keep(row):
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            if not os.isatty(2) and len(rows) % 50 == 0:
                print(f"{len(rows)}/{len(tasks)} schemas, {time.time() - t_start:.0f} s",
                      file=sys.stderr, flush=True)
        if args.jobs > 1:   # forked workers, single-threaded, each forking a child per schema
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                for row in tqdm(pool.imap(_run_schema, tasks), total=len(tasks),
                                disable=not os.isatty(2)):
                    keep(row)
        else:
            for task in tqdm(tasks, disable=not os.isatty(2)):
                keep(_run_schema(task))
    partial.unlink()
    return _finish(args, engines, rows, {}, setup, notes, t_start)


def _finish(args, engines, rows, extra, setup, notes, t_start):
    """Summarise, write the JSON and the plot, print the tables."""
    rows = [r for r in rows if "skipped" not in r] + [r for r in rows if "skipped" in r]
    table = summarise([r for r in rows if "skipped" not in r], engines)
    compact(rows)
    wall = time.time() - t_start
    refusals = {}
    for r in rows:
        x = r.get("ctrlg")
        if x and x["status"] in ("refused", "crash", "timeout"):
            key = x["status"] + ": " + " ".join(x.get("error", "").split(" at ")[0].split()[:12])
            refusals[key] = refusals.get(key, 0) + 1
    result = {
        "command": "python -m benchmarks.bench_jsonschemabench " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "wall_s": wall, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                    "load_avg": os.getloadavg()},
        "setup_s": setup, "notes": notes, "engines": engines, **extra,
        "summary": table, "ctrlg_refusal_causes": dict(sorted(refusals.items(),
                                                              key=lambda kv: -kv[1])),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    try:
        plot(table, engines, args.out.with_suffix(".png"))
    except ImportError:
        pass
    print(markdown(table, engines))
    print()
    print(engine_table(table["all"], engines))
    print(f"\nwall time {wall:.0f} s; ctrlg refusals: {json.dumps(result['ctrlg_refusal_causes'], indent=1)}")
    return result


if __name__ == "__main__":
    main()
