"""Metrics on tiny inputs whose values can be checked by hand."""

import math

import pytest

from ctrlg import metrics
from ctrlg.metrics import MetricInputError


def test_tokenize_for_eval_lowercases_and_drops_punctuation():
    assert metrics.tokenize_for_eval("The Dog's ball, 3 times!") == "the dog's ball 3 times"


def test_bleu4_identical_is_100_and_disjoint_is_0():
    refs = [["the cat sat on the mat"], ["a dog runs in the big field"]]
    assert metrics.bleu4(["The cat sat on the mat.", "A dog runs in the big field"], refs) == \
        pytest.approx(100.0)
    assert metrics.bleu4(["x y z w v", "q r s t u"], refs) == pytest.approx(0.0, abs=1e-6)


def test_bleu4_hand_computed_with_brevity_penalty():
    # hypothesis "a b c d e" vs reference "a b c d e f g h": every n-gram matches (p_n = 1),
    # brevity penalty exp(1 - 8/5)
    score = metrics.bleu4(["a b c d e"], [["a b c d e f g h"]])
    assert score == pytest.approx(100 * math.exp(1 - 8 / 5), rel=1e-6)


def test_rouge_l_lcs_by_hand():
    # LCS("a b c d", "a c d e") = 3 → P = R = 3/4; the better of two references counts
    assert metrics.rouge_l(["a b c d"], [["a c d e", "x"]]) == pytest.approx(75.0)
    # averaged over items: 75 and 100
    assert metrics.rouge_l(["a b c d", "k"], [["a c d e"], ["k"]]) == pytest.approx(87.5)


def test_cider_identical_beats_partial_and_disjoint_is_zero():
    refs = [["a man rides a horse"], ["two dogs play in snow"], ["a red car parks outside"]]
    perfect = metrics.cider(["a man rides a horse", "two dogs play in snow",
                             "a red car parks outside"], refs)
    partial = metrics.cider(["a man walks", "two cats sleep", "a blue car"], refs)
    disjoint = metrics.cider(["q", "r", "s"], refs)
    assert perfect > partial > disjoint == 0.0
    # a hypothesis equal to its single reference has cosine 1 at every n, so CIDEr-D = 10
    assert perfect == pytest.approx(10.0, rel=1e-6)


def test_success_rate_and_keyword_coverage():
    assert metrics.success_rate([True, False, True, True]) == 75.0
    groups = [["stand", "stands", "stood"], ["field", "fields"]]
    assert metrics.keyword_groups_covered("He stood in the Field.", groups)
    assert not metrics.keyword_groups_covered("He stood in the fieldhouse.", groups)
    assert not metrics.keyword_groups_covered("Standing fields", groups)


def test_bad_inputs_raise_value_errors():
    with pytest.raises(MetricInputError, match="2 hypotheses but 1"):
        metrics.bleu4(["a", "b"], [["a"]])
    with pytest.raises(MetricInputError, match="item 0"):
        metrics.rouge_l(["a"], [[]])
    with pytest.raises(ValueError, match="at least one"):
        metrics.success_rate([])
    with pytest.raises(MetricInputError, match="empty"):
        metrics.keyword_groups_covered("x", [[]])


@pytest.mark.heavy  # starts a JVM: ~10-50 s
@pytest.mark.skipif(not metrics.java_available(), reason="METEOR needs java")
def test_meteor_identical_beats_disjoint():
    refs = [["a man rides a horse"], ["two dogs play in snow"]]
    same = metrics.meteor(["a man rides a horse", "two dogs play in snow"], refs)
    other = metrics.meteor(["purple", "seven"], refs)
    assert same > 90.0 and other == pytest.approx(0.0, abs=1e-6)


def test_evaluate_generations_row_keys():
    row = metrics.evaluate_generations(["a b c d"], [["a c d e"]], [True], with_meteor=False)
    assert row["rouge_l"] == pytest.approx(75.0)
    assert row["success"] == 100.0 and row["meteor"] is None
    assert set(row) == {"bleu4", "rouge_l", "cider", "meteor", "success"}
