"""Resuming the editing experiment and ReLM's LAMBADA task from records that are wrong rather
than torn, as infilling and CommonGen already do: each record is checked against the run's
schema (its key, the selected item's own fields, every method's output) and selection, the first
usable record of each selected item is kept, and every other line (a second record of an item,
an index outside the selection, an index "1", a bare ``{"index": 1}``, a record of another item
under a selected index, a torn last line) is skipped with a warning and set aside in the
``.set-aside`` side file with its reason. Before, ``read_records(resume_dir)`` kept all of them:
a duplicate or a foreign index was counted in the metrics, and ``{"index": 1}`` crashed the
report with KeyError."""

import json
import logging

import pytest

from ctrlg.data.stories import Story
from ctrlg.tasks import record_files
from ctrlg.tasks.edit.examples import build_examples
from test_edit import STORIES, overrides, write
from test_experiments import compose, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)
from test_relm_experiment import read_rows


def read_lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_lines(path, records, torn: str):
    """``records`` one per line, then ``torn`` as a last line without its newline (a write the
    process died in)."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records) + torn,
                    encoding="utf-8")


def side_rows(path):
    return read_lines(record_files.set_aside_path(path))


# ------------------------------------------------------------------------- editing
SCORES = {"fluency": 2.5, "coherence": None, "distinct2": 1.0, "repeated3": 0.0, "success": True}


def edit_examples():
    return build_examples([Story(0, STORIES[0]), Story(1, STORIES[1])], seed=0,
                          kinds=["K", "L"])[0]


def edit_record(example, index, methods=("logical", "ctrlg")):
    out = {"text": " words", "accepted": True, **SCORES}
    return {"index": index, **example.record(), "seconds": {m: 0.5 for m in methods},
            "reference_scores": dict(SCORES), "shuffled": {"text": " sdrow", **SCORES},
            **{m: dict(out) for m in methods}}


@pytest.mark.parametrize("change, reason", [
    (lambda r: r.update(ctrlg=None), "no output {'text': ...} of 'ctrlg'"),
    (lambda r: r["ctrlg"].pop("accepted"), "'ctrlg''s output has no 'accepted' flag"),
    (lambda r: r["logical"].pop("fluency"), "'logical''s output lacks its scores ['fluency']"),
    (lambda r: r["shuffled"].pop("text"), "no output {'text': ...} of 'shuffled'"),
    (lambda r: r.pop("reference_scores"), "no scores of the reference"),
    (lambda r: r["seconds"].pop("ctrlg"), "no seconds of ctrlg"),
    (lambda r: r.update(prefix="Another passage."), "its prefix differ from example"),
    (lambda r: r.update(keyphrases=["other"]), "its keyphrases differ from example"),
    (lambda r: r.update(passage=True), "'passage' is a bool"),
    (lambda r: r.update(index=1.0), "'index' is a float"),
    (lambda r: r.pop("reference"), "a record without 'reference'"),
    (lambda r: r.update(skipped=3), "'skipped' is not a reason"),
])
def test_the_edit_schema_refuses_a_record_the_report_could_not_use(change, reason):
    from experiments.edit import record_schema

    examples = edit_examples()
    assert len(examples) == 4 and {e.kind for e in examples} == {"K", "L"}
    schema = record_schema(examples, ["logical", "ctrlg"])
    for index, example in enumerate(examples):
        assert schema.problem(edit_record(example, index)) is None
    skipped = {"index": 1, **examples[1].record(), "skipped": "ConstraintError: no room"}
    assert schema.problem(skipped) is None
    bad = edit_record(examples[0], 0) if reason != "'skipped' is not a reason" else dict(skipped)
    change(bad)
    assert reason in schema.problem(bad)
    # an L example's word range: a bool is not a number of words
    with_range = next(i for i, e in enumerate(examples) if e.kind == "L")
    assert "'min_words' is a bool" in schema.problem(
        dict(edit_record(examples[with_range], with_range), min_words=True))


def test_a_resumed_edit_run_keeps_the_first_good_record_of_each_selected_example(
        tiny_lm_dir, tiny_hmm_dir, tmp_path, monkeypatch, caplog):
    """A finished 2-example run whose file then holds, between the good records of examples 0
    and 1: a second record of example 0 with another ctrlg output, example 1's record under
    index 5 (not selected) and under index "1", example 0's record under index 1, a bare
    ``{"index": 1}``; and a torn last line. Resumed in place: nothing is generated again, the
    file holds the two good records, the metrics are the finished run's (2 examples per row),
    and the six other lines are in the side file with their reasons."""
    from experiments import edit

    settings = overrides(tiny_lm_dir, tiny_hmm_dir, write(tmp_path, STORIES), "kinds=[K]")
    run = tmp_path / "run"
    edit.run(compose("edit", settings), run)
    path = run / "generations.jsonl"
    before = json.loads((run / "metrics.json").read_text())
    first, second = read_lines(path)
    assert [first["index"], second["index"]] == [0, 1] and first["prefix"] != second["prefix"]

    duplicate = {**first, "ctrlg": {**first["ctrlg"], "text": " something else entirely"}}
    bad = [duplicate, {**second, "index": 5}, {**second, "index": "1"}, {**first, "index": 1},
           {"index": 1}]
    write_lines(path, [first, *bad, second], torn=json.dumps(second)[:60])

    generated = []
    monkeypatch.setattr(edit, "run_method",
                        lambda *a, **k: generated.append(a[0]) or pytest.fail("generated again"))
    with caplog.at_level(logging.WARNING):
        result = edit.run(compose("edit", settings + [f"resume={run}"]), run)
    assert generated == []
    assert read_lines(path) == [first, second]
    after = json.loads((run / "metrics.json").read_text())
    assert after == before
    assert result["rows"] and all(row["examples"] == 2 for row in result["rows"])
    assert result["skipped_examples"] == []

    aside = side_rows(path)
    assert [a["line"] for a in aside] == [2, 3, 4, 5, 6, 8]
    reasons = [a["reason"] for a in aside]
    assert "a second record of index 0 (line 1 holds the first, kept)" in reasons[0]
    assert "index 5 is not among the items this run selects" in reasons[1]
    assert "'index' is a str" in reasons[2]
    assert "differ from example 1's" in reasons[3] and "prefix" in reasons[3]
    assert "a record without 'passage'" in reasons[4]
    assert reasons[5].startswith("torn last line")
    assert [json.loads(a["text"]) for a in aside[:5]] == bad
    assert aside[5]["text"] == json.dumps(second)[:60]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("6 line(s) are not complete records of this run and were skipped (2 good "
               "records kept)" in w for w in warnings)
    assert any("set aside 6 line(s)" in w and ".set-aside" in w for w in warnings)


# ------------------------------------------------------------------------- ReLM LAMBADA
@pytest.mark.parametrize("row, reason", [
    ({"index": 0, "target": "signs", "seconds": {"baseline": 0.1, "words": 0.1}, "baseline": "x"},
     "no guess (a string) of words"),
    ({"index": 0, "target": "signs", "seconds": {"baseline": 0.1}, "baseline": "x", "words": "y"},
     "no seconds of words"),
    ({"index": 0, "target": "signs", "seconds": {"baseline": 0.1, "words": 0.1}, "baseline": "x",
      "words": None}, "no guess (a string) of words"),
    ({"index": 0, "target": "Shane", "skipped": "ConstraintError: x"},
     "its target 'Shane' is not passage 0's 'signs'"),
    ({"index": 0, "target": "signs", "skipped": None}, "'skipped' is not a reason"),
    ({"index": True, "target": "signs", "skipped": "x"}, "'index' is a bool"),
    ({"index": 0, "target": ["signs"], "skipped": "x"}, "'target' is a list"),
])
def test_the_lambada_schema_refuses_a_row_the_table_could_not_use(row, reason):
    from experiments.relm import lambada_examples, lambada_record_schema

    examples = lambada_examples(compose("relm", ["task=lambada", "lambada.limit=2"]))
    schema = lambada_record_schema(examples, ["baseline", "words"])
    good = {"index": 0, "target": "signs", "seconds": {"baseline": 0.1, "words": 0.2},
            "baseline": "signs", "words": "road"}
    assert schema.problem(good) is None
    assert schema.problem({"index": 1, "target": "Shane", "skipped": "ConstraintError: x"}) is None
    assert reason in schema.problem(row)


def test_a_resumed_lambada_run_keeps_the_first_good_row_of_each_selected_passage(
        tiny_lm_dir, tmp_path, monkeypatch, caplog):
    """A finished 3-passage run whose file then holds passage 0's row, a second row of it with
    other guesses, passage 1's row under index 7 (not selected) and under index "1", passage 0's
    row under index 1, a bare ``{"index": 1}``, passage 1's row, and a torn row of passage 2.
    Resumed in place: only passage 2 is predicted again, each passage counts once (the finished
    run's accuracies), and the six other lines are in the side file with their reasons."""
    from experiments import relm

    settings = [f"model.name={tiny_lm_dir}", "task=lambada", "lambada.limit=3",
                "lambada.max_tokens=3", "lambada.top_k=5", "lambada.max_expansions=20",
                "lambada.variants=[baseline,words]"]
    run = tmp_path / "run"
    full = relm.run(compose("relm", settings), run)
    path = run / "predictions.jsonl"
    rows = read_rows(run)
    assert [r["index"] for r in rows] == [0, 1, 2] and rows[0]["target"] != rows[1]["target"]

    duplicate = {**rows[0], "baseline": rows[0]["target"], "words": rows[0]["target"]}
    bad = [duplicate, {**rows[1], "index": 7}, {**rows[1], "index": "1"}, {**rows[0], "index": 1},
           {"index": 1}]
    write_lines(path, [rows[0], *bad, rows[1]], torn=json.dumps(rows[2])[:30])

    predicted = []
    real = relm.predict_lambada
    monkeypatch.setattr(relm, "predict_lambada",
                        lambda example, *a, **k: predicted.append(example) or real(example, *a, **k))
    with caplog.at_level(logging.WARNING):
        result = relm.run(compose("relm", settings + [f"resume={run}"]), run)
    examples = relm.lambada_examples(compose("relm", settings))
    assert predicted == [examples[2]]
    again = read_rows(run)
    assert again[:2] == rows[:2]
    assert [{k: r[k] for k in ("index", "target", "baseline", "words")} for r in again] == \
        [{k: r[k] for k in ("index", "target", "baseline", "words")} for r in rows]
    assert result["examples"] == 3 and result["skipped"] == []
    strip = lambda table: [{k: v for k, v in t.items() if k != "seconds"} for t in table]  # noqa: E731
    assert strip(result["variants"]) == strip(full["variants"])
    saved = json.loads((run / "results.json").read_text())
    assert saved["examples"] == 3

    aside = side_rows(path)
    assert [a["line"] for a in aside] == [2, 3, 4, 5, 6, 8]
    reasons = [a["reason"] for a in aside]
    assert "a second record of index 0 (line 1 holds the first, kept)" in reasons[0]
    assert "index 7 is not among the items this run selects" in reasons[1]
    assert "'index' is a str" in reasons[2]
    assert f"its target {rows[0]['target']!r} is not passage 1's" in reasons[3]
    assert "a record without 'target'" in reasons[4]
    assert reasons[5].startswith("torn last line")
    assert [json.loads(a["text"]) for a in aside[:5]] == bad
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("6 line(s) are not complete records of this run and were skipped (2 good "
               "records kept)" in w for w in warnings)
    assert any("set aside 6 line(s)" in w and ".set-aside" in w for w in warnings)
