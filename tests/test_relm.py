"""ReLM queries on a tiny random Llama over the SmolLM2 vocabulary: shortest-path results come
in non-increasing probability and equal brute force (enumerate the finite language, score every
string with the LM); the top-k decision rule, prefixes, sampling, edit distance and filters."""

import itertools
import re

import pytest
import torch

from ctrlg.dfa.bytes_dfa import compile_bytes_dfa
from ctrlg.errors import ConstraintError
from ctrlg.relm import Query, exclude_words, sample, search
from ctrlg.relm.edits import within_edit_distance
from tiny_lms import NoCacheLM, tiny_llama


@pytest.fixture(scope="module")
def tok():
    from ctrlg.lm.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def lm(tok):
    return tiny_llama(len(tok), seed=0, head_scale=40.0)


@torch.no_grad()
def _score(lm, context, ids):
    logits = lm(input_ids=torch.tensor([context + ids])).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    n = len(context)
    return [float(lp[n - 1 + i, t]) for i, t in enumerate(ids)], lp


def _next_token_log_probs(lm, sequences):
    """The reference: each sequence run on its own, no cache, no padding."""
    return torch.stack([_score(lm, list(seq), [])[1][-1] for seq in sequences])


def _brute_force(lm, tok, strings, top_k=None, eos=False, prefix_len=None, context=None):
    context = context or [tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id]
    out = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        full = ids + ([tok.eos_token_id] if eos else [])
        steps, lp = _score(lm, context, full)
        if top_k is not None:
            start = prefix_len(s) if prefix_len else 0
            ok = all(int((lp[len(context) - 1 + i] > lp[len(context) - 1 + i, t]).sum()) < top_k
                     for i, t in enumerate(full) if i >= start)
            if not ok:
                continue
        out.append((sum(steps), s))
    return sorted(out, reverse=True)


WORDS = ("(the|a) (cat|dog|bird)s?", ["the", "a"], ["cat", "dog", "bird"])


def _word_strings():
    return [f"{a} {b}{s}" for a in WORDS[1] for b in WORDS[2] for s in ("", "s")]


@pytest.mark.parametrize("batch_size", [1, 5])
def test_shortest_path_matches_brute_force(lm, tok, batch_size):
    results = list(search(lm, tok, Query(WORDS[0]), num_results=None, batch_size=batch_size))
    expected = _brute_force(lm, tok, _word_strings())
    assert [r.text for r in results] == [s for _, s in expected]
    for r, (score, _) in zip(results, expected):
        assert r.log_prob == pytest.approx(score, abs=1e-4)
    probs = [r.log_prob for r in results]
    assert all(a >= b for a, b in zip(probs, probs[1:]))


def test_long_context_is_encoded_once_and_matches_brute_force(lm, tok):
    from ctrlg.relm.query import _ContextScorer

    context = tok.encode("Once upon a time there was a small town by the sea, and",
                         add_special_tokens=False)
    scorer = _ContextScorer(lm, context)
    assert scorer.layers is not None                      # the KV-cache path is the one tested
    suffixes = [(), (5,), (7, 8, 9), (1, 2), ()]
    cached = scorer(suffixes)
    full = _next_token_log_probs(lm, [context + list(s) for s in suffixes])
    assert torch.allclose(cached, full, atol=1e-4)
    assert torch.equal(scorer(suffixes), cached)          # the stored cache is not mutated
    steps, _ = _score(lm, context, [7, 8, 9])             # prefix scoring in sample()
    assert scorer.token_log_probs([7, 8, 9]).tolist() == pytest.approx(steps, abs=1e-4)

    results = list(search(lm, tok, Query(WORDS[0]), num_results=None, batch_size=3,
                          context_ids=context))
    expected = _brute_force(lm, tok, _word_strings(), context=context)
    assert [r.text for r in results] == [s for _, s in expected]
    for r, (score, _) in zip(results, expected):
        assert r.log_prob == pytest.approx(score, abs=1e-4)


def test_models_without_a_reusable_cache_fall_back_to_full_sequences(lm):
    from ctrlg.relm.query import _ContextScorer

    context = [3, 4, 5, 6]
    scorer = _ContextScorer(NoCacheLM(lm), context)
    assert scorer.layers is None
    suffixes = [(9,), (), (10, 11)]
    full = _next_token_log_probs(lm, [context + list(s) for s in suffixes])
    assert torch.allclose(scorer(suffixes), full, atol=1e-5)
    steps, _ = _score(lm, context, [9, 10])
    assert scorer.token_log_probs([9, 10]).tolist() == pytest.approx(steps, abs=1e-5)


