"""ReLM's validation tasks (ctrlg.relm.toxicity / memorization / bias, ctrlg.data.insults) against
brute force: the insult sentences against a naive scan, the known sequences against their
definitions, number windows against enumeration, extraction success against the LM's own top-k
ranks, edited matches against the Levenshtein distance, χ² against scipy; bad input gives an
empty result with its reason."""

import itertools
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from scipy.stats import chi2_contingency

from ctrlg.data import DatasetError
from ctrlg.data.insults import (InsultSentence, find_insult_sentences, load_insult_words,
                                split_sentences)
from ctrlg.relm.bias import BiasConfiguration, chi2_test, levenshtein, nearest, \
    sample_configuration
from ctrlg.relm.memorization import (Verifier, known_sequences, number_windows, run_sampling,
                                     run_shortest_path)
from ctrlg.relm.toxicity import Configuration, attempt, ratios, summarise
from tiny_lms import tiny_llama


@pytest.fixture(scope="module")
def tok():
    from ctrlg.lm.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def lm(tok):
    return tiny_llama(len(tok), seed=0, head_scale=20.0, max_positions=128,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)


# ---------------------------------------------------------------------- insults
def test_word_list_comes_from_the_package_and_selection_is_checked():
    words = load_insult_words()
    assert len(words) > 800 and "bitch" in words
    assert load_insult_words(["Bitch", "jerk", "bitch"]) == ["bitch", "jerk"]
    with pytest.raises(DatasetError, match="empty"):
        load_insult_words([])
    with pytest.raises(DatasetError, match="'kindness'"):
        load_insult_words(["jerk", "kindness"])


def test_sentences_split_at_ends_and_line_breaks():
    text = 'He left. "You jerk!" she said.\nThen silence?  Yes… ok'
    assert split_sentences(text) == ["He left.", '"You jerk!"', "she said.", "Then silence?",
                                     "Yes… ok"]


def test_insult_sentences_equal_a_naive_scan():
    corpus = ["You are a jerk. A jerk indeed. Jerky meat is fine.",
              "Stupid! That was stupid of him.\nNobody is a JERK here.",
              "Nothing here. You are a jerk."]
    words = ["jerk", "stupid"]
    found = find_insult_sentences(corpus, words)
    expected = {}
    for index, text in enumerate(corpus):
        for sentence in split_sentences(text):
            hits = [(m.start(), m) for w in words
                    for m in re.finditer(rf"\b{w}\b", sentence, re.IGNORECASE)]
            if hits and sentence not in expected:
                start, match = min(hits, key=lambda h: h[0])
                expected[sentence] = (start, match.end(), index)
    assert sorted(s.sentence for s in found) == sorted(expected)
    assert [len(s.sentence) for s in found] == sorted(len(s.sentence) for s in found)
    for s in found:
        assert (s.start, s.end, s.source) == expected[s.sentence]
        assert s.prefix + s.insult == s.query
        assert s.query.lower().endswith(s.word) and not s.prefix.endswith(" ")
    assert "Jerky meat is fine." not in {s.sentence for s in found}
    assert find_insult_sentences(["Nothing to see."], words) == []
    with pytest.raises(DatasetError, match="empty"):
        find_insult_sentences(corpus, [])


# ---------------------------------------------------------------------- memorisation
def test_known_sequences_follow_their_definitions():
    seqs = known_sequences(digits=3)
    assert all(t < 1000 for terms in seqs.values() for t in terms)
    assert seqs["primes A000040"] == [n for n in range(1000)
                                      if n > 1 and all(n % d for d in range(2, n))]
    fib = seqs["Fibonacci A000045"]
    assert fib[:3] == [0, 1, 1] and all(a + b == c for a, b, c in zip(fib, fib[1:], fib[2:]))
    assert fib[-1] + fib[-2] >= 1000
    assert seqs["Catalan A000108"] == [math.comb(2 * n, n) // (n + 1) for n in range(8)]
    assert seqs["factorials A000142"] == [math.factorial(n) for n in range(7)]
    assert seqs["squares A000290"] == [n * n for n in range(32)]


def test_verifier_accepts_exactly_the_windows():
    verifier = Verifier(window=3, digits=2)
    seqs = known_sequences(digits=2)
    windows = {", ".join(map(str, terms[i:i + 3]))
               for terms in seqs.values() for i in range(len(terms) - 2)}
    assert set(verifier.windows) == windows
    assert verifier.verify(" 2, 3, 5") in ("primes A000040", "Fibonacci A000045")
    assert verifier.verify("1, 2, 4") == "powers of 2 A000079"
    assert verifier.verify("1, 2, 7") is None and verifier.verify("02, 3, 5") is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="12, a", max_size=24), st.integers(2, 4))
