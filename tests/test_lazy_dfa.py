"""The lazy token automaton (:mod:`ctrlg.dfa.lazy`) against the eager one (:func:`dfa.regex`,
:func:`dfa.json_schema`): the same masks, successors' acceptance and accepted sequences along
random walks (hypothesis), over a tiny BPE vocabulary and the SmolLM2 vocabulary (loop slices);
recursive schemas unrolled to a sound subset whose documents validate; ``materialize`` agrees
with the eager DFA within the budget; bad patterns give clear errors."""

import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa.json_schema.lazy import unroll
from ctrlg.dfa.lazy import DEAD, ENDED, LazyTokenDFA, lazy_regex, loop_slice
from ctrlg.dfa.masks import TokenMasks
from ctrlg.dfa.vocab_trie import vocab_trie
from ctrlg.errors import RegexError, UnsatisfiableConstraintError
from test_json_schema import SCHEMAS
from tiny_bpe import tiny_bpe_tokenizer

jsonschema = pytest.importorskip("jsonschema")

PATTERNS = [
    r"[a-z]+ (cat|dog)",
    r'"(?:[^"\\]|\\.)*"',
    r"[0-9]{2,4}-[a-z]*",
    r'\{"name": "[^"]*", "age": [0-9]+\}',
    r"(the|a) [a-z]{1,5}( [a-z]{1,5}){0,3}\.",
    r"é+|[α-ω]{2}|x",                          # multi-byte UTF-8
    r"(ab|a)(bc|c)*d?",
]


def _compare_walk(lazy: LazyTokenDFA, eager, masks: TokenMasks, draw, steps: int):
    """Walk both automata with the same tokens, checking masks and acceptance at every step;
    ``draw(n)`` picks an index in [0, n). Returns the tokens walked."""
    ql, qe, toks = lazy.initial, eager.initial, []
    for _ in range(steps):
        ml, me = lazy.mask(ql), masks(qe)
        assert ml.shape == me.shape
        diff = np.flatnonzero(ml != me)
        assert not len(diff), f"masks differ after {toks} on tokens {diff[:10]}"
        assert lazy.is_accepting(ql) == eager.is_accepting(qe)
        ids = np.flatnonzero(ml)
        if not len(ids):
            break
        t = int(ids[draw(len(ids))])
        ql, qe = lazy.step(ql, t), eager.step(qe, t)
        toks.append(t)
        assert (ql == DEAD) == (not masks.live[qe])
    assert lazy.accepts(toks) == eager.accepts(toks)
    return toks


@pytest.fixture(scope="module")
def tiny():
    return tiny_bpe_tokenizer()


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_regex_masks_match_the_eager_dfa(tiny, pattern, data):
    lazy = lazy_regex(pattern, tiny)
    eager = dfa.regex(pattern, tiny, minimize=False)
    _compare_walk(lazy, eager, TokenMasks(eager),
                  lambda n: data.draw(st.integers(0, n - 1)), steps=30)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_random_token_sequences_are_accepted_alike(tiny, pattern):
    """Also off the allowed paths: arbitrary tokens, dead states, EOS in the middle."""
    _assert_accept_alike(lazy_regex(pattern, tiny), dfa.regex(pattern, tiny),
                         np.random.default_rng(0), count=300, max_len=6)


def _assert_accept_alike(a, eager, rng, *, count, max_len):
    """``a`` accepts exactly as ``eager`` on ``count`` uniform token sequences of length below
    ``max_len`` (drawn from ``rng``)."""
    V = eager.vocab_size
    for _ in range(count):
        toks = rng.integers(0, V, size=rng.integers(0, max_len)).tolist()
        assert a.accepts(toks) == eager.accepts(toks), toks


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_json_schema_masks_match_the_eager_dfa(tiny, name, data):
    schema = SCHEMAS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = dfa.json_schema(schema, tiny, minimize=False)
        lazy = dfa.lazy_json_schema(schema, tiny)
    if not isinstance(eager, dfa.TokenDFA):
        pytest.skip("a grammar constraint on the eager path")
    _compare_walk(lazy, eager, TokenMasks(eager),
                  lambda n: data.draw(st.integers(0, n - 1)), steps=60)


