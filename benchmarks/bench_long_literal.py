"""Long literals: ``dfa.regex(literal)`` and ``dfa.grammar('start: "literal"')`` for literals of
2,000 / 4,000 / 20,000 characters, on this checkout and on a reference commit, side by side.

Partition refinement used to be quadratic in a literal's length (a Hopcroft pass over every
class per split, a pass over a whole block per state of a chain in the byte DFA's refinement,
Bellman-Ford byte costs in the grammar's token tables). Each measurement runs in its own
subprocess (the reference commit's ``ctrlg`` unpacked with ``git archive`` into a temporary
folder) with a time limit, over SmolLM2's tokenizer (from the local cache) and an English-like
literal (random words of a fixed list, seed 0).

    python -m benchmarks.bench_long_literal                   # this checkout vs 8da0de5
    python -m benchmarks.bench_long_literal --ref HEAD~3 --limit 120 --out x.json

Prints one line per (version, builder, length): seconds, or the error raised, or the time
limit; writes them to ``--out`` (default benchmarks/results/bench_long_literal.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, random, sys, time
sys.path.insert(0, sys.argv[1])
from ctrlg import dfa
from ctrlg.lm.models import load_tokenizer
tok = load_tokenizer()
builder, n = sys.argv[2], int(sys.argv[3])
random.seed(0)
words = ("the cat sat on a mat while dogs barked loudly near quiet houses and people walked "
         "home slowly").split()
text = " ".join(random.choice(words) for _ in range(n))[:n]
dfa.regex("warm up", tok)
t = time.perf_counter()
try:
    if builder == "regex":
        d = dfa.regex(text, tok)
    else:
        d = dfa.grammar('start: "%s"' % text, tok)
    out = {"seconds": round(time.perf_counter() - t, 2)}
except ValueError as err:
    out = {"seconds": round(time.perf_counter() - t, 2), "error": f"{type(err).__name__}: {err}"[:160]}
print(json.dumps(out))
"""


def measure(src: Path, builder: str, n: int, limit: float) -> dict:
    try:
        run = subprocess.run([sys.executable, "-c", CHILD, str(src), builder, str(n)],
                             capture_output=True, text=True, timeout=limit,
                             env={**os.environ, "OMP_NUM_THREADS": "1",
                                  "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        return {"seconds": None, "error": f"no answer within {limit:.0f} s"}
    lines = run.stdout.strip().splitlines()
    if run.returncode or not lines:
        return {"seconds": None, "error": (run.stderr.strip().splitlines() or ["?"])[-1][:160]}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="8da0de5", help="the reference commit")
    parser.add_argument("--lengths", default="2000,4000,20000")
    parser.add_argument("--limit", type=float, default=90.0, help="seconds per measurement")
    parser.add_argument("--out", default="benchmarks/results/bench_long_literal.json")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.ref, "ctrlg"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        for version, src in ((args.ref, Path(tmp)), ("this checkout", ROOT)):
            for builder in ("regex", "grammar"):
                for n in lengths:
                    got = measure(src, builder, n, args.limit)
                    rows.append({"version": version, "builder": builder, "length": n, **got})
                    print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