def test_number_windows_equal_enumeration(text, window):
    got = number_windows(text, window)
    expected = [text[i:j] for i, j in itertools.combinations(range(len(text) + 1), 2)
                if re.fullmatch(r"\d+(, \d+)*", text[i:j])
                and text[i:j].count(", ") == window - 1
                and (i == 0 or not text[i - 1].isdigit()) and (j == len(text) or not
                                                                text[j].isdigit())]
    assert sorted(got) == sorted(expected)


def test_shortest_path_candidates_are_its_results_and_verified_by_the_verifier(lm, tok):
    verifier = Verifier(window=2, digits=1)
    context = [0] + tok("Numbers:", add_special_tokens=False)["input_ids"]
    row = run_shortest_path(lm, tok, context, "[0-9], [0-9]", verifier, num_results=None,
                            top_k=None, encodings="canonical", max_tokens=4, batch_size=7)
    assert row["attempts"] == row["candidates"] == row["unique"] == 100  # every "d, d"
    assert row["duplicate_rate"] == 0.0
    assert row["verified"] == len(verifier.windows) == len(row["curve"])
    assert row["curve"] == sorted(row["curve"])


def test_sampling_candidates_are_the_windows_of_the_samples(lm, tok):
    verifier = Verifier(window=2, digits=2)
    context = [0] + tok("1, 2,", add_special_tokens=False)["input_ids"]
    a = run_sampling(lm, tok, context, verifier, stop_length=6, num_samples=10, top_k=None,
                     batch_size=4, seed=3)
    b = run_sampling(lm, tok, context, verifier, stop_length=6, num_samples=10, top_k=None,
                     batch_size=4, seed=3)
    assert {k: a[k] for k in ("candidates", "unique", "verified")} == \
        {k: b[k] for k in ("candidates", "unique", "verified")}
    assert a["attempts"] == 10 and a["unique"] <= a["candidates"]
    assert 0.0 <= a["duplicate_rate"] <= 1.0
    assert a["duplicate_rate"] == pytest.approx(1 - a["unique"] / a["candidates"]
                                                if a["candidates"] else 0.0)


# ---------------------------------------------------------------------- toxicity
def _item(sentence, word):
    start = sentence.lower().index(word)
    return InsultSentence(sentence, start, start + len(word), word, 0)


@torch.no_grad()
def _ranks(lm, context, ids):
    """Rank of each token of ``ids`` among the LM's next-token scores after context + earlier."""
    logits = lm(input_ids=torch.tensor([context + ids])).logits[0]
    n = len(context)
    return [int((logits[n - 1 + i] > logits[n - 1 + i, t]).sum()) for i, t in enumerate(ids)]


def test_canonical_prompted_success_is_the_top_k_rule_on_the_insult(lm, tok):
    item = _item("You are a jerk", "jerk")
    context = [0] + tok(item.prefix, add_special_tokens=False)["input_ids"]
    ids = tok(item.insult, add_special_tokens=False)["input_ids"]
    worst = max(_ranks(lm, context, ids))
    for k in (worst, worst + 1, 50_000):
        got = attempt(lm, tok, item, "prompted", Configuration("canonical", 0), top_k=k,
                      bos_id=0)
        assert bool(got["matches"]) == (worst < k), (k, worst)
        if got["matches"]:
            assert got["matches"][0]["text"] == " jerk" and got["matches"][0]["exact"]
        else:
            assert "top-" in got["message"]


def test_unprompted_edit_matches_are_distinct_near_strings_in_probability_order(lm, tok):
    item = _item("a jerk", "jerk")
    got = attempt(lm, tok, item, "unprompted", Configuration("all", 1), top_k=None,
                  max_results=30, bos_id=0)
    texts = [m["text"] for m in got["matches"]]
    assert len(texts) == 30
    assert all(levenshtein(t, "a jerk") <= 1 for t in texts)
    probs = [m["log_prob"] for m in got["matches"]]
    assert all(a >= b - 1e-5 for a, b in zip(probs, probs[1:]))
    assert all(m["insult_kept"] == bool(re.search(r"\bjerk\b", m["text"], re.I))
               for m in got["matches"])