@pytest.mark.parametrize("name", ["person", "refs", "map", "anything"])
def test_smollm2_masks_match_the_eager_dfa(smollm2_tokenizer, name):
    """The real vocabulary (49,152 tokens): string bodies go through the shared loop slices."""
    trie = vocab_trie(smollm2_tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = dfa.json_schema(SCHEMAS[name], trie, minimize=False)
        lazy = dfa.lazy_json_schema(SCHEMAS[name], trie)
    masks = TokenMasks(eager, max_table_bytes=0)
    rng = np.random.default_rng(1)
    for _ in range(4):
        _compare_walk(lazy, eager, masks, lambda n: int(rng.integers(n)), steps=40)


def test_loop_slice_is_the_tokens_spelled_by_the_loop_bytes(tiny):
    trie = vocab_trie(tiny)
    loop = np.zeros(256, dtype=bool)
    loop[ord("a"):ord("z") + 1] = True
    tokens, exit_byte, exit_child = loop_slice(trie, loop)
    expect = [i for i, b in enumerate(trie.token_bytes) if b and all(loop[c] for c in b)]
    assert tokens.tolist() == expect
    assert not loop[exit_byte].any() and len(exit_byte) == len(exit_child)
    assert loop_slice(trie, loop)[0] is tokens          # memoised per vocabulary


def test_ended_and_dead_states(tiny):
    lazy = lazy_regex("ab", tiny)
    eos = lazy.eos_token_id
    q = lazy.run(tiny.encode("ab", add_special_tokens=False))
    assert lazy.is_accepting(q) and lazy.mask(q)[eos]
    assert lazy.step(q, eos) == ENDED and lazy.step(ENDED, eos) == ENDED
    assert lazy.mask(ENDED).sum() == 1 and not lazy.mask(DEAD).any()
    assert lazy.step(lazy.initial, eos) == DEAD


def test_an_empty_class_branch_is_dead(tiny):
    """A fragment of empty language (an empty class) makes NFA states that cannot accept; the
    masks must not lead into them."""
    lazy = lazy_regex(r"a[^\x00-\U0010FFFF]|ab", tiny)
    eager = dfa.regex(r"a[^\x00-\U0010FFFF]|ab", tiny, minimize=False)
    rng = np.random.default_rng(0)
    for _ in range(10):
        _compare_walk(lazy, eager, TokenMasks(eager), lambda n: int(rng.integers(n)), steps=5)


def test_materialize_agrees_within_the_budget(tiny):
    pattern = r"[a-c]{1,3}(x|yz)*"
    lazy = lazy_regex(pattern, tiny)
    a = lazy.materialize(4)
    eager = dfa.regex(pattern, tiny)
    rng = np.random.default_rng(0)
    _assert_accept_alike(a, eager, rng, count=400, max_len=5)
    _assert_accept_alike(lazy.materialize(), eager, rng, count=200, max_len=9)


TREE = {"$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}


def _valid_walks(lazy: LazyTokenDFA, tiny, seed: int, walks: int) -> int:
    """Uniform random walks over ``lazy``'s masks (200 tokens at most); every one that ends
    with EOS must spell a document TREE's validator accepts. Returns how many ended."""
    validator = jsonschema.Draft202012Validator(TREE)
    rng = np.random.default_rng(seed)
    tb = vocab_trie(tiny).token_bytes
    done = 0
    for _ in range(walks):
        q, toks = lazy.initial, []
        for _ in range(200):
            allowed = lazy.allowed_tokens(q)
            t = int(allowed[rng.integers(len(allowed))])
            if t == lazy.eos_token_id:
                break
            toks.append(t)
            q = lazy.step(q, t)
        else:
            continue
        validator.validate(json.loads(b"".join(tb[t] for t in toks).decode()))
        done += 1
    return done


def test_recursive_schema_unrolls_to_valid_documents(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = dfa.lazy_json_schema(TREE, tiny, whitespace="")
    assert isinstance(lazy, LazyTokenDFA)
    ids = lambda s: tiny.encode(s, add_special_tokens=False)  # noqa: E731
    assert lazy.accepts(ids('{"v":1,"kids":[{"v":2,"kids":[]},{"v":3}]}'))
    assert not lazy.accepts(ids('{"v":1,"x":2}'))
    assert _valid_walks(lazy, tiny, seed=0, walks=40) >= 10


def _nest(depth: int) -> str:
    """A TREE document whose kids nest ``depth`` levels below the root."""
    return '{"v":0}' if depth == 0 else '{"v":%d,"kids":[%s]}' % (depth, _nest(depth - 1))


def test_a_recursive_schema_too_large_to_unroll_is_nested_on_demand(tiny, monkeypatch):
    """When the unrolled regex passes MAX_UNROLLED_CHARS, the schema's grammar nests on demand
    (lazy_nesting_subset, 2 · depth grammar levels): the documents of the compiled nesting
    subset of that grammar (``nesting_automaton="minimal"``) and of the unrolled regex on
    shallow, deep and invalid documents, and random walks validate."""
    import sys

    from ctrlg.dfa.json_schema import _compile
    from ctrlg.dfa.json_schema.frag import to_grammar

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unrolled = dfa.lazy_json_schema(TREE, tiny, whitespace="", recursion_depth=2)
        frag, defs = _compile(TREE, "", 2, False)
        minimal = dfa.lazy_grammar(to_grammar(frag, defs), tiny, max_nesting=4,
                                   nesting_automaton="minimal")
    # the package's name in ctrlg.dfa is the json_schema function: the module from sys.modules
    monkeypatch.setattr(sys.modules["ctrlg.dfa.json_schema.lazy"], "MAX_UNROLLED_CHARS", 10)
    with pytest.warns(UserWarning, match="on demand"):
        lazy = dfa.lazy_json_schema(TREE, tiny, whitespace="", recursion_depth=2)
    assert isinstance(lazy, LazyTokenDFA)
    ids = lambda s: tiny.encode(s, add_special_tokens=False)  # noqa: E731
    docs = [_nest(d) for d in range(5)] + ['{"v":1,"kids":[]}', '{"v":1,"x":2}', '{"kids":[]}',
                                          '{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]}',
                                          '{"v":1,"kids":[{"v":2,"kids":[]},{"v":3}]}']
    got = [lazy.accepts(ids(doc)) for doc in docs]
    assert got == [minimal.accepts(ids(doc)) for doc in docs]       # the nesting subset
    assert got == [unrolled.accepts(ids(doc)) for doc in docs]      # what unrolling accepts
    assert got == [True, True, False, False, False, True, False, False, False, True]
    assert _valid_walks(lazy, tiny, seed=1, walks=30) >= 10


def test_unroll_drops_required_recursion():
    chain = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                             "required": ["next"]}}, "$ref": "#/$defs/n"}
    from ctrlg.dfa.json_schema import _compile
    frag, defs = _compile(chain, "", 2, False)
    assert unroll(frag, defs, 3) is None       # every document nests infinitely deep: none


