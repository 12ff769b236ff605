"""Recursive JSON Schemas: which compile to a lazy automaton, how, and how fast.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_recursive_schemas --data /path/to/jsonschemabench/data \\
        [--sample-of benchmarks/results/bench_jsonschemabench_2049.json] [--timeout 20]
        [--out benchmarks/results/bench_recursive_schemas.json]

Compiles every schema of an earlier JSONSchemaBench run's sample (``--sample-of``) with
:func:`ctrlg.dfa.lazy_json_schema` in one process, as a serving process does (a schema stopped
after ``--timeout`` seconds by an alarm). A schema is *recursive* when the compile announces a
recursive ``$ref`` (unrolled as a regex, or nested on demand:
:mod:`ctrlg.dfa.json_schema.lazy`) or refuses one. Writes per-schema rows and prints, over the
recursive schemas: how many compiled to a :class:`~ctrlg.dfa.lazy.LazyTokenDFA`, by which route,
and their compile time p50 / p90 (timeouts and refusals left out and listed).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
ROUTES = ("unrolled", "on demand")     # as lazy_json_schema's warning words them


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout


def compile_one(schema, trie, timeout: float) -> dict:
    """``lazy_json_schema(schema)`` timed: status, automaton kind, seconds, and the route of a
    recursive ``$ref`` (None when none was announced)."""
    from ctrlg import dfa

    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    status, kind = "ok", None
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            kind = type(dfa.lazy_json_schema(schema, trie)).__name__
        except _Timeout:
            status = "timeout"
        except Exception as e:            # a refusal: the library's error, named
            status = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.perf_counter() - t0
    said = [str(w.message) for w in caught if "recursive '$ref'" in str(w.message)]
    route = next((r for r in ROUTES if any(r in m for m in said)), None)
    recursive = route is not None or "recursive" in status or "expands to about" in status
    return {"status": status, "kind": kind, "s": seconds, "recursive": recursive, "route": route}


def summarise(rows: list[dict]) -> dict:
    rec = [r for r in rows if r["recursive"]]
    lazy = [r for r in rec if r["status"] == "ok" and r["kind"] == "LazyTokenDFA"]

    def pct(values):
        values = sorted(values)
        return {"p50_ms": 1e3 * statistics.median(values),
                "p90_ms": 1e3 * values[int(0.9 * len(values))]} if values else {}
    return {"schemas": len(rows), "recursive": len(rec), "lazy": len(lazy),
            "compile": pct([r["s"] for r in lazy]),
            "by_route": {route: {"n": sum(r["route"] == route for r in lazy),
                                 **pct([r["s"] for r in lazy if r["route"] == route])}
                         for route in ROUTES},
            "not_lazy": [{"file": r["file"], "status": r["status"], "kind": r["kind"]}
                         for r in rec if r not in lazy]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="jsonschemabench's data/ folder")
    p.add_argument("--sample-of", type=Path, default=RESULTS / "bench_jsonschemabench_2049.json")
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--out", type=Path, default=RESULTS / "bench_recursive_schemas.json")
    args = p.parse_args(argv)

    from ctrlg import dfa
    from ctrlg.dfa.vocab_trie import vocab_trie
    from ctrlg.lm.models import load_tokenizer

    trie = vocab_trie(load_tokenizer())
    dfa.lazy_json_schema({"type": "object"}, trie)            # numba caches, token index
    rows, start = [], time.perf_counter()
    for row in json.loads(args.sample_of.read_text())["rows"]:
        try:
            schema = json.loads((args.data / row["category"] / row["file"]).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        rows.append({"category": row["category"], "file": row["file"],
                     **compile_one(schema, trie, args.timeout)})
    summary = summarise(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python -m benchmarks.bench_recursive_schemas "
                                               f"--timeout {args.timeout}",
                                    "wall_s": time.perf_counter() - start, "summary": summary,
                                    "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