def test_an_empty_language_or_budget_gives_an_empty_result_with_its_reason(lm, tok):
    item = _item("Stupid", "stupid")
    got = attempt(lm, tok, item, "unprompted", Configuration("canonical", 0), top_k=1,
                  bos_id=0)
    ranks = _ranks(lm, [0], tok("Stupid", add_special_tokens=False)["input_ids"])
    assert bool(got["matches"]) == (max(ranks) < 1)
    if not got["matches"]:
        assert got["message"]
    long_item = _item("x" * 1700 + " jerk", "jerk")     # past the LM's positions
    got = attempt(lm, tok, long_item, "unprompted", Configuration("all", 1), bos_id=0)
    assert got["matches"] == [] and "ContextLengthError" in got["message"]


def test_summary_and_ratios():
    configs = [Configuration("canonical", 0), Configuration("all", 1)]
    m = {"insult_kept": True}
    attempts = [
        {"attack": "prompted", "configuration": "canonical+0 edits", "matches": [m],
         "seconds": 1.0},
        {"attack": "prompted", "configuration": "canonical+0 edits", "matches": [], "seconds": 1.0},
        {"attack": "prompted", "configuration": "all+1 edit", "matches": [m], "seconds": 2.0},
        {"attack": "prompted", "configuration": "all+1 edit",
         "matches": [{"insult_kept": False}], "seconds": 2.0},
        {"attack": "unprompted", "configuration": "canonical+0 edits", "matches": [],
         "seconds": 1.0},
        {"attack": "unprompted", "configuration": "all+1 edit", "matches": [m] * 4,
         "seconds": 1.0}]
    rows = summarise(attempts, configs)
    assert [(r["attack"], r["success_pct"], r["success_kept_pct"], r["per_input"])
            for r in rows] == [("prompted", 50.0, 50.0, 0.5), ("prompted", 100.0, 50.0, 1.0),
                               ("unprompted", 0.0, 0.0, 0.0), ("unprompted", 100.0, 100.0, 4.0)]
    assert ratios(rows, "canonical+0 edits", "all+1 edit") == {"prompted": 2.0,
                                                                "unprompted": None}


# ---------------------------------------------------------------------- bias
@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab", max_size=5), st.text(alphabet="abc", max_size=5))
def test_levenshtein_equals_the_recursive_definition(a, b):
    def ref(x, y):
        if not x or not y:
            return len(x) + len(y)
        return min(ref(x[1:], y) + 1, ref(x, y[1:]) + 1, ref(x[1:], y[1:]) + (x[0] != y[0]))

    assert levenshtein(a, b) == ref(a, b)


def test_chi2_is_scipys_independence_test_on_drawn_columns():
    table = np.array([[10, 0, 5, 7], [3, 0, 9, 8]])
    chi2, p, dof, _ = chi2_contingency(table[:, [0, 2, 3]])
    assert chi2_test(table) == {"chi2": pytest.approx(chi2), "p_value": pytest.approx(p),
                                "dof": dof}
    assert math.isnan(chi2_test(np.array([[4, 0], [5, 0]]))["p_value"])
    assert nearest("scence", ["art", "science", "sciences"]) == 1


@pytest.mark.parametrize("config", [BiasConfiguration(True, "canonical", 0),
                                    BiasConfiguration(True, "all", 1),
                                    BiasConfiguration(False, "canonical", 1)])
def test_bias_samples_stay_within_the_configured_language(lm, tok, config):
    professions = ["art", "math"]
    row = sample_configuration(lm, tok, "The {gender} was", ["man", "woman"], professions,
                               config, num_samples=6, bos_id=0, seed=1, batch_size=4,
                               max_tokens=24)
    counts = row["counts"]
    assert sum(sum(c.values()) for c in counts.values()) == len(row["samples"]) == 12
    for s in row["samples"]:
        exact = f"The {s['gender']} was {s['profession']}"
        assert s["distance"] == levenshtein(s["text"], exact) <= config.edits
        if config.prefix:
            assert s["text"].startswith(f"The {s['gender']} was")
    assert 0.0 <= row["p_value"] <= 1.0 or math.isnan(row["p_value"])
