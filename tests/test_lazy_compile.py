"""The lazy path's compile (:mod:`ctrlg.dfa.lazy_nfa`, the parser's fast paths, the lazy
product search of :mod:`ctrlg.dfa.json_schema.strings`) against the constructions it replaces:

* Thompson's construction on demand (:class:`~ctrlg.dfa.lazy_nfa.LazyThompsonNFA`) against the
  whole NFA built up front (:class:`~ctrlg.dfa.lazy.TemplateNFA`), both determinised lazily:
  the same live bytes and acceptance along random byte walks, the same verdict on random byte
  strings, the same token masks on random token walks and the same acceptance of random token
  sequences — on regexes with counters, nested loops and empty classes, and on the regexes of
  small JSON schemas, ``$ref``-heavy and recursive (unrolled) ones included;
* the parser's literal runs against the parser without them, the compiled parenthesis scan
  against the Python one, and the lazy product search against the product of eager DFAs.
"""

import itertools
import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa import regex_syntax
from ctrlg.dfa.bytes_dfa import compile_ast
from ctrlg.dfa.json_schema import schema_to_regex
from ctrlg.dfa.json_schema.lazy import unroll
from ctrlg.dfa.lazy import (DEAD, LazyByteDFA, LazyTokenDFA, TemplateNFA, _matching_parens,
                            _matching_parens_py, lazy_regex, parse)
from ctrlg.dfa.lazy_nfa import LazyThompsonNFA, lazy_thompson, prune_empty
from ctrlg.dfa.masks import TokenMasks
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.errors import RegexError
from test_json_schema import SCHEMAS
from tiny_bpe import tiny_bpe_tokenizer

EMPTY_CLASS = r"[^\x00-\U0010FFFF]"
PATTERNS = [
    r"[a-z]+ (cat|dog)",
    r'"(?:[^"\\]|\\.)*"',
    r"[0-9]{2,4}-[a-z]*",
    r"(the|a) [a-z]{1,5}( [a-z]{1,5}){0,3}\.",
    r"é+|[α-ω]{2}|x",
    r"(ab|a)(bc|c)*d?",
    r"(?:a|b{0,3}){2,4}c",
    r"(?:x*)*y|(?:(?:ab)?){3}z",
    r"(?:(?:a|)(?:b|)){1,3}",
    r"(?:[\x00-\x7f]|[\u0080-\U0010FFFF]){0,3}!",
    r"a{0}b|c{0,0}d|e{3}",
    rf"a{EMPTY_CLASS}|ab",
    rf"(?:{EMPTY_CLASS})*c|x(?:{EMPTY_CLASS}){{0,2}}y|z{EMPTY_CLASS}{{1,2}}",
    rf"(?:q|{EMPTY_CLASS}w)+e",
    "k" * 150 + r"(?:y|zz)mn",                      # a long literal
    r"pré(?:fix|é[a-c]ñ)pöst[0-9]",                 # literals through UTF-8 char sets
]

# a definition referred to many times, nested definitions, a recursive one (unrolled)
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
         "required": ["x", "y"], "additionalProperties": False}
REF_HEAVY = {
    "$defs": {"point": POINT,
              "segment": {"type": "array", "items": {"$ref": "#/$defs/point"},
                          "minItems": 2, "maxItems": 2},
              "name": {"type": "string", "maxLength": 6, "pattern": "^[a-z]+$"}},
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"},
                   "s": {"$ref": "#/$defs/segment"},
                   "path": {"type": "array", "items": {"$ref": "#/$defs/segment"},
                            "maxItems": 3},
                   "n": {"$ref": "#/$defs/name"}, "m": {"$ref": "#/$defs/name"}},
    "required": ["a", "s"], "additionalProperties": False}
