"""The token index's terminal runs (ctrlg.dfa.cfg.token_index) against a byte-by-byte run of
every suffix through the terminal's DFA, and their sharing between grammars over one
vocabulary: the same run object for the same terminal, the oldest dropped beyond the bound."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlg import dfa
from ctrlg.dfa.cfg import token_index
from ctrlg.dfa.vocab_trie import VocabTrie

TOKENS = [b"(", b")", b"1", b"12", b"+", b"1+", b"+(", b"))", b" ", b" 1", b"a", b"ab1", b"2)"]
ARITH = 'start: e\ne: e "+" t | t\nt: NUM | "(" e ")"\nNUM: /[0-9]+/\n%ignore " "\n'
OTHER = 'start: "[" NUM ("," NUM)* "]" | "(" start ")"\nNUM: /[0-9]+/\n'


def _brute(dfa_t, q, data: bytes):
    """(state after all of data or 0, the k < len(data) after which the DFA accepts)."""
    ends = []
    for k, b in enumerate(data):
        q = int(dfa_t.table[q, b])
        if q == 0:
            return 0, ends
        if k + 1 < len(data) and dfa_t.accepting[q]:
            ends.append(k + 1)
    return q, ends


@pytest.fixture()
def trie():
    return VocabTrie.from_token_bytes(TOKENS + [b""], eos_token_id=len(TOKENS))


def test_runs_equal_a_byte_by_byte_run_of_every_suffix(trie):
    g = dfa.lazy_grammar(ARITH, trie)
    index = g.index
    flat = bytes(index.flat.astype(np.uint8))
    for t, d in enumerate(g.recogniser.dfas):
        run = index.start_run(t)
        for i in range(index.num_suffixes):
            end = int(index.base[np.searchsorted(index.base, i, side="right")])
            final, ends = _brute(d, d.initial, flat[i:end])
            assert int(run.final[i]) == final
            assert run.dst[run.ptr[i]:run.ptr[i + 1]].tolist() == [i + k for k in ends]
        for q in range(1, d.num_states):
            run = index.state_run(t, q)
            for v, data in enumerate(index.token_bytes):
                final, ends = _brute(d, q, data) if data else (0, [])
                assert int(run.final[v]) == final
                base = int(index.base[v])
                assert run.dst[run.ptr[v]:run.ptr[v + 1]].tolist() == [base + k for k in ends]


def test_grammars_over_one_vocabulary_share_a_terminal_s_runs(trie, monkeypatch):
    a, b = dfa.lazy_grammar(ARITH, trie), dfa.lazy_grammar(OTHER, trie)
    assert a.index.vocabulary is b.index.vocabulary
    num = lambda g: next(k for k, t in enumerate(g.recogniser.grammar.terminals)   # noqa: E731
                         if t.name == "NUM")
    run = a.index.start_run(num(a))
    assert b.index.start_run(num(b)) is run
    assert not run.final.flags.writeable
    # a bound of one run's bytes: storing another drops the oldest
    vocabulary = a.index.vocabulary
    vocabulary.forget_runs()
    size = run.nbytes
    monkeypatch.setattr(token_index, "MAX_SHARED_RUN_BYTES", size)
    first = vocabulary.shared_run("x", lambda: a.index._run(num(a), 1, np.arange(vocabulary.num_suffixes),
                                                            vocabulary.suffix_left))
    vocabulary.shared_run("y", lambda: a.index._run(num(a), 1, np.arange(vocabulary.num_suffixes),
                                                    vocabulary.suffix_left))
    assert list(vocabulary.runs) == ["y"] and sum(r.nbytes for r in vocabulary.runs.values()) == size
    assert first.final.tolist() == vocabulary.runs["y"].final.tolist()


def test_clearing_the_shared_caches_empties_them_and_keeps_the_masks(trie):
    """``clear_shared_caches`` empties the terminal runs, the terminal DFAs and the Lark texts
    read; a constraint built before keeps answering, and one built after gives the same masks."""
    from ctrlg.dfa.cfg import earley, lark_syntax
    from ctrlg.dfa.cfg.constraint import clear_shared_caches
    from ctrlg.guide.feasibility import Feasibility
    from ctrlg.guide.masks import token_mask

    eos, n = len(TOKENS), 5

    def masks_along(g, walk):
        provider = token_mask(g, Feasibility(g.dfa, n, eos_token_id=eos))
        cursor, q, out = provider.start(), g.dfa.initial, []
        for k, v in enumerate(walk):
            out.append(provider.allowed(cursor, q, n - k).tolist())
            cursor, q = provider.advance(cursor, v), g.dfa.step(q, v)
        return out

    walk = [TOKENS.index(t) for t in (b"(", b"1+", b"12", b")")]
    before = dfa.lazy_grammar(ARITH, trie)
    want = masks_along(before, walk)
    vocabulary = before.index.vocabulary
    assert vocabulary.runs and earley._TERMINAL_DFAS
    assert lark_syntax._read_lark.cache_info().currsize
    clear_shared_caches()
    assert not vocabulary.runs and not earley._TERMINAL_DFAS
    assert lark_syntax._read_lark.cache_info().currsize == 0
    assert masks_along(before, walk) == want
    after = dfa.lazy_grammar(ARITH, trie)
    assert after.index.vocabulary is vocabulary and masks_along(after, walk) == want


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(0, 2**32 - 1),
       st.lists(st.binary(min_size=0, max_size=6).map(lambda b: bytes(x % 4 for x in b)),
                min_size=1, max_size=12))
def test_the_compiled_run_equals_the_numpy_columns_and_a_byte_by_byte_run(states, seed, tokens):
    """``terminal_run`` (the compiled loop) and ``terminal_run_columns`` (numpy) give one run,
    and both the byte-by-byte one, on random DFAs over bytes 0-3 (state 0 dead), from every
    state, over every suffix of random tokens (empty ones included)."""
    rng = np.random.default_rng(seed)
    table = np.zeros((states, 256), dtype=np.int32)
    table[1:, :4] = rng.integers(0, states, size=(states - 1, 4))
    accepting = rng.random(states) < 0.5
    accepting[0] = False
    Dfa = type("Dfa", (), {})
    d = Dfa()
    d.table, d.accepting = table, accepting
    vocabulary = token_index.Suffixes.of(tokens)
    flat = bytes(vocabulary.flat.astype(np.uint8))
    for q in range(1, states):
        for starts, left in ((np.arange(vocabulary.num_suffixes), vocabulary.suffix_left),
                             (vocabulary.base[:-1], vocabulary.length)):
            a = token_index.terminal_run(table, accepting, vocabulary.flat, starts, left, q)
            b = token_index.terminal_run_columns(table, accepting, vocabulary.flat, starts, left, q)
            assert a.final.tolist() == b.final.tolist()
            assert a.ptr.tolist() == b.ptr.tolist() and a.dst.tolist() == b.dst.tolist()
            for i, (s, n) in enumerate(zip(starts.tolist(), left.tolist())):
                final, ends = _brute(d, q, flat[s:s + n]) if n else (0, [])
                assert int(a.final[i]) == final
                assert a.dst[a.ptr[i]:a.ptr[i + 1]].tolist() == [s + k for k in ends]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), max_size=3), min_size=1, max_size=12),
       st.lists(st.integers(0, 11), max_size=20), st.booleans())
def test_pairs_equal_the_per_entry_definition(lists, picks, ordered):
    """``Run.pairs`` (a compiled loop) gives every (position, destination) of the entries, in
    order, repeats and unordered entries included, as the per-entry definition does."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    dst = np.array([d for x in lists for d in x], dtype=np.int64)
    run = token_index.Run(final=np.zeros(len(lists), dtype=np.int32), ptr=ptr, dst=dst)
    entries = np.array([p % len(lists) for p in picks], dtype=np.int64)
    if ordered:
        entries = np.sort(entries)
    expected = [(i, d) for i, e in enumerate(entries.tolist()) for d in lists[e]]
    where, got = run.pairs(entries)
    assert list(zip(where.tolist(), got.tolist())) == expected
