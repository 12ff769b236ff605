"""Fuzz campaign: random constraints × random HMMs × random LM logits × sampling and beam search.

Each case draws, from its own seed:

* a **constraint**: a random expression over the builders (``phrase``, ``any_phrase``,
  ``starts_with``, ``exact``, ``length``, ``banned_phrases``, ``eos``, ``universal``, a random
  dense DFA, and — over a toy byte vocabulary — ``regex`` with ``encodings="all"``) combined with
  ∧ (``intersect``), ∨ (``union``), ¬ (``complement``) and concatenation, up to depth 3; over
  their own byte vocabularies (multi-byte tokens across terminal boundaries), random small Lark
  grammars (``dfa.grammar``, arithmetic / list templates and random rules with ``?rule``,
  ``* + ? [ ]``, alternatives, recursion, ``%ignore``; the whole constraint) and random JSON
  Schemas of common keywords (``dfa.json_schema``, a TokenDFA, so also under ∧ ∨ ¬ ·);
* **soundness edges** over a byte vocabulary of their own (each the whole constraint, checked
  by its reference): regexes of escapes, octal escapes, brace quantifiers (well-formed,
  malformed, huge) and anchors against ``re.fullmatch``; Lark grammars with anchored terminals,
  flags, ``%ignore /x$/``, repetition counts and a missing ``%import`` against lark; GBNF
  literals and classes with surrogates, escapes beyond U+10FFFF and counts against the
  equivalent ``re`` pattern; number schemas at the extremes of floating point (``1e400``,
  ``NaN``, ``5e-324`` as JSON text, bounds, ``multipleOf``, ``const``/``enum``, ``{"$ref":
  "#"}``) against jsonschema. A clear refusal (a ``CtrlgError``) is counted per kind
  (``edge_refusals``) and redrawn; any other exception is a violation;
* **round-5 edges** over a vocabulary of non-ASCII letters and surrogate bytes: regexes, Lark
  grammars and JSON Schemas holding surrogates as characters, Unicode case-insensitive matching
  (``"é"i``, ``/k/i`` against ``É``, the Kelvin sign, ``ſ``) and grammars with empty
  alternatives and ambiguous recursion (``s: s s | X |``), each also compared with its
  reference both ways on enumerated strings (ASCII-only folding rejects what lark accepts);
* a budget n ∈ [1, 5], ``min_new_tokens`` m ∈ [0, 2] and an EOS token (or none);
* a **random HMM** (1–4 hidden states, Dirichlet rows of random concentration, so some are
  peaked) and a mode, ``"ctrlg"`` or ``"logical"``;
* a **decoder**: (a) transformers sampling from another random HMM dressed as an LM
  (:class:`ctrlg.lm.hmm_lm.HMMForCausalLM`) with random temperature / top-k / top-p;
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
an output is rejected by its DFA — or, when the whole constraint is a grammar or a JSON
Schema, by that kind's own oracle on the bytes it spells: ``lark``'s Earley parser
(``dynamic_complete`` lexer), ``json.loads`` + ``jsonschema.validate`` — if the processor calls
a satisfiable constraint unsatisfiable (or the reverse), or if any other exception escapes.
Beam-search hypotheses transformers keeps with score −inf (or its −1e9 "no hypothesis"
stand-in) are not outputs of the guided distribution and are skipped. For a grammar, the
satisfiability verdict is checked by enumerating the budget's token sequences through the
constraint's ``accepts``, leaving out those its ``prefix_viable`` says cannot be completed.

    nice -n 10 python -m benchmarks.fuzz_campaign --cases 10000           # the full campaign
    python -m benchmarks.fuzz_campaign --cases 200 --seed 7 --out x.json  # a quick one
    python -m benchmarks.fuzz_campaign --cases 5000 --seed 5000 --out b.json  # a shard ...
    python -m benchmarks.fuzz_campaign --merge a.json b.json                 # ... merged
    python -m benchmarks.fuzz_campaign --vocabulary round5 --case-timeout 30  # one vocabulary's
                                              # kinds only, each case killed after 30 s

Prints a summary (cases, violations, breakdown by decoder and top-level operation) and writes it
to ``--out`` (default ``benchmarks/results/fuzz_campaign.json``) with the first violations'
seeds, so any one can be replayed with ``--replay SEED``. The suite runs a small campaign
(tests/test_fuzz_campaign.py).
"""

from __future__ import annotations

import argparse
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
# A share VOCABULARY_CASES of all cases runs over a byte vocabulary. Every vocabulary after the
# first takes its ``share`` of all cases off the top of that range (default DEFAULT_SHARE), the
# first keeps the rest: the same uniform draw picks both, so a case over the first vocabulary
# draws exactly as before later vocabularies were added. Further options of a vocabulary (none
# changes a case over another one): ``max_new_tokens`` (the largest budget n drawn, default
# 5) and ``top_leaf`` (the probability that the whole constraint is one leaf, default 0.35).
VOCABULARY_CASES = 0.3
DEFAULT_SHARE = 0.05
VOCABULARY_OPTIONS: dict[str, dict] = {}
LEAF_KINDS: dict[str, LeafKind] = {}


def pick_vocabulary(r: float) -> str | None:
    """The case's byte vocabulary for its uniform draw ``r`` (None: bare token ids)."""
    if r >= VOCABULARY_CASES:
        return None
    names, hi = list(VOCABULARIES), VOCABULARY_CASES
    for name in reversed(names[1:]):
        hi -= VOCABULARY_OPTIONS.get(name, {}).get("share", DEFAULT_SHARE)
        if r >= hi:
            return name
    return names[0]


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


