"""experiments.relm task=lambada robustness: each finished passage is kept when a run is
interrupted, resume=true reproduces the uninterrupted run, and a resume folder with other
settings (or resume for a task without per-item records) is refused."""

import json

import pytest

from ctrlg.errors import ExperimentConfigError
from test_experiments import compose, run_interrupted, tiny_lm_dir  # noqa: F401 (fixture)


def read_rows(folder):
    return [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]


def test_interrupted_lambada_run_resumes_to_the_same_predictions(tiny_lm_dir, tmp_path):
    from experiments import relm

    settings = [f"model.name={tiny_lm_dir}", "task=lambada", "lambada.limit=2",
                "lambada.max_tokens=3", "lambada.top_k=5", "lambada.max_expansions=20",
                "lambada.variants=[baseline,words]"]
    full = tmp_path / "full"
    relm.run(compose("relm", settings), full)

    runs = tmp_path / "runs"
    run_interrupted(relm, "predict_lambada", 2,  # on the second passage
                    lambda: relm.run(compose("relm", settings), runs / "2026-01-01_00-00-00"))
    assert [r["index"] for r in read_rows(runs / "2026-01-01_00-00-00")] == [0]

    result = relm.run(compose("relm", settings + ["resume=true"]), runs / "2026-01-02_00-00-00")
    resumed, reference = read_rows(runs / "2026-01-02_00-00-00"), read_rows(full)
    assert [r["index"] for r in resumed] == [0, 1]
    for got, want in zip(resumed, reference):
        assert [got[k] for k in ("target", "baseline", "words")] == \
            [want[k] for k in ("target", "baseline", "words")]
    assert result["examples"] == 2

    with pytest.raises(ExperimentConfigError, match="lambada"):
        relm.run(compose("relm", settings + ["lambada.max_tokens=4", f"resume={full}"]),
                 tmp_path / "x")
    with pytest.raises(ExperimentConfigError, match="task=lambada only"):
        relm.run(compose("relm", [f"model.name={tiny_lm_dir}", "task=bias", "resume=true"]),
                 tmp_path / "y")
