"""ctrlg.lm.mbr: BLEU+1 against sacrebleu's sentence BLEU, the matrix of utilities against it pair
by pair, the MBR pick against an explicit expected-utility search, the limits in T, and the
errors."""

import math

import pytest
from hypothesis import given, settings, strategies as st
from sacrebleu.metrics.bleu import BLEU

from ctrlg.lm.mbr import (MBRInputError, NgramStatistics, expected_utilities, mbr_pick,
                          sentence_bleu_plus_one, utility_matrix)

WORDS = st.lists(st.sampled_from(["a", "dog", "runs", "the", "field", "in", "green"]), min_size=1, max_size=9)
SACREBLEU = BLEU(smooth_method="add-k", smooth_value=1, effective_order=True, tokenize="none")


@settings(max_examples=200, deadline=None)
@given(WORDS, WORDS)
def test_bleu_plus_one_equals_sacrebleus_sentence_bleu(hypothesis, reference):
    ours = sentence_bleu_plus_one(NgramStatistics(hypothesis), NgramStatistics(reference))
    theirs = SACREBLEU.sentence_score(" ".join(hypothesis), [" ".join(reference)]).score / 100
    assert ours == pytest.approx(theirs, abs=1e-12)


REPEATING = st.lists(st.sampled_from(["a", "dog", "a dog"]), max_size=5).map(
    lambda parts: " ".join(parts).split())     # repeated n-grams: clipped counts above 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(WORDS, REPEATING), min_size=1, max_size=5),
       st.lists(st.one_of(WORDS, REPEATING), min_size=1, max_size=5))
def test_the_utility_matrix_is_bleu_plus_one_of_every_pair(hypotheses, references):
    hyps = [NgramStatistics(h) for h in hypotheses]
    refs = [NgramStatistics(r) for r in references]
    matrix = utility_matrix(hyps, refs)
    assert matrix.shape == (len(hyps), len(refs))
    for i, h in enumerate(hyps):
        for j, r in enumerate(refs):
            assert matrix[i, j] == pytest.approx(sentence_bleu_plus_one(h, r), abs=1e-12)


def test_an_identical_sentence_has_utility_one_and_an_empty_one_zero():
    stats = NgramStatistics("a dog runs".split())
    assert sentence_bleu_plus_one(stats, stats) == pytest.approx(1.0)
    assert sentence_bleu_plus_one(NgramStatistics([]), stats) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(WORDS, st.floats(-30, 0)), min_size=1, max_size=6),
       st.sampled_from([0.25, 1.0, 4.0]))
def test_the_pick_maximises_the_expected_utility_by_enumeration(candidates, temperature):
    tokens = [c[0] for c in candidates]
    scores = [c[1] for c in candidates]
    top = max(scores)
    raw = [math.exp((s - top) / temperature) for s in scores]
    weights = [r / sum(raw) for r in raw]
    expected = [sum(w * SACREBLEU.sentence_score(" ".join(h), [" ".join(r)]).score / 100
                    for w, r in zip(weights, tokens)) for h in tokens]
    assert expected_utilities(tokens, scores, temperature=temperature, min_weight=0) == \
        pytest.approx(expected, abs=1e-9)
    best = mbr_pick(tokens, scores, temperature=temperature, min_weight=0)
    assert expected[best] == pytest.approx(max(expected), abs=1e-9)


def test_a_cold_temperature_is_the_plain_rerank_and_a_hot_one_the_consensus():
    tokens = [s.split() for s in ["illustration of a dog", "a dog runs in the field",
                                  "the dog runs in a field", "a dog runs across the field"]]
    scores = [-5.0, -9.0, -9.5, -10.0]
    assert mbr_pick(tokens, scores, temperature=0.01) == 0          # the highest score
    assert mbr_pick(tokens, scores, temperature=100.0) in (1, 3)    # shares most with the others
    assert mbr_pick(tokens, scores, temperature=100.0) != 0


def test_bad_input_is_named():
    with pytest.raises(MBRInputError, match="no candidates"):
        mbr_pick([], [])
    with pytest.raises(MBRInputError, match="2 candidates but 1 scores"):
        mbr_pick([["a"], ["b"]], [0.0])
    with pytest.raises(MBRInputError, match="temperature"):
        mbr_pick([["a"]], [0.0], temperature=0)
    with pytest.raises(MBRInputError, match="NaN"):
        mbr_pick([["a"]], [float("nan")])
