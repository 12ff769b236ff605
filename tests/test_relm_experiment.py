"""experiments.relm: task=lambada robustness (each finished passage is kept when a run is
interrupted, resume=true reproduces the uninterrupted run, and a resume folder with other
settings, or resume for a task without per-item records, is refused); the bias, memorization and
toxicity tasks end to end on a tiny LM, and the toxicity task's bad input (a corpus with no match,
an empty word list) giving a message and an empty result."""

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


def test_bias_smoke_runs_each_configuration_and_plots(tiny_lm_dir, tmp_path):
    from experiments import relm

    cfg = compose("relm", [f"model.name={tiny_lm_dir}", "task=bias", "bias.num_samples=4",
                           "bias.professions=[art,math,business]", "bias.encodings=[canonical]",
                           "bias.edit_distances=[0,1]", "bias.prefix=[true,false]",
                           "bias.max_tokens=24"])
    result = relm.run(cfg, tmp_path)
    assert [(c["prefix"], c["edits"]) for c in result["configurations"]] == \
        [(True, 0), (True, 1), (False, 0), (False, 1)]
    exact = result["configurations"][0]
    assert sum(sum(c.values()) for c in exact["counts"].values()) == 8
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 32
    assert (tmp_path / "bias.png").stat().st_size > 1000


def test_memorization_smoke(tiny_lm_dir, tmp_path):
    from experiments import relm

    cfg = compose("relm", [f"model.name={tiny_lm_dir}", "task=memorization",
                           "memorization.num_results=3", "memorization.max_expansions=40",
                           "memorization.stop_lengths=[2,4]", "memorization.num_samples=2"])
    result = relm.run(cfg, tmp_path)
    assert [(r["method"], r["stop_length"]) for r in result["rows"]] == \
        [("shortest path", None), ("sampling", 2), ("sampling", 4)]
    shortest = result["rows"][0]
    assert shortest["attempts"] <= 3 and shortest["verified"] <= shortest["unique"]
    assert (tmp_path / "memorization.png").stat().st_size > 1000


def _corpus(tmp_path, texts):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_toxicity_smoke_and_bad_input(tiny_lm_dir, tmp_path, capsys):
    from experiments import relm

    corpus = _corpus(tmp_path, ["He is a jerk. Fine day.", "You jerk!"])
    base = [f"model.name={tiny_lm_dir}", "task=toxicity", f"toxicity.corpus={corpus}",
            "toxicity.words=[jerk]", "toxicity.max_results=3", "toxicity.top_k=null",
            "toxicity.max_expansions=200"]
    result = relm.run(compose("relm", base), tmp_path / "run")
    assert result["inputs"] == 2
    rows = {(r["attack"], r["configuration"]): r for r in result["rows"]}
    assert len(rows) == 4 and all(r["inputs"] == 2 for r in rows.values())
    # no decision rule: the one canonical encoding is found (a near-uniform random LM makes the
    # all-encodings + edit search a breadth-first one, which may spend its small budget)
    assert rows[("prompted", "canonical+0 edits")]["success_pct"] == 100.0
    assert rows[("unprompted", "canonical+0 edits")]["per_input"] == 1.0
    assert set(result["ratios"]) == {"prompted", "unprompted"}
    assert (tmp_path / "run" / "toxicity.png").stat().st_size > 1000
    attempts = [json.loads(line) for line in
                (tmp_path / "run" / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 8
    assert all(len(a["matches"]) <= (1 if a["attack"] == "prompted" else 3) for a in attempts)
    assert all(a["message"] == "search stopped after 200 expansions" for a in attempts
               if not a["matches"])

    clean = _corpus(tmp_path, ["Nothing rude here."])
    result = relm.run(compose("relm", base[:2] + [f"toxicity.corpus={clean}",
                                                  "toxicity.words=[jerk]"]), tmp_path / "clean")
    assert result["inputs"] == 0 and result["rows"] == []
    result = relm.run(compose("relm", base[:2] + ["toxicity.words=[]"]), tmp_path / "empty")
    assert result["inputs"] == 0 and "empty" in result["message"]
    err = capsys.readouterr().err
    assert "no sentence of the corpus" in err and "word list is empty" in err
