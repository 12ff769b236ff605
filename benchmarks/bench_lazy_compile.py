"""Where the lazy JSON Schema path's compile time goes, schema by schema.

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.bench_lazy_compile \\
        --data /path/to/jsonschemabench/data --slowest 60 [--timeout 30]
        --slowest-of benchmarks/results/bench_jsonschemabench_lazy2049.json
        [--out benchmarks/results/bench_lazy_compile.json]

Takes the ``--slowest`` schemas that ``ctrlg_lazy`` compiled slowest in an earlier
:mod:`benchmarks.bench_jsonschemabench` run, plus every one it timed out on (or the
``category/file`` names given with ``--schemas``), and compiles each with
:func:`ctrlg.dfa.lazy_json_schema` over the SmolLM2 vocabulary in a child forked from a process
that built the vocabulary's trie and warmed the lazy path once (as the JSONSchemaBench run does),
killed after ``--timeout`` seconds. The phases are timed by wrapping the functions that do them:
``schema_to_regex`` (the JSON Schema compiler, ``_compile``), ``unroll`` (a recursive schema's
unrolled regex), ``parse`` (the regex parse of the lazy path), ``nfa`` (its Thompson NFA:
:func:`ctrlg.dfa.lazy_nfa.lazy_thompson`), ``byte_dfa`` (the lazy byte DFA's initial state);
``other`` is the rest (the grammar fallback of a recursive schema, in the main). Prints each
schema's row and the totals / p50 / p90 of the compile time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
PHASES = ("schema_to_regex", "unroll", "parse", "nfa", "byte_dfa")


def _instrument(totals: Counter) -> None:
    """Wrap each phase's function so that its time is added to ``totals``."""
    js = importlib.import_module("ctrlg.dfa.json_schema")
    jl = importlib.import_module("ctrlg.dfa.json_schema.lazy")
    lazy = importlib.import_module("ctrlg.dfa.lazy")
    lazy_nfa = importlib.import_module("ctrlg.dfa.lazy_nfa")

    def timed(name, f):
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                totals[name] += time.perf_counter() - t
        return g
    js._compile = timed("schema_to_regex", js._compile)
    jl.unroll = timed("unroll", jl.unroll)
    lazy.parse = timed("parse", lazy.parse)
    lazy_nfa.lazy_thompson = timed("nfa", lazy_nfa.lazy_thompson)
    lazy.LazyByteDFA.__init__ = timed("byte_dfa", lazy.LazyByteDFA.__init__)


def _one(schema, trie, totals: Counter) -> dict:
    from ctrlg.dfa.json_schema.lazy import lazy_json_schema

    totals.clear()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = lazy_json_schema(schema, trie)
        status, kind = "ok", type(d).__name__
    except ValueError as exc:
        status, kind = "refused", f"{type(exc).__name__}: {str(exc)[:100]}"
    total = time.perf_counter() - t0
    row = {"status": status, "kind": kind, "compile_s": total,
           **{p: totals.get(p, 0.0) for p in PHASES}}
    row["other"] = max(0.0, total - sum(row[p] for p in PHASES))
    return row


def _in_child(fn, timeout: float) -> dict:
    """``fn()`` in a forked child, its JSON result read back; ``{"status": "timeout"}`` past
    ``timeout`` seconds."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = json.dumps(fn()).encode()
        except BaseException as exc:       # noqa: BLE001 - reported, the child exits
            out = json.dumps({"status": "crash", "kind": repr(exc)[:200]}).encode()
        os.write(w, out)
        os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return {"status": "timeout", "compile_s": timeout}
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _slowest(path: Path, n: int) -> list[str]:
    rows = json.loads(path.read_text())["rows"]
    ok = [r for r in rows if r.get("ctrlg_lazy", {}).get("status") == "ok"]
    ok.sort(key=lambda r: -r["ctrlg_lazy"]["compile_s"])
    timeouts = [r for r in rows if r.get("ctrlg_lazy", {}).get("status") == "timeout"]
    return [f"{r['category']}/{r['file']}" for r in timeouts + ok[:n]]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path, help="jsonschemabench/data")
    p.add_argument("--slowest-of", type=Path, help="an earlier bench_jsonschemabench result")
    p.add_argument("--slowest", type=int, default=60)
    p.add_argument("--schemas", nargs="*", default=[], help="category/file names")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    names = list(args.schemas)
    if args.slowest_of is not None:
        names += _slowest(args.slowest_of, args.slowest)
    if not names:
        p.error("no schemas: give --slowest-of or --schemas")

    from benchmarks.bench_jsonschemabench import _warm_lazy
    from ctrlg.dfa.vocab_trie import vocab_trie
    from ctrlg.lm.models import load_tokenizer

    totals: Counter = Counter()
    _instrument(totals)
    trie = vocab_trie(load_tokenizer())
    _warm_lazy(trie)
    rows = []
    for name in names:
        schema = json.loads((args.data / name).read_text())
        row = {"schema": name, **_in_child(lambda: _one(schema, trie, totals), args.timeout)}
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in row.items()}), flush=True)
    comp = np.array([r["compile_s"] for r in rows])
    phases = {ph: round(sum(r.get(ph, 0.0) for r in rows), 3) for ph in PHASES + ("other",)}
    summary = {"schemas": len(rows), "total_s": round(float(comp.sum()), 3),
               "p50_s": round(float(np.percentile(comp, 50)), 4),
               "p90_s": round(float(np.percentile(comp, 90)), 4),
               "max_s": round(float(comp.max()), 4),
               "status": dict(Counter(r["status"] for r in rows)), "phases_s": phases}
    print(json.dumps(summary))
    if args.out is not None:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
