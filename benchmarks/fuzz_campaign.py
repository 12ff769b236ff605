"""Fuzz campaign: random constraints × random HMMs × random LM logits × sampling and beam search.

Each case draws, from its own seed:

* a **constraint**: a random expression over the builders (``phrase``, ``any_phrase``,
  ``starts_with``, ``exact``, ``length``, ``banned_phrases``, ``eos``, ``universal``, a random
  dense DFA, and — over a toy byte vocabulary — ``regex`` with ``encodings="all"``) combined with
  ∧ (``intersect``), ∨ (``union``), ¬ (``complement``) and concatenation, up to depth 3;
* a budget n ∈ [1, 5], ``min_new_tokens`` m ∈ [0, 2] and an EOS token (or none);
* a **random HMM** (1–4 hidden states, Dirichlet rows of random concentration, so some are
  peaked) and a mode, ``"ctrlg"`` or ``"logical"``;
* a **decoder**: (a) transformers sampling from another random HMM dressed as an LM
  (:class:`ctrlg.hmm_lm.HMMForCausalLM`) with random temperature / top-k / top-p;
  (b) transformers beam search (2–4 beams) from such an LM; (c) a hand-written sampling loop fed
  raw random logits (Gaussian, some columns −inf, sometimes padded wider than V).

New constraint kinds (grammars, JSON Schemas, ...) join with :func:`register_leaf` (and, for one
that spells text, a byte vocabulary in :data:`VOCABULARIES`); a kind that is not an automaton is
drawn only as a whole constraint and checked by enumeration through its ``accepts``.

A concatenation whose subset construction would exceed ``CONCAT_STATES`` states raises
ConstraintError (``dfa.concat(max_states=...)``); such a constraint is redrawn and counted.

The **oracle** is an independent dynamic programme over the dense transition table: the set of
DFA states after k non-EOS tokens; a generation of ≤ n tokens is accepted iff the DFA accepts its
tokens up to and including EOS if EOS ends it (README's semantics). A case is a **violation** if
an output is rejected by its DFA, if the processor calls a satisfiable constraint unsatisfiable
(or the reverse), or if any other exception escapes. Beam-search hypotheses transformers keeps
with score −inf (or its −1e9 "no hypothesis" stand-in) are not outputs of the guided distribution
and are skipped.

    nice -n 10 python -m benchmarks.fuzz_campaign --cases 10000           # the full campaign
    python -m benchmarks.fuzz_campaign --cases 200 --seed 7 --out x.json  # a quick one

Prints a summary (cases, violations, breakdown by decoder and top-level operation) and writes it
to ``--out`` (default ``benchmarks/results/fuzz_campaign.json``) with the first violations'
seeds, so any one can be replayed with ``--replay SEED``. The suite runs a small campaign
(tests/test_fuzz_campaign.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ctrlg import HMM, dfa
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError

# A toy byte vocabulary for regex constraints; the last token (no bytes) is EOS.
TOY_TOKENS = [b"a", b"b", b"c", b"ab", b"ba", b"bc", b"ca", b" ", b""]
TOY_EOS = len(TOY_TOKENS) - 1
# a concatenation whose subset construction would exceed this raises ConstraintError: redrawn
CONCAT_STATES = 5_000
REGEX_ATOMS = ["a", "b", "c", "[ab]", "[bc]", "(ab|c)", "a?", "b*", " ", "[abc]"]


# ---------------------------------------------------------------------- random constraints
def _tokens(rng, V, lo=1, hi=3):
    return [int(t) for t in rng.integers(0, V, size=int(rng.integers(lo, hi + 1)))]


def _random_regex(rng, depth=0) -> str:
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        if depth < 2 and rng.random() < 0.25:
            inner = _random_regex(rng, depth + 1)
            parts.append(f"({inner}){rng.choice(['', '*', '+', '?', '{1,2}'])}")
        else:
            parts.append(str(rng.choice(REGEX_ATOMS)))
    body = "".join(parts)
    if depth < 2 and rng.random() < 0.2:
        body = f"{body}|{_random_regex(rng, depth + 1)}"
    return body


def _random_dense(rng, V):
    S = int(rng.integers(1, 6))
    table = rng.integers(0, S, size=(S, V))
    defaults = rng.integers(0, S, size=S)
    keep = rng.random((S, V)) < 0.6
    table = np.where(keep, defaults[:, None], table)
    accepting = rng.random(S) < 0.5
    return dfa.TokenDFA.from_dense(table, accepting, int(rng.integers(0, S)))


@dataclass(frozen=True)
class LeafKind:
    """A constraint builder the campaign draws from.

    ``build(rng, V, eos)`` returns a constraint over token ids ``[0, V)``; ``vocabulary`` is None
    (any V) or the name of a byte vocabulary in :data:`VOCABULARIES` (the case then runs over
    that vocabulary, whose last token is EOS); ``weight`` is the relative frequency;
    ``needs_eos``: drawn only when the case has an EOS; ``combinable``: may appear under ∧ ∨ ¬ ·
    (False for a constraint that is not an automaton, e.g. a grammar: it is drawn only as the
    whole constraint, and the oracle then enumerates sequences through its ``accepts``)."""

    build: Callable
    vocabulary: str | None = None
    weight: int = 1
    needs_eos: bool = False
    combinable: bool = True


# byte vocabularies of the cases that compile text constraints (regex, JSON Schema, grammars)
VOCABULARIES: dict[str, list[bytes]] = {"toy": TOY_TOKENS}
LEAF_KINDS: dict[str, LeafKind] = {}


def register_leaf(name: str, build: Callable, **options) -> None:
    """Add a constraint kind to the campaign (``options``: the fields of :class:`LeafKind`).
    Kinds are drawn in registration order, so registering a new kind after the built-in ones
    leaves the draws of every earlier seed unchanged unless the new kind is drawn."""
    LEAF_KINDS[name] = LeafKind(build, **options)


def _length(rng, V, eos):
    lo = int(rng.integers(0, 4))
    hi = None if rng.random() < 0.3 else lo + int(rng.integers(0, 4))
    return dfa.length(lo, hi, vocab_size=V)


register_leaf("phrase", lambda rng, V, eos: dfa.phrase(_tokens(rng, V), V))
register_leaf("any_phrase", lambda rng, V, eos: dfa.any_phrase(
    [_tokens(rng, V) for _ in range(int(rng.integers(1, 4)))], V))
register_leaf("starts_with", lambda rng, V, eos: dfa.starts_with(
    [_tokens(rng, V) for _ in range(int(rng.integers(1, 3)))], V))
register_leaf("exact", lambda rng, V, eos: dfa.exact(_tokens(rng, V, 1, 4), V))
register_leaf("length", _length)
register_leaf("banned", lambda rng, V, eos: dfa.banned_phrases([_tokens(rng, V, 1, 2)], V))
register_leaf("dense", lambda rng, V, eos: _random_dense(rng, V))
register_leaf("universal", lambda rng, V, eos: dfa.universal(V))
register_leaf("eos", lambda rng, V, eos: dfa.eos(eos, V, required=bool(rng.random() < 0.5)),
              needs_eos=True)
register_leaf("regex", lambda rng, V, eos: _regex_leaf(rng), vocabulary="toy", weight=3)


def _regex_leaf(rng):
    pattern = _random_regex(rng)
    return f"regex:{pattern}", dfa.regex(pattern, TOY_TOKENS, eos_token_id=TOY_EOS)


def _leaf(rng, V, eos, vocabulary: str | None, top: bool):
    kinds = [name for name, kind in LEAF_KINDS.items() for _ in range(kind.weight)
             if kind.vocabulary in (None, vocabulary) and (eos is not None or not kind.needs_eos)
             and (top or kind.combinable)]
    kind = str(rng.choice(kinds))
    built = LEAF_KINDS[kind].build(rng, V, eos)
    return built if isinstance(built, tuple) else (kind, built)


def random_constraint(rng, V, eos, vocabulary: str | None, depth: int = 0):
    """``(description, top-level operation, constraint)``: a random expression of builders and
    operations (``vocabulary``: the case's byte vocabulary, None for bare token ids)."""
    if depth >= 3 or rng.random() < 0.35:
        name, leaf = _leaf(rng, V, eos, vocabulary, top=depth == 0)
        return name, "leaf", leaf
    op = str(rng.choice(["intersect", "union", "complement", "concat"]))
    if op == "complement":
        name, _, inner = random_constraint(rng, V, eos, vocabulary, depth + 1)
        return f"¬({name})", op, dfa.complement(inner, allow_empty=True)
    parts = [random_constraint(rng, V, eos, vocabulary, depth + 1)
             for _ in range(int(rng.integers(2, 4)))]
    fn = {"intersect": dfa.intersect, "union": dfa.union,
          "concat": lambda *d, **kw: dfa.concat(*d, max_states=CONCAT_STATES, **kw)}[op]
    symbol = {"intersect": " ∧ ", "union": " ∨ ", "concat": " · "}[op]
    return ("(" + symbol.join(p[0] for p in parts) + ")", op,
            fn(*(p[2] for p in parts), allow_empty=True))


# ---------------------------------------------------------------------- oracle
def accepted(constraint: dfa.TokenDFA, tokens, eos) -> bool:
    """The generation's verdict: the DFA run on the tokens up to and including the first EOS."""
    y = []
    for t in tokens:
        y.append(int(t))
        if eos is not None and t == eos:
            break
    return constraint.accepts(y)


def satisfiable(constraint: dfa.TokenDFA, n: int, m: int, eos) -> bool:
    """Whether some generation of the budget is accepted: n tokens without EOS, or k non-EOS
    tokens then EOS with m ≤ k < n (EOS is forbidden before ``min_new_tokens``). Dynamic
    programme over the dense table (the set of states after k non-EOS tokens); a constraint
    without one (not an automaton) is checked on every such sequence through ``accepts``."""
    if not hasattr(constraint, "dense"):
        return _satisfiable_by_enumeration(constraint, n, m, eos)
    table = constraint.dense()
    V = constraint.vocab_size
    plain = [v for v in range(V) if v != eos]
    states = {constraint.initial}
    for k in range(n + 1):
        if k == n:
            return any(constraint.accepting[s] for s in states)
        if eos is not None and k >= m and any(constraint.accepting[table[s, eos]] for s in states):
            return True
        states = {int(table[s, v]) for s in states for v in plain}
        if not states:
            return False
    return False


def _satisfiable_by_enumeration(constraint, n: int, m: int, eos) -> bool:
    plain = [v for v in range(constraint.vocab_size) if v != eos]
    for k in range(n + 1):
        for body in itertools.product(plain, repeat=k):
            if k == n and constraint.accepts(list(body)):
                return True
            if eos is not None and m <= k < n and constraint.accepts([*body, eos]):
                return True
    return False


# ---------------------------------------------------------------------- decoders
def random_hmm(rng, h, V) -> HMM:
    concentration = float(rng.choice([0.1, 0.3, 1.0, 3.0]))
    return HMM.from_params(rng.dirichlet([concentration] * h) + 1e-6,
                           rng.dirichlet([concentration] * h, size=h) + 1e-6,
                           rng.dirichlet([concentration] * V, size=h) + 1e-6, normalize=True)


def decode_hmm_lm(case, constraint, hmm, rng, beams: int):
    from ctrlg.hmm_lm import HMMForCausalLM
    from ctrlg.sampler import ConstraintLogitsProcessor

    V, n, m, eos = case["V"], case["n"], case["m"], case["eos"]
    lm = HMMForCausalLM.from_hmm(random_hmm(rng, int(rng.integers(1, 4)), V), prompt_length=1,
                                 eos_token_id=eos)
    rows = int(rng.integers(1, 3))
    proc = ConstraintLogitsProcessor(hmm, [constraint] * rows, prompt_length=1, max_new_tokens=n,
                                     min_new_tokens=m, eos_token_id=eos, mode=case["mode"])
    ids = torch.tensor(rng.integers(0, V, size=(rows, 1)))
    kwargs = dict(max_new_tokens=n, min_new_tokens=m, logits_processor=[proc],
                  attention_mask=torch.ones_like(ids), return_dict_in_generate=True,
                  output_scores=True, pad_token_id=eos if eos is not None else 0)
    if beams > 1:
        kwargs.update(num_beams=beams, num_return_sequences=beams, do_sample=False)
    else:
        kwargs.update(do_sample=True, num_return_sequences=int(rng.integers(1, 4)),
                      temperature=float(rng.choice([0.5, 1.0, 1.5])),
                      top_k=int(rng.choice([0, 2, 5])), top_p=float(rng.choice([1.0, 0.8])))
    torch.manual_seed(int(rng.integers(0, 2**31)))
    out = lm.generate(ids, **kwargs)
    outputs = out.sequences[:, 1:].tolist()
    if beams > 1:
        live = (out.sequences_scores > -1e8).tolist()
        outputs = [o for o, ok in zip(outputs, live) if ok]
    return outputs


def decode_random_logits(case, constraint, hmm, rng):
    from ctrlg.sampler import ConstraintLogitsProcessor

    V, n, m, eos = case["V"], case["n"], case["m"], case["eos"]
    rows = int(rng.integers(1, 5))
    width = V + (int(rng.integers(1, 4)) if rng.random() < 0.2 else 0)     # padded LM head
    proc = ConstraintLogitsProcessor(hmm, constraint, prompt_length=1, max_new_tokens=n,
                                     min_new_tokens=m, eos_token_id=eos, mode=case["mode"])
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    ids = torch.zeros(rows, 1, dtype=torch.long)
    done = torch.zeros(rows, dtype=torch.bool)
    scale = float(rng.choice([0.5, 3.0, 10.0]))
    for step in range(n):
        logits = torch.randn(rows, width, generator=g) * scale
        if rng.random() < 0.3:                       # the LM rules some tokens out
            logits[torch.rand(rows, width, generator=g) < 0.4] = -math.inf
        scores = proc(ids, logits)
        probs = torch.softmax(scores[:, :V], -1)
        # finished rows pass through unguided (possibly all −inf) and are padded with EOS anyway
        probs = torch.where(done[:, None], torch.ones_like(probs), probs)
        nxt = torch.multinomial(probs, 1, generator=g)[:, 0]
        if eos is not None:
            nxt = torch.where(done, eos, nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        if eos is not None:
            done |= nxt == eos
            if done.all():
                break
    return ids[:, 1:].tolist()


# ---------------------------------------------------------------------- one case
def run_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    vocabulary = None
    if rng.random() < 0.3:
        names = list(VOCABULARIES)
        vocabulary = names[0] if len(names) == 1 else str(rng.choice(names))
        V, eos = len(VOCABULARIES[vocabulary]), len(VOCABULARIES[vocabulary]) - 1
    else:
        V = int(rng.integers(2, 7))
        eos = int(V - 1) if rng.random() < 0.6 else None
    n = int(rng.integers(1, 6))
    case = dict(seed=seed, V=V, eos=eos, n=n, m=int(min(rng.integers(0, 3), n)),
                mode=str(rng.choice(["ctrlg", "ctrlg", "logical"])),
                decoder=str(rng.choice(["sample", "beam", "random_logits"])))
    case["op"] = "?"
    try:
        attempt = 0
        while True:   # redraw an unsatisfiable constraint once (~1 case in 6 stays unsatisfiable)
            try:
                name, case["op"], constraint = random_constraint(rng, V, eos, vocabulary)
            except ConstraintError as err:
                if "max_states" not in str(err):
                    raise
                case["redrawn_too_large"] = case.get("redrawn_too_large", 0) + 1
                continue
            expect = satisfiable(constraint, n, case["m"], eos)
            attempt += 1
            if expect or attempt == 2 or rng.random() < 0.5:
                break
        case["constraint"] = name
        case["states"] = getattr(constraint, "num_states", None)
        hmm = random_hmm(rng, int(rng.integers(1, 5)), V)
        case["satisfiable"] = expect
        try:
            if case["decoder"] == "random_logits":
                outputs = decode_random_logits(case, constraint, hmm, rng)
            else:
                beams = int(rng.integers(2, 5)) if case["decoder"] == "beam" else 1
                outputs = decode_hmm_lm(case, constraint, hmm, rng, beams)
        except UnsatisfiableConstraintError as err:
            if expect:
                return {**case, "violation": f"called unsatisfiable but is satisfiable: {err}"}
            return {**case, "violation": None, "outputs": 0}
        if not expect:
            return {**case, "violation": "unsatisfiable, but the processor accepted it"}
        if not outputs:
            return {**case, "violation": "no output"}
        bad = [o for o in outputs if not accepted(constraint, o, eos)]
        if bad:
            return {**case, "violation": f"rejected outputs {bad[:3]}"}
        return {**case, "violation": None, "outputs": len(outputs)}
    except Exception as err:                                     # noqa: BLE001 - fuzzing
        return {**case, "violation": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=6)}


def run_campaign(cases: int, seed: int = 0, progress: bool = False) -> dict:
    """Run ``cases`` cases with seeds ``seed, seed + 1, ...``; returns the summary dict."""
    start = time.perf_counter()
    violations, by_decoder, by_op, unsat = [], Counter(), Counter(), 0
    outputs = too_large = 0
    for i in range(cases):
        result = run_case(seed + i)
        by_decoder[result["decoder"]] += 1
        by_op[result["op"]] += 1
        unsat += result.get("satisfiable") is False
        outputs += result.get("outputs", 0) or 0
        too_large += result.get("redrawn_too_large", 0)
        if result["violation"]:
            violations.append(result)
        if progress and (i + 1) % 500 == 0:
            print(f"  {i + 1}/{cases} cases, {len(violations)} violations, "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return dict(cases=cases, seed=seed, violations=len(violations), outputs_checked=outputs,
                unsatisfiable_cases=unsat, constraints_redrawn_too_large=too_large,
                by_decoder=dict(by_decoder), by_top_operation=dict(by_op),
                seconds=round(time.perf_counter() - start, 1), first_violations=violations[:20])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/fuzz_campaign.json")
    parser.add_argument("--replay", type=int, default=None, help="run one case and print it")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.replay is not None:
        print(json.dumps(run_case(args.replay), indent=2, default=str))
        return 0
    summary = run_campaign(args.cases, args.seed, progress=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "first_violations"}, indent=2,
                     ensure_ascii=False))
    for v in summary["first_violations"][:5]:
        print("VIOLATION", json.dumps(v, default=str)[:600])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2, default=str, ensure_ascii=False))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
