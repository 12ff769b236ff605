"""Metrics on tiny inputs whose values can be checked by hand."""

import math

import numpy as np
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


def test_cider_in_the_commongen_papers_scale_is_pycocoevalcap_times_ten():
    """Tables print CIDEr as CommonGen papers do: pycocoevalcap's Cider score × 10 (a corpus
    whose outputs equal their references scores 100, Ctrl-G's test figure is 16.2)."""
    from pycocoevalcap.cider.cider import Cider

    hyps = ["a dog catches a frisbee in the park", "two men ride horses on a beach",
            "the girl plays the piano", "a cat sleeps"]
    refs = [["the dog catches the frisbee", "a dog jumps for a frisbee in a park"],
            ["men ride horses along the beach"], ["a girl is playing piano on stage"],
            ["a red car parks outside"]]
    tokenized = ({i: [metrics.tokenize_for_eval(r) for r in rs] for i, rs in enumerate(refs)},
                 {i: [metrics.tokenize_for_eval(h)] for i, h in enumerate(hyps)})
    coco, _ = Cider().compute_score(*tokenized)
    row = metrics.evaluate_generations(hyps, refs, with_meteor=False)
    assert metrics.CIDER_SCALE == 10.0
    assert row["cider"] == pytest.approx(10.0 * coco, rel=1e-9)
    perfect = metrics.evaluate_generations([r[0] for r in refs], [[r[0]] for r in refs],
                                           with_meteor=False)["cider"]
    assert perfect == pytest.approx(100.0, rel=1e-6)
    scorer = metrics.CorpusScorer(hyps, refs, ("cider",))
    assert scorer.score(np.arange(len(hyps)))["cider"] == pytest.approx(row["cider"], rel=1e-6)


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


# ---------------------------------------------------------------------- paired bootstrap
BOOT_REFS = [["a man rides a horse on the beach", "a person riding a horse"],
             ["two dogs play in the snow", "dogs playing in snow together"],
             ["a red car parks outside the house", "the car is parked near a house"],
             ["children fly a kite in the park", "a kite flies over the park"]]
SYSTEM = ["a man rides a horse", "two dogs play in snow", "a car parks near the house",
          "kids fly a kite in the park"]
BASELINE = ["horse man", "the dogs and the snow and more dogs", "red car", "a kite"]


def _brute_force(hyps, refs, indices):
    """The library metrics on the resampled corpus itself (items repeated as drawn)."""
    h = [hyps[i] for i in indices]
    r = [refs[i] for i in indices]
    return {"bleu4": metrics.bleu4(h, r), "rouge_l": metrics.rouge_l(h, r),
            "cider": metrics.CIDER_SCALE * metrics.cider(h, r)}


@pytest.mark.parametrize("n", [3, 4])
def test_corpus_scorer_equals_the_library_on_every_resample(n):
    """Exact enumeration of all n^n resamples: BLEU's summed statistics, CIDEr's resampled IDF
    and ROUGE-L's mean reproduce the library's score of each resampled corpus."""
    scorer = metrics.CorpusScorer(SYSTEM[:n], BOOT_REFS[:n], ("bleu4", "rouge_l", "cider"))
    for indices in metrics.bootstrap_resamples(n, "all"):
        expected = _brute_force(SYSTEM[:n], BOOT_REFS[:n], indices)
        got = scorer.score(indices)
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-9), (indices, name)


def test_paired_bootstrap_interval_matches_the_exact_resampling_distribution():
    """n = 4: the percentile interval over all 256 equally likely resamples equals the one from
    brute-force deltas; random resampling (seeded) approaches it."""
    n, names = 4, ("bleu4", "rouge_l", "cider")
    system = metrics.CorpusScorer(SYSTEM, BOOT_REFS, names)
    baseline = metrics.CorpusScorer(BASELINE, BOOT_REFS, names)
    exact = metrics.paired_bootstrap(system, baseline, num_resamples="all")
    deltas = {m: [] for m in names}
    for indices in metrics.bootstrap_resamples(n, "all"):
        a, b = _brute_force(SYSTEM, BOOT_REFS, indices), _brute_force(BASELINE, BOOT_REFS, indices)
        for m in names:
            deltas[m].append(a[m] - b[m])
    full_a = _brute_force(SYSTEM, BOOT_REFS, range(n))
    full_b = _brute_force(BASELINE, BOOT_REFS, range(n))
    sampled = metrics.paired_bootstrap(system, baseline, num_resamples=4000, seed=1)
    for m in names:
        values = np.asarray(deltas[m])
        low, high = np.percentile(values, [2.5, 97.5])
        assert exact[m]["delta"] == pytest.approx(full_a[m] - full_b[m], rel=1e-9, abs=1e-9)
        assert exact[m]["low"] == pytest.approx(low, rel=1e-9, abs=1e-9)
        assert exact[m]["high"] == pytest.approx(high, rel=1e-9, abs=1e-9)
        assert exact[m]["p_not_better"] == pytest.approx(np.mean(values <= 0))
        # the sampled interval's ends lie between neighbouring quantiles of the exact law
        assert np.percentile(values, 1.0) - 1e-9 <= sampled[m]["low"] <= np.percentile(values, 5.0) + 1e-9
        assert np.percentile(values, 95.0) - 1e-9 <= sampled[m]["high"] <= np.percentile(values, 99.0) + 1e-9
    # same seed, same interval
    again = metrics.paired_bootstrap(system, baseline, num_resamples=4000, seed=1)
    assert again == sampled


def test_bootstrap_bad_inputs_raise():
    scorer = metrics.CorpusScorer(SYSTEM[:2], BOOT_REFS[:2], ("rouge_l",))
    other = metrics.CorpusScorer(SYSTEM[:3], BOOT_REFS[:3], ("rouge_l",))
    with pytest.raises(MetricInputError, match="same items"):
        metrics.paired_bootstrap(scorer, other)
    with pytest.raises(MetricInputError, match="num_resamples"):
        metrics.bootstrap_resamples(3, 0)
    with pytest.raises(MetricInputError, match="at most 6"):
        metrics.bootstrap_resamples(8, "all")
    with pytest.raises(MetricInputError, match="unknown metric"):
        metrics.CorpusScorer(SYSTEM[:2], BOOT_REFS[:2], ("bleu5",))
    with pytest.raises(MetricInputError, match="meteor_session"):
        metrics.CorpusScorer(SYSTEM[:2], BOOT_REFS[:2], ("meteor",))
    with pytest.raises(MetricInputError, match="indices"):
        scorer.score([0, 5])


@pytest.mark.heavy  # starts a JVM
@pytest.mark.skipif(not metrics.java_available(), reason="METEOR needs java")
def test_meteor_on_a_resample_equals_the_jar_on_that_corpus():
    session = metrics.MeteorSession()
    try:
        scorer = metrics.CorpusScorer(SYSTEM, BOOT_REFS, ("meteor",), meteor_session=session)
        for indices in [(0, 1, 2, 3), (3, 3, 0, 1), (2, 2, 2, 2)]:
            expected = metrics.meteor([SYSTEM[i] for i in indices], [BOOT_REFS[i] for i in indices])
            assert scorer.score(indices)["meteor"] == pytest.approx(expected, abs=1e-9)
    finally:
        session.close()