# ---------------------------------------------------------------------- grammars
# A byte vocabulary for grammars: single bytes and multi-byte tokens ("(1", ", ", "1)", "ab",
# "+1") whose boundaries fall inside or across terminals; the last token (no bytes) is EOS.
GRAMMAR_TOKENS = [b"1", b"2", b"+", b"*", b"(", b")", b" ", b",", b"[", b"]", b"a", b"b",
                  b"(1", b", ", b"1)", b"ab", b"+1", b""]
# literals the random grammars' rules are made of (each spelled by the vocabulary)
GRAMMAR_LITERALS = ["a", "b", "1", "2", "+", "*", "ab", "(", ")", "[", "]", ",", "12", "a1"]
GRAMMAR_REGEXES = ["/[12]+/", "/a|b/", "/(ab)+/", "/[ab]1?/", "/1[+*]2/"]


def _grammar_arithmetic(rng) -> str:
    number = str(rng.choice(['/[12]+/', '"1" | "2" | "12"', '/[12]/']))
    add, mul = (str(x) for x in rng.permutation(["+", "*"]))
    return "\n".join([
        "?start: sum",
        f'?sum: product | sum "{add}" product',
        f'?product: atom | product "{mul}" atom' if rng.random() < 0.7 else "?product: atom",
        '?atom: NUMBER | "(" sum ")"' + (' | "[" sum "]"' if rng.random() < 0.3 else ""),
        f"NUMBER: {number}"])


def _grammar_list(rng) -> str:
    open_, close = ("[", "]") if rng.random() < 0.6 else ("(", ")")
    body = '[item ("," item)*]' if rng.random() < 0.6 else 'item ("," item)*'
    atom = str(rng.choice(['"a" | "b"', "/a|b/", '"ab" | "1"', "/[12]+/"]))
    return "\n".join([
        "start: list",
        f'list: "{open_}" {body} "{close}"',
        "?item: list | ATOM" + (' | ATOM "+" ATOM' if rng.random() < 0.3 else ""),
        f"ATOM: {atom}"])


def _grammar_symbol(rng, refs: list[str]) -> str:
    """One item of a random rule: a literal, a regex terminal or a reference, maybe repeated."""
    r = rng.random()
    if refs and r < 0.3:
        item = str(rng.choice(refs))
    elif r < 0.45:
        item = "REG" + str(int(rng.integers(0, len(GRAMMAR_REGEXES))))
    else:
        item = f'"{rng.choice(GRAMMAR_LITERALS)}"'
    r = rng.random()
    if r < 0.12:
        return f"{item}*"
    if r < 0.24:
        return f"{item}+"
    if r < 0.34:
        return f"{item}?"
    if r < 0.42:
        return f"[{item}]"
    if r < 0.5:
        return f'({item} | "{rng.choice(GRAMMAR_LITERALS)}")'
    return item


def _grammar_random(rng) -> str:
    """Rules start, x, y (some inlined with ``?``): each has 1–3 alternatives; the first one
    only refers to later rules (y's: to none), so every rule derives a sentence; the others may
    refer to any rule, after a literal (no cycle of unit rules), nesting recursively."""
    names = ["start", "x", "y"]
    lines, used = [], set()
    for i, name in enumerate(names):
        alts = []
        for a in range(int(rng.integers(1, 4))):
            refs = names[i + 1:] if a == 0 else names
            items = [f'"{rng.choice(GRAMMAR_LITERALS)}"'] if a > 0 else []
            items += [_grammar_symbol(rng, refs) for _ in range(int(rng.integers(1, 4)))]
            if a == 0 and all(it[-1] in "*?]" for it in items):
                items.append(f'"{rng.choice(GRAMMAR_LITERALS)}"')   # a nonempty sentence
            alts.append(" ".join(items))
        inline = "?" if name != "start" and rng.random() < 0.5 else ""
        lines.append(f"{inline}{name}: " + " | ".join(alts))
    text = "\n".join(lines)
    for j, pattern in enumerate(GRAMMAR_REGEXES):
        if f"REG{j}" in text:
            lines.append(f"REG{j}: {pattern}")
    return "\n".join(lines)


def random_grammar(rng) -> tuple[str, str]:
    """``(template, Lark text)``: a random small grammar over GRAMMAR_TOKENS' bytes (redrawn
    while Lark refuses it, e.g. for two optionals expanding to the same rule)."""
    from lark import Lark
    from lark.exceptions import GrammarError

    while True:
        template = str(rng.choice(["arithmetic", "list", "random", "random"]))
        text = {"arithmetic": _grammar_arithmetic, "list": _grammar_list,
                "random": _grammar_random}[template](rng)
        if rng.random() < 0.4:
            text += '\n%ignore " "'
        try:
            Lark(text, parser="earley", lexer="dynamic_complete")
        except GrammarError:
            continue
        return template, text + "\n"


def _accepts_if_no_error(judge, errors):
    """A checker of generated bytes: valid iff they decode as UTF-8 and ``judge(text)`` raises
    none of ``errors``."""
    def check(data: bytes) -> bool:
        try:
            judge(data.decode("utf-8"))
        except (UnicodeDecodeError, *errors):
            return False
        return True
    return check


def _grammar_leaf(rng):
    from lark import Lark
    from lark.exceptions import LarkError

    template, text = random_grammar(rng)
    depth = rng.choice([1, 2, 3, "auto"])
    constraint = dfa.grammar(text, GRAMMAR_TOKENS, eos_token_id=len(GRAMMAR_TOKENS) - 1,
                             depth=depth if depth == "auto" else int(depth))
    parser = Lark(text, parser="earley", lexer="dynamic_complete")

    check = _accepts_if_no_error(parser.parse, (LarkError, UnicodeDecodeError))
    return f"grammar:{template}:{text!r}", constraint, check


VOCABULARIES["grammar"] = GRAMMAR_TOKENS
VOCABULARY_OPTIONS["grammar"] = dict(share=0.06, max_new_tokens=6, top_leaf=0.85)
register_leaf("grammar", lambda rng, V, eos: _grammar_leaf(rng), vocabulary="grammar",
              weight=40, needs_eos=True, combinable=False)


