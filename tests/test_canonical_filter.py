"""Canonical encodings without the product automaton (:class:`CanonicalDFA` +
:class:`CanonicalFeasibility`), checked against brute force:

* on a tiny trained byte-level BPE tokenizer, the decode-time masks equal the masks of the exact
  product automaton (:func:`canonical_token_dfa` + :class:`Feasibility`) on every prefix of up to
  three tokens (sampled where there are many), for several budgets;
* the bulk pair verdicts (forced pre-token boundaries, merge-rank runs) equal the per-pair ones
  on every tiny-tokenizer pair and on random SmolLM2 pairs, and every forced boundary is one the
  real pre-tokenizer makes in any context;
* on SmolLM2, for 12 patterns that loop over large token classes: strings sampled from the regex
  encode to accepted paths the masks allow, other segmentations are rejected, and paths sampled
  through the masks are canonical and match;
* the logits processor keeps generations canonical (logical and Ctrl-G modes), and operations
  that do not distribute over the filter raise clear errors.
"""

import re

import numpy as np
import pytest
import torch
from helpers import random_hmm
from test_canonical import _other_segmentations
from test_canonical_tiny import PATTERNS as TINY_PATTERNS
from tiny_bpe import tiny_bpe_tokenizer

from ctrlg import ConstraintLogitsProcessor, dfa
from ctrlg.guide.canonical_masks import CanonicalFeasibility, restrict_to_mask
from ctrlg.dfa.canonical import (_APOSTROPHE, _DIGIT, _LETTER, _OTHER, _SPACE, PairChecker,
                                 _edge_category, is_canonical)
from ctrlg.dfa.canonical_filter import START, CanonicalDFA
from ctrlg.errors import ConstraintError, UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility


@pytest.fixture(scope="module")
def tiny():
    return tiny_bpe_tokenizer()


@pytest.fixture(scope="module")
def smol():
    from ctrlg.lm.models import load_tokenizer

    return load_tokenizer()


def _masks(pattern, tok, n):
    """(product DFA, its Feasibility, CanonicalDFA, its CanonicalFeasibility) for one budget."""
    eos = tok.eos_token_id
    product = dfa.regex(pattern, tok, "canonical", canonical_form="product")
    lazy = dfa.regex(pattern, tok, "canonical", canonical_form="filter")
    assert isinstance(lazy, CanonicalDFA)
    exact = Feasibility(product, n, eos_token_id=eos)
    decode = CanonicalFeasibility(Feasibility(lazy.dfa, n, eos_token_id=eos), lazy)
    return product, exact, lazy, decode


# ------------------------------------------------------------------ against the product automaton
@pytest.mark.parametrize("pattern", [p for p, _, _ in TINY_PATTERNS] + ["hello", "the (cat|dog)"])
def test_masks_equal_the_product_automatons(tiny, pattern):
    rng = np.random.default_rng(0)
    eos = tiny.eos_token_id
    for n in (2, 3, 6):
        product, exact, lazy, decode = _masks(pattern, tiny, n)
        reachable = bool(exact.feasible[n, product.initial])
        assert decode.feasible(lazy.dfa.initial, START, 1, n) == reachable, (pattern, n)
        if not reachable:
            with pytest.raises(UnsatisfiableConstraintError):
                decode.check_satisfiable()
            continue
        level = [[]]
        for _ in range(min(n, 3)):
            children = []
            for prefix in level:
                r = n - len(prefix)
                want = exact.token_feasible(np.array([product.run(prefix)]), np.array([r])).numpy()[0]
                got = decode.token_mask(*decode.row_state(lazy.dfa.run(prefix), prefix), r)
                assert np.array_equal(want, got), (pattern, n, prefix,
                                                   np.flatnonzero(want != got)[:5].tolist())
                children += [prefix + [t] for t in np.flatnonzero(want).tolist() if t != eos]
            level = [children[i] for i in rng.permutation(len(children))[:40]]


def test_membership_is_the_product_automatons(tiny):
    """``CanonicalDFA.accepts`` agrees with the product automaton on every sequence of up to
    three tokens over the tokens the pattern's all-encodings DFA can use."""
    pattern = r"[a-z]+( [a-z]+)*"
    product = dfa.regex(pattern, tiny, "canonical", canonical_form="product")
    lazy = dfa.regex(pattern, tiny, "canonical", canonical_form="filter")
    eos = tiny.eos_token_id
    useful = [t for t in range(lazy.vocab_size)
              if t != eos and lazy.dfa.step(lazy.dfa.initial, t) in set(lazy.dfa.live_states().nonzero()[0].tolist())]
    rng = np.random.default_rng(1)
    for _ in range(3000):
        seq = rng.choice(useful, size=rng.integers(1, 4)).tolist()
        if rng.random() < 0.3:
            seq = seq + [eos]
        assert lazy.accepts(seq) == product.accepts(seq), tiny.convert_ids_to_tokens(seq)