def test_thousands_of_siblings_come_out_in_probability_order(lm, tok):
    """Lazy expansion: one node with every ' word' token as a child; the first 40 results are
    the 40 most likely such tokens, in order."""
    from ctrlg.dfa.vocab_trie import vocabulary_index

    query = Query(r" [a-z]+", encodings="all", max_tokens=1)
    results = list(search(lm, tok, query, num_results=40))
    _, lp = _score(lm, [tok.bos_token_id], [0])
    first = lp[0]
    index = vocabulary_index(tok)
    matching = [t for t in range(len(tok))
                if re.fullmatch(rb" [a-z]+", index.tokens[t])]
    assert len(matching) > 5000
    best = sorted(matching, key=lambda t: -float(first[t]))[:40]
    assert [r.token_ids for r in results] == [(t,) for t in best]


def test_top_k_and_eos(lm, tok):
    query = Query(WORDS[0], top_k=2000, require_eos=True)
    results = list(search(lm, tok, query, num_results=None))
    expected = _brute_force(lm, tok, _word_strings(), top_k=2000, eos=True)
    assert [r.text for r in results] == [s for _, s in expected]
    assert all(r.token_ids[-1] == tok.eos_token_id for r in results)
    for r, (score, _) in zip(results, expected):
        assert r.log_prob == pytest.approx(score, abs=1e-4)


def test_prefix_is_exempt_from_the_decision_rule(lm, tok):
    query = Query(" (cat|dog)", prefix="(the|a)", top_k=3000)
    results = list(search(lm, tok, query, num_results=None))
    strings = [f"{a} {b}" for a in ("the", "a") for b in ("cat", "dog")]
    expected = _brute_force(lm, tok, strings, top_k=3000,
                            prefix_len=lambda s: len(tok.encode(s.split(" ")[0],
                                                                add_special_tokens=False)))
    assert [r.text for r in results] == [s for _, s in expected]
    assert all(r.prefix_length == 1 for r in results)


def test_filters_and_streaming(lm, tok):
    query = Query(WORDS[0], filters=(exclude_words(["the"]),))
    results = list(search(lm, tok, query, num_results=3))
    assert len(results) == 3 and all(r.text.startswith("a ") for r in results)


def test_sampling_respects_the_language_and_seed(lm, tok):
    query = Query(WORDS[0], max_tokens=6)
    a = sample(lm, tok, query, num_samples=12, seed=3)
    b = sample(lm, tok, query, num_samples=12, seed=3)
    assert [r.text for r in a] == [r.text for r in b]
    assert a and all(re.fullmatch(WORDS[0], r.text) for r in a)
    for r in a:
        steps, _ = _score(lm, [tok.bos_token_id], list(r.token_ids))
        assert r.log_prob == pytest.approx(sum(steps), abs=1e-3)


def test_prefix_sampling_is_uniform_over_prefix_paths(lm, tok):
    query = Query(" cat", prefix="(a|b|c|d)", max_tokens=4)
    results = sample(lm, tok, query, num_samples=400, seed=0, batch_size=100)
    counts = {p: sum(r.text.startswith(p) for r in results) for p in "abcd"}
    assert sum(counts.values()) == 400
    assert all(60 <= c <= 140 for c in counts.values()), counts


def _edit_distance(a, b):
    d = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, cb in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (ca != cb))
    return d[-1]


def test_edit_distance_preprocessor_by_enumeration():
    words = ["cat", "do"]
    base = compile_bytes_dfa("cat|do")
    widened = within_edit_distance(base, 1, symbols="acdotx")
    for n in range(5):
        for chars in itertools.product("acdotxz", repeat=n):
            s = "".join(chars)
            # 'z' is not an edit symbol and occurs in no word, so it can never appear
            expected = "z" not in s and min(_edit_distance(s, w) for w in words) <= 1
            assert widened.fullmatch(s.encode()) == expected, s


def test_edit_distance_query_finds_typos(lm, tok):
    query = Query("cat", edit_distance=1, edit_symbols="abct", encodings="all", max_tokens=4)
    results = list(search(lm, tok, query, num_results=5))
    assert len(results) == 5
    assert all(_edit_distance(r.text, "cat") <= 1 for r in results)


def test_bad_queries():
    with pytest.raises(ConstraintError, match="top_k"):
        Query("a", top_k=0)
    with pytest.raises(ConstraintError, match="encodings"):
        Query("a", encodings="both")
    with pytest.raises(ConstraintError, match="edit distance"):
        within_edit_distance(compile_bytes_dfa("a"), -1)
    with pytest.raises(ConstraintError, match="edit symbols"):
        within_edit_distance(compile_bytes_dfa("a"), 1, symbols="é")


def test_search_stats_say_whether_the_expansion_budget_stopped_it(lm, tok):
    stats = {}
    results = list(search(lm, tok, Query(WORDS[0]), num_results=None, stats=stats))
    assert len(results) == 12 and stats["budget_spent"] is False and stats["expansions"] > 1
    stats = {}
    assert list(search(lm, tok, Query(WORDS[0]), num_results=None, max_expansions=1,
                       batch_size=1, stats=stats)) == []
    assert stats == {"expansions": 2, "budget_spent": True}