# ---------------------------------------------------------------------- JSON Schemas
# A byte vocabulary for JSON: structure, digits, letters, literals and tokens across the
# boundaries of JSON tokens ('{"', '":', '",', '1,'); the last token (no bytes) is EOS.
JSON_TOKENS = [b"{", b"}", b"[", b"]", b'"', b":", b",", b" ", b"0", b"1", b"2", b"5", b"9",
               b"-", b".", b"a", b"b", b"true", b"false", b"null", b'{"', b'":', b'",', b"1,",
               b"ab", b""]
JSON_KEYS = ["a", "b", "ab", "ba"]
JSON_SCALARS = [0, 1, -2, 12, 1.5, "a", "ab", "", True, False, None]


def random_schema(rng, depth: int = 0) -> dict:
    """A random small JSON Schema of common keywords (nesting ≤ 2)."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "types"]
    if depth < 2:
        kinds += ["array", "object", "object", "anyOf"]
    kind = str(rng.choice(kinds))
    if kind == "string":
        schema: dict = {"type": "string"}
        if rng.random() < 0.5:
            schema["minLength"] = int(rng.integers(0, 3))
        if rng.random() < 0.5:
            schema["maxLength"] = schema.get("minLength", 0) + int(rng.integers(0, 3))
        return schema
    if kind in ("integer", "number"):
        schema = {"type": kind}
        if rng.random() < 0.6:
            schema["minimum"] = int(rng.integers(-3, 6))
        if rng.random() < 0.6:
            schema["maximum"] = schema.get("minimum", -3) + int(rng.integers(0, 30))
        return schema
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        picks = rng.choice(len(JSON_SCALARS), size=int(rng.integers(1, 4)), replace=False)
        return {"enum": [JSON_SCALARS[int(i)] for i in picks]}
    if kind == "const":
        return {"const": JSON_SCALARS[int(rng.integers(0, len(JSON_SCALARS)))]}
    if kind == "types":
        picks = rng.choice(["integer", "string", "null", "boolean"], size=2, replace=False)
        return {"type": [str(t) for t in picks]}
    if kind == "array":
        schema = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.5:
            schema["minItems"] = int(rng.integers(0, 3))
        if rng.random() < 0.5:
            schema["maxItems"] = schema.get("minItems", 0) + int(rng.integers(0, 3))
        return schema
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(int(rng.integers(2, 4)))]}
    keys = [str(k) for k in rng.choice(JSON_KEYS, size=int(rng.integers(1, 4)), replace=False)]
    schema = {"type": "object", "properties": {k: random_schema(rng, depth + 1) for k in keys}}
    required = [k for k in keys if rng.random() < 0.5]
    if required:
        schema["required"] = required
    return schema


def _json_schema_leaf(rng):
    import jsonschema

    schema = random_schema(rng)
    constraint = dfa.json_schema(schema, JSON_TOKENS, encodings="all",
                                 eos_token_id=len(JSON_TOKENS) - 1)

    check = _accepts_if_no_error(lambda text: jsonschema.validate(json.loads(text), schema),
                                 (ValueError, jsonschema.ValidationError))
    return f"json_schema:{json.dumps(schema)}", constraint, check


VOCABULARIES["json"] = JSON_TOKENS
VOCABULARY_OPTIONS["json"] = dict(share=0.06, max_new_tokens=12, top_leaf=0.7)
register_leaf("json_schema", lambda rng, V, eos: _json_schema_leaf(rng), vocabulary="json",
              weight=40)


# ---------------------------------------------------------------------- soundness edges
# Generators of the inputs at the edges of each reference (issue "Bad input, round 4"): regex
# escapes, octal escapes, brace quantifiers (well-formed, malformed: literal text, huge counts)
# and anchors against Python's ``re``; Lark anchors, flags and repetition counts against
# ``lark``; GBNF escapes, surrogates and counts against the equivalent ``re`` pattern; JSON
# Schema numbers at the extremes of floating point against ``jsonschema``. A draw that ctrlg
# refuses with a clear error (a ``CtrlgError``, a ValueError) is counted in
# ``EDGE_REFUSALS[kind]`` and redrawn; any other exception is a violation.
EDGE_REFUSALS: Counter = Counter()
EDGE_TOKENS = [b"a", b"b", b"A", b"1", b"2", b"\n", b"\x00", b"\x01", b"{", b"}", b",", b"a{",
               b",}", b"ab", b"\xc3\xa9", b"\xc3", b"\xa9", b"x", b""]
EDGE_ATOMS = ["a", "b", "A", "1", ".", "[ab]", "[^a]", r"\d", r"\w", r"\s", r"\101", r"\0",
              r"\01", r"\001", r"\x41", r"\u00e9", r"\n", r"[\1]", r"[\101b]", r"\{", "{", "}",
              ",", "é", "(a|b)", "(?:ab)", r"\1", r"\8", r"\400", "(?<n>a)", "(?P<n>a)"]
EDGE_QUANTS = ["", "", "*", "+", "?", "{,}", "{,2}", "{2,}", "{1,2}", "{}", "{,", "{2}", "*?",
               "{,}?", "{a}", "{0,300}", "{250,}", "{1001}", "*+", "{2,1}"]


def _edge_regex(rng) -> str:
    parts = [str(rng.choice(EDGE_ATOMS)) + str(rng.choice(EDGE_QUANTS))
             for _ in range(int(rng.integers(1, 4)))]
    body = "".join(parts)
    if rng.random() < 0.2:
        body = f"{body}|{rng.choice(EDGE_ATOMS)}"
    return str(rng.choice(["", "", "^", r"\A"])) + body + str(rng.choice(["", "", "$", r"\Z"]))


def _refusing(kind: str, draw):
    """Call ``draw()`` until it builds; count the clear refusals (CtrlgError) of ``kind``."""
    from ctrlg.errors import CtrlgError

    while True:
        try:
            return draw()
        except CtrlgError:
            EDGE_REFUSALS[kind] += 1


def _regex_edge_leaf(rng):
    import re

    def draw():
        pattern = _edge_regex(rng)
        constraint = dfa.regex(pattern, EDGE_TOKENS, eos_token_id=len(EDGE_TOKENS) - 1)
        compiled = re.compile(pattern)        # ctrlg accepted it: re must too
        return f"regex_edge:{pattern}", constraint, _accepts_if_no_error(
            lambda text: None if compiled.fullmatch(text) else (_ for _ in ()).throw(
                ValueError(text)), (ValueError,))
    return _refusing("regex_edge", draw)


EDGE_LARK_TERMINALS = ["/a$/", "/^a/", r"/a\Z/", r"/\Aa/", "/^b$/", "/a|b$/", "/^a|b/", "/a+$/",
                       "/[ab]$/", "/b/", '"a"', '"b"', '"\\n"', "/a/i", "/a/l", "/a$b/",
                       "/(a$)*/", "/1/"]


def _edge_lark(rng) -> str:
    items = [str(rng.choice(EDGE_LARK_TERMINALS)) for _ in range(int(rng.integers(1, 4)))]
    items = [f"{x}{rng.choice(['', '', '*', '+', '?', ' ~ 2', ' ~ 0..3', ' ~ 50000'])}"
             for x in items]
    text = "start: " + " ".join(items)
    if rng.random() < 0.3:
        text += " | " + str(rng.choice(EDGE_LARK_TERMINALS))
    if rng.random() < 0.3:
        text += "\n%ignore " + str(rng.choice(['"x"', "/x$/", "/^x/", r"/x\Z/"]))
    if rng.random() < 0.05:
        text += "\n%import nosuchmod.X"
    return text + "\n"


def _grammar_edge_leaf(rng):
    from lark import Lark
    from lark.exceptions import LarkError

    def draw():
        text = _edge_lark(rng)
        constraint = dfa.grammar(text, EDGE_TOKENS, eos_token_id=len(EDGE_TOKENS) - 1)
        parser = Lark(text, parser="earley", lexer="dynamic_complete")
        return f"grammar_edge:{text!r}", constraint, _accepts_if_no_error(
            parser.parse, (LarkError, UnicodeDecodeError))
    return _refusing("grammar_edge", draw)


# GBNF items with their Python re equivalents
EDGE_GBNF = [('"a"', "a"), ('"\\x41"', "A"), ('"\\u00e9"', "é"), ('"\\U0001F600"', "\U0001F600"),
             ('"\\ud800"', None), ('"\\U00110000"', None), ("[ab]", "[ab]"),
             ("[^a]", "[^a]"), ("[\\ud800-\\udfff]", None), ("[\\x00-\\x01]", "[\\x00-\\x01]"),
             ('"\\n"', "\\n"), ('"{"', "\\{"), (".", "(?s:.)")]
EDGE_GBNF_COUNTS = [("", ""), ("*", "*"), ("?", "?"), ("{2}", "{2}"), ("{0,3}", "{0,3}"),
                    ("{1,}", "{1,}"), ("{,2}", "{0,2}"), ("{20000}", None)]


def _gbnf_edge_leaf(rng):
    import re

    def draw():
        items, regex = [], []
        for _ in range(int(rng.integers(1, 4))):
            g, r = EDGE_GBNF[int(rng.integers(0, len(EDGE_GBNF)))]
            cg, cr = EDGE_GBNF_COUNTS[int(rng.integers(0, len(EDGE_GBNF_COUNTS)))]
            items.append(g + cg)
            regex.append(None if r is None or cr is None else f"(?:{r}){cr}")
        text = "root ::= " + " ".join(items)
        constraint = dfa.grammar(text, EDGE_TOKENS, syntax="gbnf",
                                 eos_token_id=len(EDGE_TOKENS) - 1)
        if any(r is None for r in regex):
            raise AssertionError(f"ctrlg accepted the GBNF {text!r}, which it must refuse")
        compiled = re.compile("".join(regex))
        return f"gbnf_edge:{text!r}", constraint, _accepts_if_no_error(
            lambda t: None if compiled.fullmatch(t) else (_ for _ in ()).throw(ValueError(t)),
            (ValueError,))
    return _refusing("gbnf_edge", draw)


EDGE_NUMBERS = ["1e400", "-1e400", "1e308", "-1e308", "1.7976931348623157e308", "5e-324",
                "1e-400", "0.5", "-0.0", "2", "0", "-3", "1.5", "NaN", "Infinity"]


def _edge_schema(rng) -> str:
    """JSON text of a number schema with keywords at the extremes (parsed by json.loads, so
    1e400 overflows to inf and NaN / Infinity parse as Python does)."""
    keys = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]
    parts = [f'"type": "{rng.choice(["integer", "number"])}"']
    for key in keys:
        if rng.random() < 0.35:
            parts.append(f'"{key}": {rng.choice(EDGE_NUMBERS)}')
    if rng.random() < 0.15:
        parts = [f'"const": {rng.choice(EDGE_NUMBERS)}']
    if rng.random() < 0.1:
        parts = [f'"enum": [{rng.choice(EDGE_NUMBERS)}, {rng.choice(EDGE_NUMBERS)}]']
    if rng.random() < 0.05:
        parts = ['"$ref": "#"']
    return "{" + ", ".join(parts) + "}"


def _json_edge_leaf(rng):
    import jsonschema

    def draw():
        text = _edge_schema(rng)
        schema = json.loads(text)
        constraint = dfa.json_schema(schema, JSON_TOKENS, encodings="all",
                                     eos_token_id=len(JSON_TOKENS) - 1)
        check = _accepts_if_no_error(lambda t: jsonschema.validate(json.loads(t), schema),
                                     (ValueError, jsonschema.ValidationError))
        return f"json_edge:{text}", constraint, check
    return _refusing("json_edge", draw)


VOCABULARIES["edge"] = EDGE_TOKENS
VOCABULARY_OPTIONS["edge"] = dict(share=0.04, max_new_tokens=5, top_leaf=1.0)
register_leaf("regex_edge", lambda rng, V, eos: _regex_edge_leaf(rng), vocabulary="edge",
              weight=4, needs_eos=True, combinable=False)
register_leaf("grammar_edge", lambda rng, V, eos: _grammar_edge_leaf(rng), vocabulary="edge",
              weight=4, needs_eos=True, combinable=False)
register_leaf("gbnf_edge", lambda rng, V, eos: _gbnf_edge_leaf(rng), vocabulary="edge",
              weight=2, needs_eos=True, combinable=False)
register_leaf("json_edge", lambda rng, V, eos: _json_edge_leaf(rng), vocabulary="json",
              weight=8, combinable=False)



# ---------------------------------------------------------------------- round-5 edges
# What the fifth bad-input round found, as generators: code points U+D800-U+DFFF written as
# characters (not escapes) in regexes, Lark literals and regexps, JSON Schema enum / const /
# property names and patterns; Unicode case-insensitive matching (Lark's "..."i and /.../i,
# re's (?i:...)) over a non-ASCII alphabet whose letters fold across scripts (é/É, s/S/ſ,
# k/K/Kelvin sign); grammars with empty alternatives and ambiguous recursion (s: s s | X | ).
# Besides the campaign's soundness check on decoded outputs, each draw is compared with its
# reference on enumerated token strings (every string of <= 2 tokens, and R5_SAMPLED longer
# ones): accepting a string the reference rejects, or rejecting one it accepts (ASCII-only
# case folding), is a violation. Surrogates' UTF-8-like bytes (ED A0 80) are tokens here, so a
# path that accepts them is caught by both checks.
R5_TOKENS = [b"a", b"s", b"S", b"k", b"K", b"\xc3\xa9", b"\xc3\x89", b"\xc5\xbf",
             b"\xe2\x84\xaa", b"\xed\xa0\x80", b"\xed", b"\xa0\x80", b"(", b")", b'"',
             b"\\ud800", b"\\", b"ud800", b"{", b"}", b":", b"1", b""]
R5_SAMPLED = 300
R5_FOLDING = ["é", "É", "s", "S", "ſ", "k", "K", "\u212a", "a", "ks", "éS"]
R5_SURROGATES = ["\ud800", "\udc00", "\udfff", "a\ud800"]
# Lark reads the escapes of its literals and regexps into the surrogates themselves (a grammar
# text holding the characters cannot be loaded: not encodable)
R5_LARK_SURROGATES = ["\\ud800", "\\udc00", "a\\udfff"]


def _r5_compare(rng, constraint, check, eos, what: str, full: int = 2,
                exact: bool = True) -> None:
    """Raise AssertionError when ``constraint`` and the reference ``check`` disagree on an
    enumerated string (all of <= ``full`` tokens, then R5_SAMPLED of ``full`` + 1 or + 2
    tokens), each ended by EOS. ``exact=False``: only a string ctrlg accepts and the reference
    rejects counts (JSON Schema strings are a documented subset: no ``\\uXXXX`` escapes)."""
    plain = [v for v in range(len(R5_TOKENS)) if v != eos]
    seqs, layer = [()], [()]
    for _ in range(full):
        layer = [(*seq, v) for seq in layer for v in plain]
        seqs += layer
    seqs += [tuple(int(t) for t in rng.choice(plain, size=int(rng.integers(full + 1, full + 3))))
             for _ in range(R5_SAMPLED)]
    for seq in seqs:
        ours = constraint.accepts([*seq, eos])
        theirs = check(spelled(R5_TOKENS, seq, eos))
        if ours != theirs and (exact or ours):
            raise AssertionError(f"{what}: ctrlg {'accepts' if ours else 'rejects'} "
                                 f"{spelled(R5_TOKENS, seq, eos)!r}, its reference does not")


def _r5_regex(rng) -> str:
    atoms = ["a", "é", "s", "k", "[é-ê]", "(?i:é)", "(?i:s)", "(?i:k)", "(?i:ks)", "[a\ud800]",
             "[\ud7ff-\ue000]", "[^a]", "."] + R5_SURROGATES + ["[\ud800-\udfff]",
                                                                "(?P<n>a)(?P<n>s)"]
    quants = ["", "", "", "?", "*", "{0,2}"]
    parts = [str(rng.choice(atoms)) + str(rng.choice(quants))
             for _ in range(int(rng.integers(1, 4)))]
    body = "".join(parts)
    return f"{body}|{rng.choice(atoms)}" if rng.random() < 0.2 else body


def _r5_regex_leaf(rng):
    import re

    def draw():
        pattern = _r5_regex(rng)
        eos = len(R5_TOKENS) - 1
        constraint = dfa.regex(pattern, R5_TOKENS, eos_token_id=eos)
        compiled = re.compile(pattern)        # ctrlg accepted it: re must too
        check = _accepts_if_no_error(
            lambda text: None if compiled.fullmatch(text) else (_ for _ in ()).throw(
                ValueError(text)), (ValueError,))
        _r5_compare(rng, constraint, check, eos, f"regex {pattern!r}", full=3)
        return f"round5_regex:{pattern!r}", constraint, check
    return _refusing("round5_regex", draw)


def _r5_lark(rng) -> str:
    def terminal():
        text = str(rng.choice(R5_FOLDING + R5_LARK_SURROGATES))
        if rng.random() < 0.5:
            flag = "i" if rng.random() < 0.8 else ""
            return f'"{text}"{flag}'
        first = text[:6] if text.startswith("\\") else text[0]
        body = str(rng.choice([text, f"[{first}a]", f"{text}+", f"(?:{text}|a)"]))
        return f"/{body}/" + ("i" if rng.random() < 0.8 else "")
    x, y = terminal(), terminal()
    rules = [f"s: s s | {x} | ", f"s: s s | {x}", f"s: {x} s | s {y} | ",
             f's: "(" s ")" s | ', f"s: s {x} s | {y}", f"s: {x} | {y} | {x} {y}",
             f"s: {x}? {y}*"]
    return "start: s\n" + str(rng.choice(rules)) + "\n"


def _r5_lark_leaf(rng):
    from lark import Lark
    from lark.exceptions import LarkError

    def draw():
        text = _r5_lark(rng)
        eos = len(R5_TOKENS) - 1
        constraint = dfa.grammar(text, R5_TOKENS, eos_token_id=eos)
        parser = Lark(text, parser="earley", lexer="dynamic_complete")
        check = _accepts_if_no_error(parser.parse, (LarkError, UnicodeDecodeError))
        _r5_compare(rng, constraint, check, eos, f"grammar {text!r}")
        return f"round5_grammar:{text!r}", constraint, check
    return _refusing("round5_grammar", draw)


def _r5_schema(rng) -> dict:
    name = str(rng.choice(R5_SURROGATES + ["a", "é"]))
    return dict(enumerate([
        {"enum": [name, str(rng.choice(R5_SURROGATES + ["a"]))]},
        {"const": name},
        {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name],
         "additionalProperties": False},
        {"type": "object", "propertyNames": {"const": name}},
        {"type": "string", "maxLength": 2},
        {"type": "string", "pattern": f"^{name}$"},
    ]))[int(rng.integers(0, 6))]


def _r5_json_leaf(rng):
    import jsonschema

    def draw():
        schema = _r5_schema(rng)
        eos = len(R5_TOKENS) - 1
        constraint = dfa.json_schema(schema, R5_TOKENS, encodings="all", eos_token_id=eos)
        validator = jsonschema.validators.validator_for(schema)(schema)
        check = _accepts_if_no_error(lambda t: validator.validate(json.loads(t)),
                                     (ValueError, jsonschema.ValidationError))
        _r5_compare(rng, constraint, check, eos, f"schema {schema!r}", full=3, exact=False)
        return f"round5_json:{json.dumps(schema)}", constraint, check
    return _refusing("round5_json", draw)


VOCABULARIES["round5"] = R5_TOKENS
VOCABULARY_OPTIONS["round5"] = dict(share=0.03, max_new_tokens=5, top_leaf=1.0)
register_leaf("round5_regex", lambda rng, V, eos: _r5_regex_leaf(rng), vocabulary="round5",
              weight=4, needs_eos=True, combinable=False)
register_leaf("round5_grammar", lambda rng, V, eos: _r5_lark_leaf(rng), vocabulary="round5",
              weight=4, needs_eos=True, combinable=False)
register_leaf("round5_json", lambda rng, V, eos: _r5_json_leaf(rng), vocabulary="round5",
              weight=3, needs_eos=True, combinable=False)

def _leaf(rng, V, eos, vocabulary: str | None, top: bool, drawn: list | None):
    kinds = [name for name, kind in LEAF_KINDS.items() for _ in range(kind.weight)
             if kind.vocabulary in ((vocabulary,) if FORCED_VOCABULARY else (None, vocabulary))
             and (eos is not None or not kind.needs_eos)
             and (top or kind.combinable)]
    kind = str(rng.choice(kinds))
    if drawn is not None:
        drawn.append(kind)
    built = LEAF_KINDS[kind].build(rng, V, eos)
    if not isinstance(built, tuple):
        return kind, built, None
    return built if len(built) == 3 else (*built, None)


def random_constraint(rng, V, eos, vocabulary: str | None, depth: int = 0,
                      drawn: list | None = None):
    """``(description, top-level operation, constraint, check)``: a random expression of
    builders and operations (``vocabulary``: the case's byte vocabulary, None for bare token
    ids). ``check`` is None, or — when the whole constraint is one leaf whose build returned
    ``(description, constraint, check)`` — that leaf's own oracle: ``check(text)`` says whether
    the bytes an output spells (up to EOS) are in the constraint's language, independently of
    ctrlg (e.g. ``lark`` for a grammar, ``jsonschema`` for a JSON Schema). ``drawn`` collects
    the kinds drawn."""
    top_leaf = 0.35 if depth else VOCABULARY_OPTIONS.get(vocabulary, {}).get("top_leaf", 0.35)
    if depth >= 3 or rng.random() < top_leaf:
        name, leaf, check = _leaf(rng, V, eos, vocabulary, depth == 0, drawn)
        return name, "leaf", leaf, check
    op = str(rng.choice(["intersect", "union", "complement", "concat"]))
    if op == "complement":
        name, _, inner, _ = random_constraint(rng, V, eos, vocabulary, depth + 1, drawn)
        return f"¬({name})", op, dfa.complement(inner, allow_empty=True), None
    parts = [random_constraint(rng, V, eos, vocabulary, depth + 1, drawn)
             for _ in range(int(rng.integers(2, 4)))]
    fn = {"intersect": dfa.intersect, "union": dfa.union,
          "concat": lambda *d, **kw: dfa.concat(*d, max_states=CONCAT_STATES, **kw)}[op]
    symbol = {"intersect": " ∧ ", "union": " ∨ ", "concat": " · "}[op]
    return ("(" + symbol.join(p[0] for p in parts) + ")", op,
            fn(*(p[2] for p in parts), allow_empty=True), None)


# ---------------------------------------------------------------------- oracle
def accepted(constraint: dfa.TokenDFA, tokens, eos) -> bool:
    """The generation's verdict: the DFA run on the tokens up to and including the first EOS."""
    y = []
    for t in tokens:
        y.append(int(t))
        if eos is not None and t == eos:
            break
    return constraint.accepts(y)