# ------------------------------------------------------------------ bulk pair verdicts
def test_bulk_verdicts_equal_per_pair_verdicts_on_every_tiny_pair(tiny):
    reference, fast = PairChecker(tiny), PairChecker(tiny)
    fast.merge_tables()
    V = len(reference.tokens)
    a, b = (x.ravel() for x in np.meshgrid(np.arange(V), np.arange(V)))
    assert np.array_equal(fast.verdicts_after(a, b), reference.pairs(a, b))
    assert fast.forced_boundary(a, b).any()


def test_bulk_verdicts_equal_per_pair_verdicts_on_smollm2(smol):
    reference, fast = PairChecker(smol), PairChecker(smol)
    fast.merge_tables()
    rng = np.random.default_rng(2)
    V = len(reference.tokens)
    a, b = rng.integers(0, V, 60_000), rng.integers(0, V, 60_000)
    letters = np.flatnonzero(np.asarray(fast.ascii_runs()) == 2)      # many in-run pairs too
    a[:20_000], b[:20_000] = rng.choice(letters, 20_000), rng.choice(letters, 20_000)
    got, want = fast.verdicts_after(a, b), reference.pairs(a, b)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:5]
    every = np.arange(V)
    for t in rng.choice(letters, 3).tolist() + [int(x) for x in rng.integers(0, V, 2)]:
        row = fast.verdicts_after(t, every)                  # one left token: inverted signatures
        column = fast.verdicts_after(every, t)               # one right token
        assert np.array_equal(row, reference.pairs(np.full(V, t), every))
        assert np.array_equal(column, reference.pairs(every, np.full(V, t)))


CHARS = ["a", "Z", "é", "ß", "中", "7", "٣", "½", " ", "\n", "\t", "\u3000", "\x1c", "'", "!",
         ".", "@", "\u0301", "-", '"']
CONTEXT = ["", "a", " ", "  ", "1", "!", "'", "\n"]


def test_forced_boundaries_are_made_by_the_pre_tokenizer_in_every_context(smol):
    """Every character pair the rule calls a forced boundary is split by the real GPT-2
    pre-tokenizer, whatever precedes and follows it."""
    checker = PairChecker(smol)
    category = {ch: _edge_category(ch.encode(), 0) for ch in CHARS}
    assert category["\x1c"] == _OTHER and category[" "] == _SPACE and category["'"] == _APOSTROPHE
    assert category["٣"] == _DIGIT and category["中"] == _LETTER
    forced = {(x, y) for x in CHARS for y in CHARS
              if (category[x], category[y]) in _FORCED_CATEGORY_PAIRS}
    assert len(forced) > 100
    pre = checker.pre_tokenizer
    for x, y in forced:
        for before in CONTEXT:
            for after in CONTEXT:
                text = before + x + y + after
                starts = {start for _, (start, _) in pre.pre_tokenize_str(text)}
                assert len(before) + 1 in starts, (before, x, y, after)


_FORCED_CATEGORY_PAIRS = {(x, y) for x in range(6) for y in range(6)
                          if (x == _LETTER and y not in (_LETTER, 5))
                          or (x == _DIGIT and y not in (_DIGIT, 5))
                          or (x == _OTHER and y in (_LETTER, _DIGIT, _SPACE))}


# ------------------------------------------------------------------ SmolLM2, large classes
LARGE = [r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,6}",
         r"https?://[a-zA-Z0-9.-]+(/[a-zA-Z0-9._~%-]*){0,4}",
         r'\{[ ]?"name"[ ]?:[ ]?"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt]){0,20}"[ ]?,[ ]?"age"[ ]?:[ ]?(-)?(0|[1-9][0-9]*)[ ]?\}',
         r"[A-Z][^\n.!?]* in the park\.", r"[a-z]+( [a-z]+)*", r"[a-z]+", r"[A-Za-z]+ing",
         r"[^\n]*", r"[a-z]+(, [a-z]+)*\.", r"[a-z0-9]+-[0-9]+", r"(the|a) [a-z]+s?",
         r"[A-Za-z ]{1,30}!"]