TREE = {"$defs": {"node": {"type": "object",
                           "properties": {"v": {"type": "integer"},
                                          "kids": {"type": "array",
                                                   "items": {"$ref": "#/$defs/node"}}},
                           "required": ["v"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}


@pytest.fixture(scope="module")
def tiny():
    return tiny_bpe_tokenizer()


def _old_and_new(pattern: str):
    """The byte DFAs of ``pattern`` by the NFA built up front and by the NFA built on demand."""
    old = TemplateNFA()
    s, a = old.add_state(), old.add_state()
    old.build(regex_syntax.parse(pattern), s, a)
    nfa, s2, a2 = lazy_thompson(parse(pattern))
    return LazyByteDFA(old, s, a), LazyByteDFA(nfa, s2, a2)


def _schema_regexes():
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("person", "refs", "map", "any_of", "formats", "tuple", "anything"):
            if name in SCHEMAS:
                out[name] = schema_to_regex(SCHEMAS[name])
        out["ref_heavy"] = schema_to_regex(REF_HEAVY)
        out["ref_heavy_compact"] = schema_to_regex(REF_HEAVY, whitespace="")
        from ctrlg.dfa.json_schema import _compile
        frag, defs = _compile(TREE, "[ ]?", 1, False)
        out["tree_unrolled_2"] = unroll(frag, defs, 2)
    return out


SCHEMA_REGEXES = _schema_regexes()
ALL = [(p, p) for p in PATTERNS] + sorted(SCHEMA_REGEXES.items())


def _byte_walk(old: LazyByteDFA, new: LazyByteDFA, rng, steps: int) -> None:
    """Walk both byte DFAs on the same random live bytes: the live bytes (row entries not
    dead; every non-dead state can accept) and acceptance agree at every step."""
    p, q = old.initial, new.initial
    assert (p == DEAD) == (q == DEAD)
    for _ in range(steps):
        if p == DEAD:
            return
        assert bool(old.accepting[p]) == bool(new.accepting[q])
        rp, rq = old.row(p), new.row(q)
        live = np.flatnonzero(rp)
        assert np.array_equal(live, np.flatnonzero(rq))
        if not len(live):
            return
        b = int(rng.choice(live))
        p, q = int(rp[b]), int(rq[b])


def _run_bytes(d: LazyByteDFA, data: bytes) -> bool:
    q = d.initial
    for b in data:
        if q == DEAD:
            return False
        q = int(d.row(q)[b])
    return q != DEAD and bool(d.accepting[q])


@pytest.mark.parametrize("name,pattern", ALL, ids=[n[:40] for n, _ in ALL])
def test_on_demand_nfa_gives_the_same_byte_language(name, pattern):
    old, new = _old_and_new(pattern)
    rng = np.random.default_rng(0)
    for _ in range(40):
        _byte_walk(old, new, rng, steps=200)
    alphabet = np.frombuffer(pattern.encode() + b'{}":,[]0123456789 abxyz\xce\xb1', np.uint8)
    for _ in range(300):
        data = bytes(rng.choice(alphabet, size=int(rng.integers(0, 12))).tolist())
        assert _run_bytes(old, data) == _run_bytes(new, data), data


def _random_regex(draw, depth: int) -> str:
    """A regex over ``a``, ``b``: alternations (empty branches included) nested in loops,
    counters and concatenations, where branches that share their start and end state would
    go wrong if a branch could re-enter its start."""
    if depth == 0:
        return draw(st.sampled_from(["a", "b", "[ab]", ""]))
    kind = draw(st.sampled_from(["alt", "alt", "cat", "star", "plus", "opt", "count", "leaf"]))
    if kind == "leaf":
        return _random_regex(draw, 0)
    if kind in ("alt", "cat"):
        items = [_random_regex(draw, depth - 1) for _ in range(draw(st.integers(2, 3)))]
        return "(?:" + ("|" if kind == "alt" else "").join(
            items if kind == "alt" else [f"(?:{x})" for x in items]) + ")"
    inner = f"(?:{_random_regex(draw, depth - 1)})"
    if kind == "count":
        lo = draw(st.integers(0, 2))
        return inner + f"{{{lo},{lo + draw(st.integers(0, 2))}}}"
    return inner + {"star": "*", "plus": "+", "opt": "?"}[kind]


ALL_SHORT_STRINGS = [bytes(p) for n in range(6) for p in itertools.product(b"ab", repeat=n)]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_on_demand_nfa_accepts_what_python_re_accepts(data):
    """Brute force: the NFA built on demand (alternation branches sharing their start and end
    states) accepts exactly the strings over {a, b} of length ≤ 5 that ``re.fullmatch`` does."""
    pattern = f"(?:{_random_regex(data.draw, data.draw(st.integers(1, 4)))})"
    nfa, s, a = lazy_thompson(parse(pattern))
    d = LazyByteDFA(nfa, s, a)
    for text in ALL_SHORT_STRINGS:
        assert _run_bytes(d, text) == bool(re.fullmatch(pattern, text.decode())), (pattern, text)


@pytest.mark.parametrize("name,pattern", ALL, ids=[n[:40] for n, _ in ALL])
def test_on_demand_nfa_gives_the_same_token_masks(tiny, name, pattern):
    """Token level over a tiny BPE vocabulary: the masks along random walks, and acceptance of
    random token sequences (dead states and EOS in the middle included)."""
    old_b, _ = _old_and_new(pattern)
    old = LazyTokenDFA(old_b, vocab_trie(tiny))
    new = lazy_regex(pattern, tiny)
    rng = np.random.default_rng(1)
    for _ in range(6):
        p, q = old.initial, new.initial
        for _ in range(40):
            mp, mq = old.mask(p), new.mask(q)
            assert np.array_equal(mp, mq)
            assert old.is_accepting(p) == new.is_accepting(q)
            ids = np.flatnonzero(mp)
            if not len(ids):
                break
            t = int(rng.choice(ids))
            p, q = old.step(p, t), new.step(q, t)
    V = new.vocab_size
    for _ in range(200):
        toks = rng.integers(0, V, size=int(rng.integers(0, 8))).tolist()
        assert old.accepts(toks) == new.accepts(toks), toks


@pytest.mark.parametrize("pattern", [p for p in PATTERNS if EMPTY_CLASS in p])
def test_empty_classes_match_the_eager_dfa(tiny, pattern):
    """The pruned AST (no liveness pass on the lazy path) against the eager DFA's masks."""
    lazy = lazy_regex(pattern, tiny)
    eager = dfa.regex(pattern, tiny, minimize=False)
    masks = TokenMasks(eager)
    rng = np.random.default_rng(2)
    for _ in range(10):
        ql, qe = lazy.initial, eager.initial
        for _ in range(8):
            ml = lazy.mask(ql)
            assert np.array_equal(ml, masks(qe))
            ids = np.flatnonzero(ml)
            if not len(ids):
                break
            t = int(rng.choice(ids))
            ql, qe = lazy.step(ql, t), eager.step(qe, t)


def test_prune_empty():
    e = regex_syntax.CharSet(())
    a, b = regex_syntax.CharSet(((97, 97),)), regex_syntax.CharSet(((98, 98),))
    C, A, R = regex_syntax.Concat, regex_syntax.Alternation, regex_syntax.Repeat
    assert prune_empty(C((a, e))) is None
    assert prune_empty(A((a, C((b, e))))) is a
    assert prune_empty(R(e, 0, 3)) == regex_syntax.EMPTY
    assert prune_empty(R(e, 1, None)) is None
    tree = C((a, A((b, e)), R(A((e, a)), 0, None)))
    assert prune_empty(tree) == C((a, b, R(a, 0, None)))
    untouched = C((a, R(b, 1, 2)))
    assert prune_empty(untouched) is untouched


def test_compile_builds_only_the_initial_closure():
    """A pattern whose eager NFA has ~10⁵ states: compile creates a few hundred (a counter of
    a small item reached by the initial closure is wired at once, its copies' edges filled in
    on first use, so that masks deep inside it can be translated)."""
    nfa, s, a = lazy_thompson(parse(r"(?:[a-z]{0,100}x){0,100}y|\{(?:[0-9]{0,50},){0,200}\}"))
    d = LazyByteDFA(nfa, s, a)
    assert len(nfa.edges) < 200
    q = d.initial
    for b in b"abx":
        q = int(d.row(q)[b])
    assert q != DEAD and len(nfa.edges) < 400
    assert isinstance(nfa, LazyThompsonNFA)


def test_the_size_bound_is_checked_without_building():
    with pytest.raises(RegexError, match="character positions"):
        lazy_thompson(parse(r"(?:(?:a{1000}){1000}){1000}"))


ALPHABET = list("ab()[]^$*+?{}|.\\,01-:xé") + ["(?:", "{2}", "{1,3}", "{,2}", r"\d", "[^",
                                                  r"\A", r"\Z", "(?P<n>", "(?=", "(?#c)"]


def _parse_result(pattern, **kw):
    try:
        return "ok", regex_syntax.parse(pattern, **kw)
    except (RegexError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=14),
       anchors=st.booleans())
def test_literal_runs_parse_as_single_characters(parts, anchors):
    """The parser's runs of plain characters give the AST (or the error) of reading them one
    by one, and the shared-group parser the same AST."""
    pattern = "".join(parts)
    fast = _parse_result(pattern, anchors=anchors)
    saved = regex_syntax._LITERAL_RUN
    regex_syntax._LITERAL_RUN = re.compile(r"(?!)")       # never matches: one at a time
    try:
        slow = _parse_result(pattern, anchors=anchors)
    finally:
        regex_syntax._LITERAL_RUN = saved
    assert fast == slow
    if fast[0] == "ok" and not anchors:
        assert parse(pattern) == fast[1]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="()[]^\\ab", min_size=0, max_size=400))