def spelled(tokens: list[bytes], output, eos) -> bytes:
    """The bytes an output spells over a byte vocabulary, up to its first EOS."""
    out = []
    for t in output:
        if eos is not None and t == eos:
            break
        out.append(tokens[int(t)])
    return b"".join(out)


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
    """Every sequence of the budget through ``accepts``; a constraint with ``prefix_viable``
    (a grammar: whether the tokens can still be completed, budget aside) has the bodies that
    cannot be completed left out with all their extensions."""
    plain = [v for v in range(constraint.vocab_size) if v != eos]
    viable = getattr(constraint, "prefix_viable", None)
    bodies: list[tuple[int, ...]] = [()]
    for k in range(n + 1):
        for body in bodies:
            if k == n and constraint.accepts(list(body)):
                return True
            if eos is not None and m <= k < n and constraint.accepts([*body, eos]):
                return True
        if k < n:
            bodies = [(*body, v) for body in bodies for v in plain
                      if viable is None or viable([*body, v])]
    return False


# ---------------------------------------------------------------------- decoders
def random_hmm(rng, h, V) -> HMM:
    concentration = float(rng.choice([0.1, 0.3, 1.0, 3.0]))
    return HMM.from_params(rng.dirichlet([concentration] * h) + 1e-6,
                           rng.dirichlet([concentration] * h, size=h) + 1e-6,
                           rng.dirichlet([concentration] * V, size=h) + 1e-6, normalize=True)


