"""The editing benchmark: examples cut from passages, the independent checks and scores, and the
experiment's records, resume and bad input on a tiny random LM."""

import json
from pathlib import Path

import numpy as np
import pytest

from ctrlg.data.stories import Story, load_stories
from ctrlg.dfa.words import count_words
from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.edit.examples import KINDS, build_examples, content_words, word_range
from ctrlg.tasks.edit.report import summarise
from ctrlg.tasks.edit.scoring import (constraints_met, keyphrase_position, overall,
                                     reference_thresholds, repetition)
from test_experiments import compose, run_interrupted, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)

STORIES = ["It was late when the ferry finally reached the island. The harbour lights were out and "
           "nobody waited on the pier. We carried our bags up the hill in silence. At the top, the "
           "old lighthouse keeper was standing at his door",
           "Mira opened the letter with shaking hands. Inside was a photograph of her grandmother "
           "as a young woman, laughing on a beach. She turned it over and read the date twice. "
           "Then she called her brother"]


def test_every_example_s_reference_satisfies_its_own_constraints():
    stories = load_stories("eval", limit=60)
    examples, skipped = build_examples(stories, seed=0)
    assert len(examples) >= 4 * 50 - 10 and len(skipped) < 10
    assert {e.kind for e in examples} == set(KINDS)
    assert {e.operation for e in examples} == {"insert", "continue"}
    for e in examples:
        text = next(s.text for s in stories if s.index == e.passage)
        assert e.prefix + e.reference + e.suffix == text or \
            (e.operation == "continue" and text.startswith(e.prefix + e.reference))
        assert constraints_met(e, e.reference)
        assert e.prefix and e.reference.strip()
        if "K" in e.kind:
            assert 1 <= len(e.keyphrases) <= 3
        if "L" in e.kind:
            assert e.min_words <= count_words(e.reference) <= e.max_words
        if e.operation == "insert":
            assert e.suffix.strip()


def test_constraint_checks_read_text_as_the_constraint_does():
    example = build_examples([Story(0, STORIES[0])], seed=3, kinds=["K&L"])[0][0]
    assert constraints_met(example, example.reference)
    words = list(example.keyphrases)
    filler = "and " * (example.min_words - len(words))
    assert constraints_met(example, " " + " ".join(words) + " " + filler.strip())
    assert not constraints_met(example, " " + filler + "x")                      # keyphrase missing
    assert not constraints_met(example, " " + " ".join(words * 30))              # too many words
    assert not constraints_met(example, "")
    inside = example.keyphrases[0]
    assert not constraints_met(
        example.__class__(0, "continue", "K", "p", "", "r", (inside,)), "pre" + inside.lower())
    assert word_range(10) == (8, 12) and word_range(3) == (1, 5)
    assert content_words("The old lighthouse keeper was standing at his door") == \
        ["old", "lighthouse", "keeper", "standing", "door"] or "lighthouse" in \
        content_words("The old lighthouse keeper was standing at his door")


def test_keyphrase_position_is_where_the_first_whole_word_keyphrase_starts():
    assert keyphrase_position(["lamp"], " Lamp light filled the room.") == 0.0
    text = " The old lamp was lit."
    assert keyphrase_position(["lamp", "old"], text) == pytest.approx(4 / len(text.lstrip()))
    assert keyphrase_position(["lamp"], " The lamplighter came.") is None     # not a whole word
    assert keyphrase_position([], text) is None and keyphrase_position(["sun"], text) is None
    records = [{"index": 0, "passage": 0, "operation": "continue", "kind": "K", "keyphrases": ["lamp"],
                "reference": " A lamp.", "reference_scores": {"fluency": 1.0, "coherence": None,
                                                              "distinct2": 1.0, "repeated3": 0.0,
                                                              "success": True},
                "shuffled": {"text": " lamp. A", "fluency": 9.0, "coherence": None, "distinct2": 1.0,
                             "repeated3": 0.0, "success": True}, "seconds": {}}]
    rows = {r["row"]: r for r in summarise(records, [], ["K"], resamples=0)["rows"] if r["kind"] == "all"}
    assert rows["reference"]["keyphrase_at"] == pytest.approx(2 / 7)
    assert rows["shuffled"]["keyphrase_at"] == 0.0


