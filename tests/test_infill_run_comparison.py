"""Two infilling runs paired by passage and ratio (ctrlg.tasks.infill.run_comparison): the deltas are
the scores' differences, identical runs differ by nothing, unpaired masks are refused or left out."""

import pytest

from ctrlg import metrics
from ctrlg.tasks.infill.pipeline import METRICS
from ctrlg.tasks.infill.run_comparison import RunMismatchError, paired_rows

ORIGINALS = ["the cat sat on the mat by the door", "a dog ran to the park in the rain",
             "she wrote a long letter to her old friend"]


def _run(texts, seconds=1.0, masked="___"):
    return [{"index": i, "target_ratio": ratio, "original": o, "masked": masked,
             "ctrlg": {"text": t, "accepted": True}, "seconds": {"ctrlg": seconds}}
            for ratio in (0.13, 0.4) for i, (o, t) in enumerate(zip(ORIGINALS, texts))]


def test_rows_pair_items_and_report_the_second_minus_the_first():
    worse = ["the cat sat on a rug by the door", "a dog ran to the shop in the rain",
             "she wrote a letter to her friend"]
    rows = paired_rows(_run(worse, 2.0), _run(ORIGINALS, 1.0), resamples=50)
    assert [r["target_ratio"] for r in rows] == [0.13, 0.4, "all"]
    assert [r["passages"] for r in rows] == [3, 3, 6]
    for row in rows:
        n = row["passages"]
        refs = [[o] for o in ORIGINALS] * (n // 3)
        first = metrics.CorpusScorer(worse * (n // 3), refs, METRICS).score(range(n))
        assert row["first"] == pytest.approx(first) and row["second"]["bleu4"] == pytest.approx(100.0)
        delta = row["second_minus_first"]["bleu4"]
        assert delta["delta"] == pytest.approx(100.0 - first["bleu4"]) and delta["low"] <= delta["high"]
        assert row["identical"] == 0.0 and row["seconds"] == [2.0, 1.0] and row["success"] == [100.0, 100.0]


def test_identical_runs_differ_by_nothing_and_only_shared_items_count():
    first = _run(ORIGINALS)
    second = [r for r in _run(ORIGINALS) if r["index"] != 2]
    rows = paired_rows(first, second, resamples=20)
    assert rows[-1]["passages"] == 4 and rows[-1]["identical"] == 100.0
    assert all(r["second_minus_first"][m]["delta"] == 0.0 for r in rows for m in ("bleu4", "rouge_l"))


def test_runs_masked_differently_are_refused():
    with pytest.raises(RunMismatchError, match="masked differently"):
        paired_rows(_run(ORIGINALS), _run(ORIGINALS, masked="the ___ sat"), resamples=10)


def test_items_masked_differently_can_be_left_out_and_are_counted():
    second = _run(ORIGINALS)
    for record in second:
        if record["index"] == 1 and record["target_ratio"] == 0.4:
            record["masked"] = "a ___ ran"
    rows = paired_rows(_run(ORIGINALS), second, resamples=10, same_masks_only=True)
    assert [(r["target_ratio"], r["passages"], r["other_masks"]) for r in rows] == \
        [(0.13, 3, 0), (0.4, 2, 1), ("all", 5, 1)]
    assert rows[-1]["identical"] == 100.0