def decode_hmm_lm(case, constraint, hmm, rng, beams: int):
    from ctrlg.lm.hmm_lm import HMMForCausalLM
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
FORCED_VOCABULARY: str | None = None     # --vocabulary: every case over this one
CASE_TIMEOUT = 0.0                       # --case-timeout: seconds (0: unbounded)


def run_case(seed: int) -> dict:
    """One case from its seed. With ``CASE_TIMEOUT`` set, cases run one after another in a
    forked worker process that is killed past the timeout (a numba loop or a C call ignores
    signals) and replaced for the next case; the case then counts as a violation ("no answer
    in N s"), as does a worker that dies (e.g. out of memory)."""
    if not CASE_TIMEOUT:
        return _run_case(seed)
    global _WORKER
    if _WORKER is None:
        _WORKER = _Worker()
    try:
        result, refusals = _WORKER.run(seed, CASE_TIMEOUT)
    except (TimeoutError, EOFError, OSError) as err:
        _WORKER.stop()
        _WORKER = None
        why = (f"no answer in {CASE_TIMEOUT:g} s" if isinstance(err, TimeoutError)
               else f"the case's process ended ({err!r})")
        return dict(seed=seed, decoder="?", op="?", violation=why)
    EDGE_REFUSALS.update(refusals)                   # the worker's clear refusals
    return result