def test_repetition_counts_new_three_grams_seen_before():
    distinct, repeated = repetition("a b c d", " c d e c d e")
    assert distinct == pytest.approx(3 / 5)
    # 3-grams ending in the new text: (c d c)... computed over prefix + text
    assert 0 < repeated < 1
    assert repetition("", " one two three four") == (1.0, 0.0)


def test_overall_uses_the_references_percentiles():
    rows = [{"operation": "insert", "fluency": f, "coherence": c}
            for f, c in zip(np.linspace(1, 10, 10), np.linspace(2, 11, 10))]
    thresholds = reference_thresholds(rows)
    assert thresholds["insert"]["fluency"] == pytest.approx(9.1)
    assert overall(True, "insert", 9.0, 10.0, thresholds)
    assert not overall(True, "insert", 9.5, 3.0, thresholds)
    assert not overall(True, "insert", 2.0, 10.5, thresholds)
    assert not overall(False, "insert", 1.0, 1.0, thresholds)


def test_overall_bounds_repetition_by_the_references_so_degenerate_filler_fails():
    # NLL per token alone lets cheap filler pass: "*. *. *. Station" is easy to predict
    prefix = "I follow Logan to the back of the room."
    filler = " I went.  *.  *.  *.  *.  *.  *. Station"
    _, filler_repeated = repetition(prefix, filler)
    _, clean_repeated = repetition(prefix, " I went to the station.")
    assert filler_repeated > 0 and clean_repeated == 0
    rows = [{"operation": "insert", "fluency": 3.0, "coherence": 3.0, "repeated3": r}
            for r in [0.0] * 9 + [0.5]]
    thresholds = reference_thresholds(rows)
    assert thresholds["insert"]["repeated3"] == pytest.approx(0.05)
    assert overall(True, "insert", 2.0, 2.0, thresholds, clean_repeated)
    assert not overall(True, "insert", 2.0, 2.0, thresholds, filler_repeated)
    # without a repetition score (older records) only the NLL bounds apply
    assert overall(True, "insert", 2.0, 2.0, thresholds)
    assert "repeated3" not in reference_thresholds([{"operation": "insert", "fluency": 1.0}])["insert"]


def overrides(lm_dir, hmm_dir, path, *extra):
    return [f"model.name={lm_dir}", "model.adapter=null", f"scorer.name={lm_dir}",
            f"hmm.path={hmm_dir}", f"data.path={path}", "data.limit=2",
            "generation.num_samples=2", "generation.max_new_tokens=24",
            "bootstrap.resamples=20", *extra]


def write(folder, stories):
    path = folder / "stories.jsonl"
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in stories))
    return path


