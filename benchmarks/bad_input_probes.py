"""Bad-input probes: each input of a bad-input round run alone, in its own process, with a
time and memory bound; prints what it gives (a result, or the exception's type and message) and
how long it took.

The same probes run on an older library tree (``PYTHONPATH=<old tree>``) give a round's
"before" column, on this one its "now" column, on the same machine in the same sitting:

    python -m benchmarks.bad_input_probes --out benchmarks/results/bad_input_round5.json
    git archive <commit> ctrlg | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old:. python -m benchmarks.bad_input_probes --out /tmp/before.json

A probe is a snippet ending in an expression ``result``; ``V`` is SmolLM2's tokenizer
(``ctrlg.lm.models.load_tokenizer()``) and ``B`` a small byte vocabulary whose tokens spell
surrogates' UTF-8-like bytes. A probe past ``--timeout`` seconds is "no answer in N s"; the
child's address space is capped at ``--memory-gib`` (a ``MemoryError`` then says so).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

PRELUDE = '''
import warnings; warnings.filterwarnings("ignore")
from ctrlg import dfa
B = [b"a", b"b", b"(", b")", b"\\xed\\xa0\\x80", b"\\xed", b"\\xa0\\x80", b"\\xc3\\x89",
     b"\\xc5\\xbf", b"\\xe2\\x84\\xaa", b"\\\\", b"u", b"d", b"8", b"0", b'"', b""]
EOS = len(B) - 1
SUR, Q, BS = b"\\xed\\xa0\\x80", b'"', b"\\\\"     # U+D800's UTF-8-like bytes, a quote, a backslash
def small_hmm(h=3, V=5):
    import torch
    from ctrlg import HMM
    g = torch.Generator().manual_seed(0)
    return HMM.from_params(torch.rand(h, generator=g), torch.rand(h, h, generator=g),
                           torch.rand(h, V, generator=g), normalize=True)
def spells(c, *tokens):
    return c.accepts([B.index(t) for t in tokens] + [EOS])
'''
NEEDS_V = 'from ctrlg.lm.models import load_tokenizer\nV = load_tokenizer()\n'

# (finding, input as the issue wrote it, snippet setting ``result``, needs SmolLM2's tokenizer)
PROBES = [
    ("1 blow-up", "dfa.grammar('start: s\\ns: s s | \"a\" | ', V)  (depth auto)",
     "c = dfa.grammar('start: s\\ns: s s | \"a\" | ', V)\n"
     "result = f'compiles; accepts aaa: {c.accepts(V.encode(\"aaa\") + [V.eos_token_id])}'",
     True),
    ("1 blow-up", "dfa.grammar('start: s\\ns: s s | \"a\"', V, depth=3)",
     "c = dfa.grammar('start: s\\ns: s s | \"a\"', V, depth=3)\n"
     "result = f'compiles; accepts aaaa: {c.accepts(V.encode(\"aaaa\") + [V.eos_token_id])}'",
     True),
    ("1 recursion", "dfa.grammar('start: \"(\" start \")\" | \"b\"', V, depth=1000)",
     "c = dfa.grammar('start: \"(\" start \")\" | \"b\"', B, depth=1000, eos_token_id=EOS)\n"
     "result = f'compiles; ((b)) accepted: {spells(c, b\"(\", b\"(\", b\"b\", b\")\", b\")\")}'",
     False),
    ("1 recursion", "the same at depth=2000",
     "c = dfa.grammar('start: \"(\" start \")\" | \"b\"', B, depth=2000, eos_token_id=EOS)\n"
     "result = 'compiles'", False),
    ("2 surrogates", "dfa.regex('a\\ud800|b', ...) on the bytes a ED A0 80",
     "c = dfa.regex('a\\ud800|b', B, eos_token_id=EOS)\n"
     "result = 'accepts a+ED A0 80: ' + str(spells(c, b'a', SUR))", False),
    ("2 surrogates", "dfa.lazy_regex('a\\ud800|b', ...)",
     "c = dfa.lazy_regex('a\\ud800|b', B, eos_token_id=EOS)\n"
     "result = 'accepts a+ED A0 80: ' + str(spells(c, b'a', SUR))", False),
    ("2 surrogates", "dfa.json_schema({'enum': ['\\ud800', 'a']}) on the raw bytes \"ED A0 80\"",
     "c = dfa.json_schema({'enum': ['\\ud800', 'a']}, B, encodings='all', eos_token_id=EOS)\n"
     "result = ('raw bytes: ' + str(spells(c, Q, SUR, Q)) + '; escape: '\n"
     "          + str(spells(c, Q, BS, b'u', b'd', b'8', b'0', b'0', Q)))", False),
    ("2 surrogates", "Lark \"a\" (\"\\ud800\" | /[\\ud800-\\udfff]/ | \"b\")",
     "c = dfa.grammar('start: \"a\" (\"\\\\ud800\" | /[\\\\ud800-\\\\udfff]/ | \"b\")', B,"
     " eos_token_id=EOS)\n"
     "result = 'accepts a+ED A0 80: ' + str(spells(c, b'a', SUR))", False),
    ("2 surrogates", "Lark \"a\" (\"\\ud800\" | \"b\")",
     "c = dfa.grammar('start: \"a\" (\"\\\\ud800\" | \"b\")', B, eos_token_id=EOS)\n"
     "result = 'accepts a+ED A0 80: ' + str(spells(c, b'a', SUR))", False),
    ("2 surrogates", "dfa.regex('[\\ud800-\\udfff]', ...)",
     "c = dfa.regex('[\\ud800-\\udfff]', B, eos_token_id=EOS)\nresult = 'compiles'", False),
    ("2 group names", "dfa.regex('(?P<n>a)(?P<n>b)', ...)",
     "c = dfa.regex('(?P<n>a)(?P<n>b)', B, eos_token_id=EOS)\nresult = 'compiles'", False),
    ("3 case folding", "Lark '\"é\"i' on É, '\"s\"i' on ſ, '/k/i' on the Kelvin sign",
     "fold = {}\n"
     "for rule, token in [('\"\\u00e9\"i', b'\\xc3\\x89'), ('\"s\"i', b'\\xc5\\xbf'),"
     " ('/k/i', b'\\xe2\\x84\\xaa')]:\n"
     "    B2 = B[:-1] + [b'\\xc3\\xa9', b's', b'k', b'']\n"
     "    c = dfa.grammar('start: ' + rule, B2, eos_token_id=len(B2) - 1)\n"
     "    fold[rule] = c.accepts([B2.index(token), len(B2) - 1])\n"
     "result = ', '.join(f'{k} {\"matches\" if v else \"misses\"}' for k, v in fold.items())",
     False),
    ("8 arguments", "ConstraintLogitsProcessor(..., strength=1e308) on its first step",
     "import torch\nfrom ctrlg.sampler import ConstraintLogitsProcessor\n"
     "p = ConstraintLogitsProcessor(small_hmm(), dfa.phrase([1, 2], 5), prompt_length=1,"
     " max_new_tokens=4, eos_token_id=4, strength=1e308)\n"
     "result = str(p(torch.zeros(1, 1, dtype=torch.long), torch.randn(1, 5)))", False),
    ("8 arguments", "HMM.sample(2, 3, seed=2**70)",
     "result = str(small_hmm().sample(2, 3, seed=2**70).shape)", False),
    ("8 arguments", "LazyTokenDFA.mask(10**6), .step(10**6, t), .mask(-1)",
     "d = dfa.lazy_regex('(ab)+', [b'a', b'b', b'ab', b''], eos_token_id=3)\n"
     "out = []\n"
     "for q in (lambda: d.mask(10**6), lambda: d.step(10**6, 0), lambda: d.mask(-1)):\n"
     "    try:\n        out.append('returns ' + str(q())[:30])\n"
     "    except Exception as e:\n        out.append(type(e).__name__)\n"
     "result = '; '.join(out)", False),
]


def _limit(memory_gib: float):
    def apply():
        cap = int(memory_gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return apply


def run_probe(snippet: str, needs_v: bool, timeout: float, memory_gib: float) -> dict:
    """Run one snippet in a child process; its outcome, seconds and peak resident memory."""
    code = PRELUDE + (NEEDS_V if needs_v else "") + (
        "import time as _t, json as _j, resource as _r\n_s = _t.perf_counter()\n"
        "try:\n" + "".join("    " + line + "\n" for line in snippet.splitlines()) +
        "    _out = 'gives: ' + str(result)\n"
        "except BaseException as _e:\n"
        "    _out = f'{type(_e).__name__}: {str(_e).splitlines()[0] if str(_e) else \"\"}'\n"
        "print(_j.dumps(dict(outcome=_out[:300], seconds=round(_t.perf_counter() - _s, 3),"
        " peak_mib=_r.getrusage(_r.RUSAGE_SELF).ru_maxrss // 1024)))\n")
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limit(memory_gib),
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        return dict(outcome=f"no answer in {timeout:g} s", seconds=None, peak_mib=None)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["(nothing)"])[-1]
        return dict(outcome=f"process ended ({done.returncode}): {tail[:250]}",
                    seconds=round(time.perf_counter() - start, 3), peak_mib=None)
    row = json.loads(lines[-1])
    # an error message may quote a lone surrogate: written as its escape, not as the character
    row["outcome"] = row["outcome"].encode("utf-8", "backslashreplace").decode("utf-8")
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--memory-gib", type=float, default=4.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import ctrlg
    rows = []
    for finding, text, snippet, needs_v in PROBES:
        row = dict(finding=finding, input=text,
                   **run_probe(snippet, needs_v, args.timeout, args.memory_gib))
        rows.append(row)
        print(f"{finding:16s} | {text[:60]:60s} | {row['outcome'][:110]} | {row['seconds']} s",
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(library=str(Path(ctrlg.__file__).parent),
                                                  timeout=args.timeout,
                                                  memory_gib=args.memory_gib, probes=rows),
                                             indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
