"""experiments.infill robustness: each finished passage is kept when a run is interrupted,
resume=true reproduces the uninterrupted run, a resume folder with other settings is refused, and
a passage whose constraint cannot be met is reported and skipped while the others go on."""

import json

import pytest

from ctrlg.errors import ExperimentConfigError
from test_experiments import compose, run_interrupted, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)

STORIES = ["Tom had a red kite. It flew over the hill.\n\nThen the wind stopped and it fell.",
           "Anna baked bread in the morning. The kitchen smelled warm and sweet all day long."]


def overrides(lm_dir, hmm_dir, stories_path, *extra):
    return [f"model.name={lm_dir}", f"hmm.path={hmm_dir}", f"data.path={stories_path}",
            "data.offset=0", "data.limit=2", "data.calibration_docs=1", "data.mask_ratios=[0.3]",
            "generation.num_samples=1", *extra]


def write_stories(folder, stories):
    path = folder / "stories.jsonl"
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in stories))
    return path


def read_records(folder):
    return [json.loads(line) for line in (folder / "generations.jsonl").read_text().splitlines()]


def test_interrupted_run_keeps_finished_passages_and_resume_reproduces_it(
        tiny_lm_dir, tiny_hmm_dir, tmp_path):
    from experiments import infill

    settings = overrides(tiny_lm_dir, tiny_hmm_dir, write_stories(tmp_path, STORIES))
    full = tmp_path / "full"
    infill.run(compose("infill", settings), full)

    runs = tmp_path / "runs"
    run_interrupted(infill, "infill_item", 2,  # on the second passage
                    lambda: infill.run(compose("infill", settings), runs / "2026-01-01_00-00-00"))
    assert [r["index"] for r in read_records(runs / "2026-01-01_00-00-00")] == [0]

    table = infill.run(compose("infill", settings + ["resume=true"]), runs / "2026-01-02_00-00-00")
    resumed, reference = read_records(runs / "2026-01-02_00-00-00"), read_records(full)
    assert [r["index"] for r in resumed] == [0, 1]
    for got, want in zip(resumed, reference):  # same masks, same seeds: same outputs
        assert got["blanked"] == want["blanked"]
        assert [got[m] for m in infill.METHODS] == [want[m] for m in infill.METHODS]
    assert all(row["success"] == 100.0 for row in table.values())

    # a resume folder made with other generation settings is refused, naming what differs
    with pytest.raises(ExperimentConfigError, match="generation"):
        infill.run(compose("infill", settings + ["generation.num_samples=2", f"resume={full}"]),
                   tmp_path / "x")
    # resume=true with no earlier run of these settings is refused too
    with pytest.raises(ExperimentConfigError, match="no earlier run"):
        infill.run(compose("infill", settings + ["seed=5", "resume=true"]),
                   runs / "2026-01-03_00-00-00")


def test_unsatisfiable_passage_is_reported_and_the_others_go_on(tiny_lm_dir, tiny_hmm_dir,
                                                                 tmp_path, capsys):
    """A token cap shorter than the long passage's fixed fragments makes its constraint
    unsatisfiable: that passage is skipped by index, the short one is still completed."""
    from experiments import infill

    stories = ["The cat sat.", STORIES[1] + " " + STORIES[1] + " " + STORIES[1]]
    settings = overrides(tiny_lm_dir, tiny_hmm_dir, write_stories(tmp_path, stories),
                         "generation.max_new_tokens_cap=24")
    table = infill.run(compose("infill", settings), tmp_path / "run")
    assert "ratio 0.3 item 1: skipped" in capsys.readouterr().err
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [s["index"] for s in saved["skipped"]] == [1]
    assert all(row["success"] == 100.0 for row in table.values())
    assert [r["index"] for r in read_records(tmp_path / "run") if "skipped" not in r] == [0]