def test_bad_patterns_give_clear_errors(tiny):
    with pytest.raises(RegexError):
        lazy_regex("(ab", tiny)
    with pytest.raises(UnsatisfiableConstraintError):
        lazy_regex(r"[^\x00-\U0010FFFF]", tiny)


@pytest.mark.parametrize("mode", ["logical", "ctrlg"])
def test_processor_takes_a_lazy_constraint_like_the_eager_one(tiny, mode):
    """The processor builds its tables over the lazy automaton's states within the budget
    (:meth:`LazyTokenDFA.within_budget`): the same guided scores as the eager DFA's, step by
    step, and every finished generation is accepted."""
    import torch

    from ctrlg.sampler import ConstraintLogitsProcessor
    from test_guide import random_hmm

    schema = SCHEMAS["person"] if mode == "logical" else {"enum": ["cat", "the mat", 12]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = dfa.json_schema(schema, tiny, whitespace="")
        lazy = dfa.lazy_json_schema(schema, tiny, whitespace="")
    V, eos, n = eager.vocab_size, tiny.eos_token_id, 48
    hmm = random_hmm(4, V, 0) if mode == "ctrlg" else None
    procs = [ConstraintLogitsProcessor(hmm, c, max_new_tokens=n, eos_token_id=eos, mode=mode)
             for c in (eager, lazy)]
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(3, 1, dtype=torch.long)
    done = torch.zeros(3, dtype=torch.bool)
    for _ in range(n):
        logits = torch.randn(3, V, generator=g) * 3
        a, b = (p(ids, logits.clone()) for p in procs)
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        assert torch.allclose(a[torch.isfinite(a)], b[torch.isfinite(b)], atol=1e-5)
        nxt = torch.multinomial(torch.softmax(a, -1), 1, generator=g)[:, 0]
        nxt = torch.where(done, eos, nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        done |= nxt == eos
        if done.all():
            break
    for row in ids[:, 1:].tolist():
        toks = row[:row.index(eos) + 1] if eos in row else row
        assert lazy.accepts(toks) and eager.accepts(toks)


@pytest.mark.parametrize("pattern", PATTERNS + [r"[]a]+(?:x|[)(])", r"(?:a\)b)(?:[\]])+",
                                                r"(a|(?:b))c(?:(?:d|e){2})*", r"(?:x)|(?:x)y"])
def test_shared_group_parser_gives_the_same_ast(pattern):
    from ctrlg.dfa import regex_syntax
    from ctrlg.dfa.lazy import parse
    assert parse(pattern) == regex_syntax.parse(pattern)
    assert parse(pattern) == regex_syntax.parse(pattern)     # second time from the shared groups


def test_shared_group_parser_on_schema_regexes():
    from ctrlg.dfa import regex_syntax
    from ctrlg.dfa.json_schema import schema_to_regex
    from ctrlg.dfa.lazy import parse
    for name, schema in SCHEMAS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                text = schema_to_regex(schema)
            except ValueError:
                continue
        assert parse(text) == regex_syntax.parse(text), name


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_byte_rows_are_the_subset_construction(data):
    """LazyByteDFA's rows against the textbook subset construction, byte by byte, on random
    ε-NFAs whose edges carry overlapping byte ranges (the sweep) or disjoint ones (the fast
    path): every reachable subset's successor on every byte of a small alphabet."""
    from ctrlg.dfa.bytes_dfa import ByteNFA
    from ctrlg.dfa.lazy import LazyByteDFA

    n = data.draw(st.integers(2, 7))
    nfa = ByteNFA()
    for _ in range(n):
        nfa.add_state()
    ranges = st.tuples(st.integers(97, 101), st.integers(0, 2)).map(lambda t: (t[0], t[0] + t[1]))
    for s in range(n):
        for lo, hi in data.draw(st.lists(ranges, max_size=3)):
            nfa.edges[s].append((lo, hi, data.draw(st.integers(0, n - 1))))
        nfa.eps[s].extend(data.draw(st.lists(st.integers(0, n - 1), max_size=2)))
    accept = n - 1

    def closure(states):
        seen, stack = set(states), list(states)
        while stack:
            for t in nfa.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    live = [bool(x) for x in __import__("ctrlg.dfa.lazy", fromlist=["_nfa_live"])._nfa_live(
        nfa, accept, n)]

    def live_part(S):
        return frozenset(x for x in S if live[x])

    b = LazyByteDFA(nfa, 0, accept)
    start = live_part(closure([0])) if live[0] else frozenset()
    todo, seen = [(start, b.initial)], {start}
    while todo:
        S, q = todo.pop()
        assert (q == DEAD) == (not S)
        if q == DEAD:
            continue
        assert bool(b.accepting[q]) == (accept in S)
        row = b.row(q)
        for byte in range(95, 104):
            T = live_part(closure({t for x in S for lo, hi, t in nfa.edges[x] if lo <= byte <= hi}))
            r = int(row[byte])
            assert (r == DEAD) == (not T), (S, byte)
            if T:
                assert set(b._sets[r]) == set(T)
                assert b.run_bytes(q, bytes([byte])) == r
            if T not in seen:
                seen.add(T)
                todo.append((T, r))
    fresh = LazyByteDFA(nfa, 0, accept)          # run_bytes without rows: the per-byte step
    for word in data.draw(st.lists(st.binary(min_size=1, max_size=4).map(
            lambda w: bytes(97 + x % 6 for x in w)), max_size=5)):
        S, q = start, fresh.initial
        for byte in word:
            S = live_part(closure({t for x in S for lo, hi, t in nfa.edges[x] if lo <= byte <= hi}))
        q = fresh.run_bytes(q, word) if q != DEAD else DEAD
        assert (q == DEAD) == (not S)
        if S:
            assert set(fresh._sets[q]) == set(S)