def test_compiled_paren_scan_matches_the_python_one(text):
    from ctrlg.dfa import lazy
    saved = lazy._COMPILED_SCAN_CHARS, lazy._SMALL_SCAN_CHARS
    lazy._COMPILED_SCAN_CHARS = lazy._SMALL_SCAN_CHARS = 0   # every pattern: the compiled scan
    try:
        assert _matching_parens(text) == _matching_parens_py(text)
    finally:
        lazy._COMPILED_SCAN_CHARS, lazy._SMALL_SCAN_CHARS = saved


def test_the_compiled_scan_takes_over_once_python_scans_have_paid_for_it(monkeypatch):
    """Short patterns stay with the Python scan until this process has scanned
    ``_COMPILED_SCAN_CHARS`` characters in Python; then every pattern but the shortest goes to
    the compiled one (whose first call loads it), with the same pairs."""
    from ctrlg.dfa import lazy

    calls = []

    class Spy:
        signatures: list = []

        def __call__(self, *args):
            calls.append(len(args[0]))
            return lazy._paren_pairs_py(*args)

    monkeypatch.setattr(lazy, "_paren_pairs", Spy())
    monkeypatch.setattr(lazy, "_python_scanned", [0])
    pattern = "(a(b)[()]c)" * 40                            # 440 characters
    assert _matching_parens(pattern) == _matching_parens_py(pattern) and not calls
    lazy._python_scanned[0] = lazy._COMPILED_SCAN_CHARS
    assert _matching_parens(pattern) == _matching_parens_py(pattern) and calls == [440]
    assert _matching_parens("(a)") == {0: 2} and calls == [440]     # the shortest: Python