def _sample_matching(pattern, rng, num, wander=16):
    """``num`` printable strings of the regex: a random walk of up to ``wander`` characters over
    the byte DFA's live states, then a random shortest way to acceptance (so patterns with a
    fixed ending are sampled too)."""
    from ctrlg.dfa.bytes_dfa import compile_bytes_dfa

    bdfa = compile_bytes_dfa(pattern)
    live = bdfa.live()
    printable = np.zeros(256, dtype=bool)
    printable[32:127] = True
    table = bdfa.table[:, printable]
    chars = np.flatnonzero(printable)
    dist = np.where(bdfa.accepting, 0, 10**6)
    for _ in range(len(dist)):
        dist = np.minimum(dist, dist[table].min(axis=1) + 1)
    out = []
    for _ in range(num):
        q, data = bdfa.initial, bytearray()
        for _ in range(int(rng.integers(0, wander + 1))):
            options = np.flatnonzero(live[table[q]] & (dist[table[q]] < 10**6))
            if not len(options):
                break
            k = int(rng.choice(options))
            data.append(int(chars[k]))
            q = int(table[q, k])
        while not bdfa.accepting[q]:
            options = np.flatnonzero(dist[table[q]] == dist[q] - 1)
            k = int(rng.choice(options))
            data.append(int(chars[k]))
            q = int(table[q, k])
        out.append(data.decode())
    return out


def _walk(lazy, masks, rng, n, eos):
    prefix = []
    while True:
        m = masks.token_mask(*masks.row_state(lazy.dfa.run(prefix), prefix), n - len(prefix))
        options = np.flatnonzero(m)
        assert len(options), (lazy.what, prefix)
        t = int(rng.choice(options))
        if t == eos:
            return prefix + [eos]
        prefix.append(t)
        if len(prefix) == n:
            return prefix


@pytest.mark.parametrize("pattern", LARGE)
def test_large_class_loops_on_smollm2(smol, pattern):
    rng = np.random.default_rng(3)
    eos, n = smol.eos_token_id, 24
    lazy = dfa.regex(pattern, smol, "canonical")
    assert isinstance(lazy, CanonicalDFA), pattern       # the product would be too large
    masks = CanonicalFeasibility(Feasibility(lazy.dfa, n, eos_token_id=eos), lazy)
    masks.check_satisfiable()
    for s in _sample_matching(pattern, rng, 6):
        assert re.fullmatch(pattern, s), s
        ids = smol.encode(s, add_special_tokens=False)
        if len(ids) >= n:
            continue
        assert lazy.accepts(ids) and lazy.accepts(ids + [eos]), s
        for k, t in enumerate(ids + [eos]):        # the masks allow the canonical path
            prefix = ids[:k]
            m = masks.token_mask(*masks.row_state(lazy.dfa.run(prefix), prefix), n - k)
            assert m[t], (s, k)
        for other in _other_segmentations(ids, smol)[:4]:
            assert lazy.dfa.accepts(other) and not lazy.accepts(other), (s, other)
    for _ in range(3):
        path = _walk(lazy, masks, rng, n, eos)
        text_ids = path[:-1] if path[-1] == eos else path
        assert lazy.accepts(path) and is_canonical(text_ids, smol), smol.convert_ids_to_tokens(path)
        assert re.fullmatch(pattern, smol.decode(text_ids)), smol.decode(text_ids)


# ------------------------------------------------------------------ the processor
@pytest.mark.parametrize("mode", ["logical", "ctrlg"])
def test_processor_keeps_generations_canonical(tiny, mode):
    pattern = r"[a-z]+( [a-z]+)*\."
    lazy = dfa.regex(pattern, tiny, "canonical", canonical_form="filter")
    eos, V, n, B = tiny.eos_token_id, lazy.vocab_size, 8, 6
    hmm = random_hmm(4, V, 0) if mode == "ctrlg" else None
    proc = ConstraintLogitsProcessor(hmm, lazy, prompt_length=1, max_new_tokens=n, mode=mode,
                                     eos_token_id=eos)
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(B, 1, dtype=torch.long)
    for _ in range(n):
        out = proc(ids, torch.randn(B, V, generator=g) * 3)
        probs = out.exp()
        probs[torch.isinf(out).all(1)] = 0
        nxt = torch.multinomial(probs + 1e-30 * (probs.sum(1, keepdim=True) == 0), 1, generator=g)
        done = (ids[:, 1:] == eos).any(1) if ids.shape[1] > 1 else torch.zeros(B, dtype=torch.bool)
        nxt[done] = eos
        ids = torch.cat([ids, nxt], 1)
    for row in ids[:, 1:].tolist():
        text = row[:row.index(eos)] if eos in row else row
        assert lazy.accepts(row[:len(text) + 1] if eos in row else row)
        assert is_canonical(text, tiny) and re.fullmatch(pattern, tiny.decode(text))


