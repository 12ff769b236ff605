"""Infilling scores per granularity (ctrlg.tasks.infill.by_granularity): the groups, and each
group's scores equal to the benchmark's own scoring of the same passages."""

import pytest

from ctrlg.tasks.infill import pipeline
from ctrlg.tasks.infill.by_granularity import coarsest_granularity, granularity_rows

ORIGINALS = ["Tom ran home. He was tired and sat down.", "The old dog slept by the fire all day.",
             "Anna baked bread. The kitchen smelled warm.", "Rain fell on the town at night."]


def _record(i, granularities, ratio=0.3):
    original = ORIGINALS[i]
    words = original.split()
    return {"target_ratio": ratio, "index": i, "original": original, "granularities": granularities,
            "mask_ratio": 0.2, "seconds": {"ctrlg": 1.0, "logical": 1.0, "ilm": 1.0},
            "ctrlg": {"text": original if i % 2 else " ".join(words[:-1]), "accepted": True},
            "logical": {"text": " ".join(reversed(words)), "accepted": True},
            "ilm": {"text": "x", "accepted": False},
            "ilm_seeds": [{"text": " ".join(words[1:]), "accepted": False},
                          {"text": " ".join(words[:-2]), "accepted": False}]}


@pytest.mark.parametrize("granularities, coarsest", [
    (["word"], "word"), (["word", "ngram", "word"], "ngram"), (["sentence", "word"], "sentence"),
    (["ngram", "document"], "document"), (["paragraph", "sentence"], "paragraph"),
])
def test_a_passage_is_grouped_by_its_coarsest_blank(granularities, coarsest):
    assert coarsest_granularity(granularities) == coarsest


def test_each_groups_scores_are_the_benchmarks_scores_of_its_passages():
    records = [_record(0, ["word"]), _record(1, ["word", "word"]), _record(2, ["sentence", "word"]),
               _record(3, ["sentence"]), _record(0, ["ngram"], ratio=0.5)]
    methods = ["logical", "ilm", "ctrlg"]
    rows = granularity_rows(records, methods, ratios=[0.3], resamples=50)
    assert [(r["granularity"], r["method"]) for r in rows] == [
        (g, m) for g in ("word", "sentence") for m in methods]
    for group, members in (("word", records[:2]), ("sentence", records[2:4])):
        expected = {r["method"]: r for r in pipeline.score_rows(members, [0.3], methods)}
        for row in (r for r in rows if r["granularity"] == group):
            assert row["passages"] == 2
            for metric in pipeline.METRICS:
                assert row[metric] == pytest.approx(expected[row["method"]][metric])
            if row["method"] != "ctrlg":
                delta = row["ctrlg_minus"]["bleu4"]
                assert delta["delta"] == pytest.approx(expected["ctrlg"]["bleu4"] - expected[row["method"]]["bleu4"])
                assert delta["low"] <= delta["delta"] <= delta["high"]
    assert [r["granularity"] for r in granularity_rows(records, methods, resamples=0)][-1] == "sentence"
    assert {r["granularity"] for r in granularity_rows(records, methods, resamples=0)} == {"word", "ngram", "sentence"}