def _eager_product_finds(a, b, inside_b):
    da, db = compile_ast(a), compile_ast(b)
    seen = {(da.initial, db.initial)}
    queue = list(seen)
    while queue:
        p, q = queue.pop()
        if da.accepting[p] and bool(db.accepting[q]) == inside_b:
            return True
        for pair in set(zip(da.table[p].tolist(), db.table[q].tolist())):
            if pair[0] and (pair[1] or not inside_b) and pair not in seen:
                seen.add(pair)
                queue.append(pair)
    return False


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "[ab]", "[^a]", "(?:a|bb)", "é", ".",
                                           EMPTY_CLASS]),
                          st.sampled_from(["", "*", "?", "{1,2}", "+"])), min_size=1,
                max_size=4),
       st.lists(st.tuples(st.sampled_from(["a", "b", "[ab]", "[^b]", "(?:b|aa)", "é", "."]),
                          st.sampled_from(["", "*", "?", "{0,2}", "+"])), min_size=1,
                max_size=4))
def test_lazy_product_search_matches_the_eager_one(xs, ys):
    from importlib import import_module
    strings = import_module("ctrlg.dfa.json_schema.strings")
    a = regex_syntax.parse("".join(x + q for x, q in xs))
    b = regex_syntax.parse("".join(y + q for y, q in ys))
    for inside in (True, False):
        assert strings._product_finds(a, b, inside) == _eager_product_finds(a, b, inside)
        assert strings._product_finds(b, a, inside) == _eager_product_finds(b, a, inside)