def test_restrict_to_mask_renormalises_and_falls_back_to_uniform():
    lp = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0, 3.0]), -1)
    mask = torch.tensor([True, False, True, False])
    out = restrict_to_mask(lp, mask)
    assert torch.isinf(out[[1, 3]]).all() and torch.isclose(out[[0, 2]].exp().sum(), torch.tensor(1.0))
    dead = torch.tensor([0.0, -float("inf"), -float("inf"), -float("inf")])
    fallback = restrict_to_mask(dead, torch.tensor([False, True, True, False]))
    assert torch.allclose(fallback[[1, 2]].exp(), torch.tensor([0.5, 0.5]))


# ------------------------------------------------------------------ operations and errors
def test_intersection_keeps_the_filter_and_other_operations_raise(tiny):
    lazy = dfa.regex(r"[a-z]+( [a-z]+)*", tiny, "canonical", canonical_form="filter")
    short = dfa.length(1, 3, vocab_size=lazy.vocab_size)
    both = dfa.intersect(lazy, short)
    assert isinstance(both, CanonicalDFA)
    word = tiny.encode("the cat", add_special_tokens=False)
    split = [tiny.convert_tokens_to_ids(c) for c in "the"]
    assert both.accepts(word) and not both.accepts(split) and lazy.dfa.accepts(split)
    for operation in (lambda: dfa.union(lazy, short), lambda: dfa.complement(lazy),
                      lambda: dfa.concat(lazy, short)):
        with pytest.raises(ConstraintError, match="canonical"):
            operation()


def test_unsatisfiable_within_the_budget_is_a_clear_error(tiny):
    """"atea" is canonically ``at·e·a`` (3 tokens) but also ``a·tea`` (2): with a budget of 2 the
    all-encodings constraint fits and the canonical one does not, and the processor says so."""
    text, eos = "atea", tiny.eos_token_id
    assert len(tiny.encode(text, add_special_tokens=False)) == 3
    lazy = dfa.regex(text, tiny, "canonical", canonical_form="filter")
    assert lazy.dfa.accepts([tiny.convert_tokens_to_ids("a"), tiny.convert_tokens_to_ids("tea")])
    ConstraintLogitsProcessor(None, lazy.dfa, prompt_length=1, max_new_tokens=2, mode="logical",
                              eos_token_id=eos)       # all encodings: fits
    with pytest.raises(UnsatisfiableConstraintError, match="canonical tokenization"):
        ConstraintLogitsProcessor(None, lazy, prompt_length=1, max_new_tokens=2, mode="logical",
                                  eos_token_id=eos)
    ConstraintLogitsProcessor(None, lazy, prompt_length=1, max_new_tokens=3, mode="logical",
                              eos_token_id=eos)


def test_json_schema_in_canonical_form_gives_valid_canonical_documents(smol):
    """A nested JSON Schema in canonical mode (a CanonicalDFA: its strings loop over large
    classes): documents walked through the masks parse, validate and are canonical."""
    import json

    import jsonschema

    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 12},
                             "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                      "maxItems": 2},
                             "address": {"type": "object",
                                         "properties": {"zip": {"type": "integer", "minimum": 0,
                                                                "maximum": 99999}},
                                         "required": ["zip"]}},
              "required": ["name", "address"]}
    lazy = dfa.json_schema(schema, smol, encodings="canonical", whitespace="")
    assert isinstance(lazy, CanonicalDFA)
    eos, n = smol.eos_token_id, 48
    masks = CanonicalFeasibility(Feasibility(lazy.dfa, n, eos_token_id=eos), lazy)
    rng = np.random.default_rng(4)
    for _ in range(3):
        path = _walk(lazy, masks, rng, n, eos)
        assert path[-1] == eos
        text = smol.decode(path[:-1])
        jsonschema.validate(json.loads(text), schema)
        assert is_canonical(path[:-1], smol), text


def test_a_search_beyond_its_bound_is_a_clear_error(tiny):
    lazy = dfa.regex(r"[a-z]+( [a-z]+)*\.", tiny, "canonical", canonical_form="filter")
    table = Feasibility(lazy.dfa, 8, eos_token_id=tiny.eos_token_id)
    with pytest.raises(ConstraintError, match="max_expansions=2"):
        CanonicalFeasibility(table, lazy, max_expansions=2).check_satisfiable()