def test_the_experiment_records_each_example_and_resumes(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    from experiments import edit

    settings = overrides(tiny_lm_dir, tiny_hmm_dir, write(tmp_path, STORIES))
    result = edit.run(compose("edit", settings), tmp_path / "full")
    records = [json.loads(x) for x in (tmp_path / "full" / "generations.jsonl").read_text().splitlines()]
    assert len(records) == 8 and {r["kind"] for r in records} == set(KINDS)
    for r in records:
        assert {"operation", "kind", "prefix", "suffix", "reference", "keyphrases", "min_words",
                "max_words"} <= set(r)
        for method in ("prompt_only", "logical", "ctrlg"):
            assert {"text", "accepted"} <= set(r[method])
        for method in ("logical", "ctrlg"):   # the guided methods meet every constraint
            assert r[method]["accepted"] and r[method]["success"]
    by = {(row["row"], row["kind"]): row for row in result["rows"]}
    assert by[("reference", "all")]["success"] == 100.0
    assert by[("ctrlg", "K&L")]["success"] == 100.0
    assert {p["pair"] for p in result["paired"]} == {"ctrlg − prompt_only", "ctrlg − logical"}

    run_interrupted(edit, "run_method", 7, lambda: edit.run(compose("edit", settings),
                                                               tmp_path / "runs" / "a"))
    kept = [json.loads(x) for x in (tmp_path / "runs" / "a" / "generations.jsonl").read_text().splitlines()]
    assert [r["index"] for r in kept] == [0, 1]
    edit.run(compose("edit", settings + [f"resume={tmp_path / 'runs' / 'a'}"]), tmp_path / "runs" / "b")
    again = [json.loads(x) for x in (tmp_path / "runs" / "b" / "generations.jsonl").read_text().splitlines()]
    assert [r["ctrlg"]["text"] for r in again] == [r["ctrlg"]["text"] for r in records]


def test_shards_of_passages_merge_into_the_run_over_every_passage(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    """A shard numbers, seeds and shuffles its examples as the whole run does, so shards (and a
    later run of one method) merge into the whole run's records."""
    from benchmarks import merge_edit
    from experiments import edit

    path = write(tmp_path, STORIES + STORIES[:1])
    base = overrides(tiny_lm_dir, tiny_hmm_dir, path)
    edit.run(compose("edit", base + ["data.limit=3"]), tmp_path / "whole")
    edit.run(compose("edit", base + ["data.offset=0", "data.limit=1"]), tmp_path / "s0")
    edit.run(compose("edit", base + ["data.offset=1", "data.limit=2"]), tmp_path / "s1")
    shard = [json.loads(x) for x in (tmp_path / "s1" / "generations.jsonl").read_text().splitlines()]
    assert [r["index"] for r in shard] == [4, 5, 6, 7, 8, 9, 10, 11]
    result = merge_edit.merge([tmp_path / "s0", tmp_path / "s1"], tmp_path / "merged")
    whole = [json.loads(x) for x in (tmp_path / "whole" / "generations.jsonl").read_text().splitlines()]
    merged = [json.loads(x) for x in (tmp_path / "merged" / "generations.jsonl").read_text().splitlines()]
    assert len(merged) == len(whole) == 12
    for a, b in zip(whole, merged):
        assert a["index"] == b["index"] and a["shuffled"]["text"] == b["shuffled"]["text"]
        assert all(a[m]["text"] == b[m]["text"] for m in ("prompt_only", "logical", "ctrlg"))
    assert {p["pair"] for p in result["paired"]} == {"ctrlg − prompt_only", "ctrlg − logical"}
    # a method taken from another run replaces nothing twice: repeating one is refused
    edit.run(compose("edit", base + ["data.limit=3", "methods=[ctrlg]"]), tmp_path / "ctrlg")
    again = merge_edit.merge([(tmp_path / "whole", ["prompt_only", "logical"]), tmp_path / "ctrlg"],
                             tmp_path / "joined")
    assert again["rows"] and {r["row"] for r in again["rows"]} >= {"prompt_only", "logical", "ctrlg"}
    with pytest.raises(ExperimentConfigError, match="repeats example"):
        merge_edit.merge([tmp_path / "whole", tmp_path / "ctrlg"], tmp_path / "twice")
    with pytest.raises(ExperimentConfigError, match="offset"):
        edit.run(compose("edit", base + ["data.offset=-1"]), tmp_path / "bad")


def test_passages_too_short_to_cut_are_skipped_and_an_empty_selection_refused(tmp_path, monkeypatch):
    from experiments import edit

    monkeypatch.setattr(edit, "load_lm", lambda *a, **k: pytest.fail("a model was loaded"))
    path = write(tmp_path, ["Too short.", "Hi there"])
    with pytest.raises(ExperimentConfigError, match="no passage"):
        edit.run(compose("edit", overrides("x", "y", path)), tmp_path / "run")
    with pytest.raises(ExperimentConfigError, match="kinds"):
        edit.run(compose("edit", overrides("x", "y", path, "kinds=[K,X]")), tmp_path / "run")
    examples, skipped = build_examples([Story(0, "Too short."), Story(1, STORIES[1])])
    assert skipped == [0] and examples


def test_a_run_kept_before_a_setting_existed_agrees_with_that_settings_default():
    """merge_common.ADDED_DEFAULTS: generation.strength came after the kept runs, which ran at 1."""
    from benchmarks import merge_common

    old = {"generation": {"num_samples": 8}}
    same = {"generation": {"num_samples": 8, "strength": 1.0}}
    weaker = {"generation": {"num_samples": 8, "strength": 0.5}}
    check = lambda configs: merge_common.check_settings(  # noqa: E731
        [Path("old"), Path("new")], configs, [["ctrlg"], ["ctrlg"]], (), {"ctrlg": ("generation",)})
    assert check([old, same]) == {"generation": 0}
    with pytest.raises(ExperimentConfigError, match="generation"):
        check([old, weaker])