class _Worker:
    """A forked process running cases sent to it (it keeps numba's compiled functions between
    cases); :meth:`run` raises TimeoutError when the answer takes longer than ``timeout``."""

    def __init__(self):
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=self._serve, args=(theirs,), daemon=True)
        self.process.start()
        theirs.close()

    @staticmethod
    def _serve(connection) -> None:
        while True:
            seed = connection.recv()
            EDGE_REFUSALS.clear()
            result = _run_case(seed)
            connection.send((result, dict(EDGE_REFUSALS)))

    def run(self, seed: int, timeout: float):
        self.connection.send(seed)
        if not self.connection.poll(timeout):
            raise TimeoutError
        return self.connection.recv()

    def stop(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.connection.close()


_WORKER: _Worker | None = None


def _run_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    vocabulary = pick_vocabulary(rng.random())
    if FORCED_VOCABULARY is not None:
        vocabulary = FORCED_VOCABULARY
    if vocabulary is not None:
        V, eos = len(VOCABULARIES[vocabulary]), len(VOCABULARIES[vocabulary]) - 1
    else:
        V = int(rng.integers(2, 7))
        eos = int(V - 1) if rng.random() < 0.6 else None
    n = int(rng.integers(1, VOCABULARY_OPTIONS.get(vocabulary, {}).get("max_new_tokens", 5) + 1))
    case = dict(seed=seed, V=V, eos=eos, n=n, m=int(min(rng.integers(0, 3), n)),
                mode=str(rng.choice(["ctrlg", "ctrlg", "logical"])),
                decoder=str(rng.choice(["sample", "beam", "random_logits"])))
    case["op"] = "?"
    try:
        attempt = 0
        while True:   # redraw an unsatisfiable constraint once (~1 case in 6 stays unsatisfiable)
            try:
                drawn: list[str] = []
                name, case["op"], constraint, check = random_constraint(
                    rng, V, eos, vocabulary, drawn=drawn)
            except UnsatisfiableConstraintError as err:
                # a builder's own verdict that no token sequence of the vocabulary spells the
                # language (e.g. a JSON Schema const whose digit no token holds): redrawn and
                # counted; the processor's verdicts are still checked against the oracle
                if "no token sequence of this vocabulary" not in str(err):
                    raise
                case["redrawn_unspellable"] = case.get("redrawn_unspellable", 0) + 1
                continue
            except ConstraintError as err:
                if not any(bound in str(err) for bound in
                           ("max_states", "needs a byte automaton", "beyond the bound")):
                    raise
                case["redrawn_too_large"] = case.get("redrawn_too_large", 0) + 1
                continue
            expect = satisfiable(constraint, n, case["m"], eos)
            attempt += 1
            if expect or attempt == 2 or rng.random() < 0.5:
                break
        case["constraint"] = name
        case["kinds"] = sorted(set(drawn))
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
        if check is not None:                  # the kind's own oracle, on the bytes spelled
            bad = [o for o in outputs if not check(spelled(VOCABULARIES[vocabulary], o, eos))]
            if bad:
                return {**case, "violation": f"outputs outside the language {bad[:3]}: "
                        f"{[spelled(VOCABULARIES[vocabulary], o, eos) for o in bad[:3]]}"}
        return {**case, "violation": None, "outputs": len(outputs)}
    except Exception as err:                                     # noqa: BLE001 - fuzzing
        return {**case, "violation": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=6)}


