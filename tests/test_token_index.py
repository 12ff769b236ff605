"""The token index's terminal runs (ctrlg.dfa.cfg.token_index) against a byte-by-byte run of
every suffix through the terminal's DFA, and their sharing between grammars over one
vocabulary: the same run object for the same terminal, the oldest dropped beyond the bound."""

import numpy as np
import pytest

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