def run_campaign(cases: int, seed: int = 0, progress: bool = False) -> dict:
    """Run ``cases`` cases with seeds ``seed, seed + 1, ...``; returns the summary dict."""
    start = time.perf_counter()
    refusals_before = Counter(EDGE_REFUSALS)
    violations, by_decoder, by_op, unsat = [], Counter(), Counter(), 0
    by_kind, whole, kind_outputs = Counter(), Counter(), Counter()
    outputs = too_large = unspellable = 0
    for i in range(cases):
        result = run_case(seed + i)
        by_decoder[result["decoder"]] += 1
        by_op[result["op"]] += 1
        unsat += result.get("satisfiable") is False
        outputs += result.get("outputs", 0) or 0
        too_large += result.get("redrawn_too_large", 0)
        unspellable += result.get("redrawn_unspellable", 0)
        for kind in result.get("kinds", ()):
            by_kind[kind] += 1
            kind_outputs[kind] += result.get("outputs", 0) or 0
            if result["op"] == "leaf":
                whole[kind] += 1
        if result["violation"]:
            violations.append(result)
        if progress and (i + 1) % 500 == 0:
            print(f"  {i + 1}/{cases} cases, {len(violations)} violations, "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return dict(cases=cases, seed=seed, violations=len(violations), outputs_checked=outputs,
                unsatisfiable_cases=unsat, constraints_redrawn_too_large=too_large,
                constraints_redrawn_unspellable=unspellable,
                by_decoder=dict(by_decoder), by_top_operation=dict(by_op),
                by_kind={k: dict(cases=by_kind[k], whole_constraint=whole[k],
                                 outputs_checked=kind_outputs[k]) for k in LEAF_KINDS},
                edge_refusals=dict(EDGE_REFUSALS - refusals_before),
                seconds=round(time.perf_counter() - start, 1), first_violations=violations[:20])


def merge_summaries(summaries: list[dict]) -> dict:
    """One summary of campaigns run as shards (``--seed`` s, ``--cases`` c each): counts
    added, the first violations of each shard kept, the shards listed."""
    def add(dicts):
        total: Counter = Counter()
        for d in dicts:
            total.update(d)
        return dict(total)

    merged = dict(cases=sum(s["cases"] for s in summaries),
                  violations=sum(s["violations"] for s in summaries),
                  outputs_checked=sum(s["outputs_checked"] for s in summaries),
                  unsatisfiable_cases=sum(s["unsatisfiable_cases"] for s in summaries),
                  constraints_redrawn_too_large=sum(s["constraints_redrawn_too_large"]
                                                    for s in summaries),
                  constraints_redrawn_unspellable=sum(s.get("constraints_redrawn_unspellable", 0)
                                                      for s in summaries),
                  seconds=round(sum(s["seconds"] for s in summaries), 1),
                  seed=", ".join(f"{s['seed']}..{s['seed'] + s['cases'] - 1}" for s in summaries),
                  shards=[dict(seed=s["seed"], cases=s["cases"], violations=s["violations"],
                               seconds=s["seconds"]) for s in summaries],
                  by_decoder=add(s["by_decoder"] for s in summaries),
                  by_top_operation=add(s["by_top_operation"] for s in summaries),
                  by_kind={k: add(s["by_kind"].get(k, {}) for s in summaries)
                           for k in dict.fromkeys(k for s in summaries for k in s["by_kind"])},
                  edge_refusals=add(s["edge_refusals"] for s in summaries),
                  first_violations=[v for s in summaries for v in s["first_violations"]][:20])
    for key in ("vocabulary", "case_timeout"):
        if any(s.get(key) for s in summaries):
            merged[key] = summaries[0].get(key)
    return merged


def main(argv=None) -> int:
    global FORCED_VOCABULARY, CASE_TIMEOUT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/fuzz_campaign.json")
    parser.add_argument("--replay", type=int, default=None, help="run one case and print it")
    parser.add_argument("--vocabulary", default=None, choices=list(VOCABULARIES),
                        help="run every case over this byte vocabulary (its kinds only)")
    parser.add_argument("--case-timeout", type=float, default=0,
                        help="seconds a case may take before it counts as a violation (0: none)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="SUMMARY",
                        help="merge the summaries of shards into --out instead of running")
    args = parser.parse_args(argv)
    FORCED_VOCABULARY, CASE_TIMEOUT = args.vocabulary, args.case_timeout
    if args.merge:
        merged = merge_summaries([json.loads(Path(f).read_text()) for f in args.merge])
        Path(args.out).write_text(json.dumps(merged, indent=2, default=str, ensure_ascii=False))
        print(json.dumps({k: v for k, v in merged.items() if k != "first_violations"},
                         indent=2, ensure_ascii=False))
        return 1 if merged["violations"] else 0
    torch.set_num_threads(1)
    if args.replay is not None:
        print(json.dumps(run_case(args.replay), indent=2, default=str))
        return 0
    summary = run_campaign(args.cases, args.seed, progress=True)
    summary.update(vocabulary=args.vocabulary, case_timeout=args.case_timeout or None)
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
