"""experiments.merge_runs and experiments.commongen_report: runs of different methods on the same
items merge into one folder, scored per range of items with the main job's own tables."""

import json

import pytest
from omegaconf import OmegaConf

from ctrlg.errors import ExperimentConfigError
from experiments.merge_runs import merge_runs


def _run(folder, methods, items, seed=0):
    folder.mkdir()
    OmegaConf.save(OmegaConf.create({"seed": seed, "methods": methods,
                                     "method_specs": {m: {"guide": m} for m in methods},
                                     "generation": {"num_beams": 8}, "data": {"limit": None},
                                     "batch_size": 10}), folder / "config.yaml")
    with open(folder / "generations.jsonl", "w") as handle:
        for index in items:
            record = {"index": index, "concepts": ["a"], "seconds": {m: 1.0 for m in methods}}
            record.update({m: {"text": f"{m} {index}"} for m in methods})
            handle.write(json.dumps(record) + "\n")
    return folder


def test_merge_keeps_the_items_every_run_finished(tmp_path):
    a = _run(tmp_path / "a", ["logical"], [0, 1, 2])
    b = _run(tmp_path / "b", ["ctrlg"], [0, 1])
    out = merge_runs(tmp_path / "out", [a, b])
    records = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1]
    assert records[1]["logical"]["text"] == "logical 1" and records[1]["ctrlg"]["text"] == "ctrlg 1"
    assert records[0]["seconds"] == {"logical": 1.0, "ctrlg": 1.0}
    config = OmegaConf.load(out / "config.yaml")
    assert list(config.methods) == ["logical", "ctrlg"] and set(config.method_specs) == {"logical", "ctrlg"}


def test_runs_of_other_settings_are_refused(tmp_path):
    a = _run(tmp_path / "a", ["logical"], [0])
    b = _run(tmp_path / "b", ["ctrlg"], [0], seed=1)
    with pytest.raises(ExperimentConfigError, match="seed"):
        merge_runs(tmp_path / "out", [a, b])
    with pytest.raises(ExperimentConfigError, match="at least two"):
        merge_runs(tmp_path / "out", [a])


def test_the_prior_head_must_agree_only_between_runs_that_use_it(tmp_path):
    def with_hmm(folder, hmm, specs=None):
        config = OmegaConf.load(folder / "config.yaml")
        config.hmm = hmm
        if specs:
            config.method_specs = specs
        OmegaConf.save(config, folder / "config.yaml")
        return folder

    a = with_hmm(_run(tmp_path / "a", ["logical"], [0, 1]), {"name": "x"})   # a run made before the key
    b = with_hmm(_run(tmp_path / "b", ["head"], [0, 1]), {"name": "x", "prior_head": "p"},
                 {"head": {"guide": "ctrlg", "prior": "head"}})
    config = OmegaConf.load(merge_runs(tmp_path / "out", [a, b]) / "config.yaml")
    assert config.hmm.prior_head == "p" and config.hmm.name == "x"
    c = with_hmm(_run(tmp_path / "c", ["head"], [0, 1]), {"name": "x", "prior_head": "q"},
                 {"head": {"guide": "ctrlg", "prior": "head"}})
    with pytest.raises(ExperimentConfigError, match="different prior heads"):
        merge_runs(tmp_path / "out2", [a, b, c])
    d = with_hmm(_run(tmp_path / "d", ["ctrlg"], [0, 1]), {"name": "y"})
    with pytest.raises(ExperimentConfigError, match="hmm"):          # another HMM still differs
        merge_runs(tmp_path / "out3", [a, d])


def test_runs_over_other_items_and_extra_methods_merge_on_the_chosen_methods(tmp_path):
    a = _run(tmp_path / "a", ["ctrlg"], [0, 1])
    b = _run(tmp_path / "b", ["ctrlg", "ctrlg_w2"], [2])           # e.g. a tuning run
    c = _run(tmp_path / "c", ["logical"], [0, 1, 2])
    config = OmegaConf.load(b / "config.yaml")
    config.data = {"offset": 2, "limit": 1}                         # covered other items
    OmegaConf.save(config, b / "config.yaml")
    out = merge_runs(tmp_path / "out", [a, b, c], ["logical", "ctrlg"])
    records = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert all("ctrlg_w2" not in r and set(r["seconds"]) == {"ctrlg", "logical"} for r in records)
    assert list(OmegaConf.load(out / "config.yaml").methods) == ["logical", "ctrlg"]
    with pytest.raises(ExperimentConfigError, match="unconstrained"):
        merge_runs(tmp_path / "out2", [a, c], ["unconstrained"])


def test_report_scores_each_range_apart_like_the_main_job(tmp_path, capsys):
    from experiments.commongen_report import report_ranges, side_by_side

    folder = tmp_path / "run"
    folder.mkdir()
    OmegaConf.save(OmegaConf.create({
        "methods": ["logical", "ctrlg"],
        "method_specs": {"logical": {"guide": "logical"}, "ctrlg": {"guide": "ctrlg"}},
        "metrics": {"meteor": False},
        "bootstrap": {"baseline": "logical", "resamples": 50, "seed": 0, "confidence": 0.95}}),
        folder / "config.yaml")
    refs = ["a dog runs in the park", "the cat sleeps on the mat", "kids play ball outside",
            "the man reads a book"]
    with open(folder / "generations.jsonl", "w") as handle:
        for index, ref in enumerate(refs):
            good = {"text": ref, "accepted": True, "words": len(ref.split())}
            bad = {"text": "word salad here", "accepted": True, "words": 3}
            handle.write(json.dumps({"index": index, "concepts": ["x"], "keyword_groups": [["x"]],
                                     "references": [ref], "seconds": {"logical": 1, "ctrlg": 2},
                                     "logical": bad, "ctrlg": good if index < 2 else bad}) + "\n")
    result = report_ranges(folder, [(0, 2), (2, 4)])
    assert result["0:2"]["items"] == 2 and abs(result["0:2"]["methods"]["ctrlg"]["bleu4"] - 100.0) < 1e-6
    assert result["2:4"]["methods"]["ctrlg"]["bleu4"] == result["2:4"]["methods"]["logical"]["bleu4"]
    assert result["0:2"]["intervals"]["ctrlg"]["bleu4"]["low"] > 0
    assert result["0:2"]["methods"]["ctrlg"]["rouge_l_coco"] == pytest.approx(100.0)
    with pytest.raises(ExperimentConfigError, match="no scored item"):
        report_ranges(folder, [(10, 20)])
    table = side_by_side(folder, 1)
    assert "| 0 | x | word salad here | a dog runs in the park | a dog runs in the park |" in table
    config = OmegaConf.load(folder / "config.yaml")   # a merge of differently decoded methods says so
    config.differing_settings = {"generation.num_beams": {"logical": 32, "ctrlg": 128}}
    OmegaConf.save(config, folder / "config.yaml")
    report_ranges(folder, [(0, 4)])
    assert "decoded with different generation.num_beams: logical 32, ctrlg 128" in capsys.readouterr().out


def test_coco_rouge_l_takes_the_best_precision_and_recall_over_the_references():
    from ctrlg.tasks.commongen.scoring import coco_rouge_l

    def f_beta(precision, recall, beta=1.2):
        return (1 + beta ** 2) * precision * recall / (recall + beta ** 2 * precision)

    # LCS("a b c d", "a c d e") = "a c d": P = R = 3/4
    assert coco_rouge_l(["A b, c d."], [["a c d e"]]) == pytest.approx(75.0)
    # the best precision (3/4, from the long reference) and the best recall (1, from "a b") come
    # from different references
    assert coco_rouge_l(["a b c d"], [["a b", "a b c x y z w v"]]) == pytest.approx(
        100 * f_beta(3 / 4, 1.0))
    assert coco_rouge_l(["zzz", "a b"], [["a b"], ["a b"]]) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="same non-zero number"):
        coco_rouge_l(["a"], [])


def test_opening_words_counts_first_words_and_scores_rare_openings_apart():
    from ctrlg import metrics
    from experiments.commongen_report import opening_words

    # 100 references, one opens with "actor": 1 % is not under 1 %, so not a rare opening
    refs = [["The dog runs in the park.", "A cat sleeps."]] * 49 + [["The man reads.", "actor waves."]]
    outputs = ["Actor walks the dog."] * 30 + ["The dog runs in the park."] * 20
    records = [{"index": i, "references": r, "ctrlg": {"text": t}}
               for i, (r, t) in enumerate(zip(refs, outputs))]
    result = opening_words(records, ["ctrlg"], top=2)
    assert result["references"] == [["the", 0.5], ["a", 0.49]]
    assert result["ctrlg"]["top"] == [["actor", 0.6], ["the", 0.4]]
    assert result["ctrlg"]["common"]["items"] == 50 and result["ctrlg"]["rare"] == {"items": 0}

    records[-1]["references"] = ["The man reads.", "A man waves."]   # now no reference opens with actor
    result = opening_words(records, ["ctrlg"], top=2)
    rare, common = result["ctrlg"]["rare"], result["ctrlg"]["common"]
    assert (rare["items"], common["items"]) == (30, 20)
    want_rare = [(r["ctrlg"]["text"], r["references"]) for r in records[:30]]
    assert rare["bleu4"] == pytest.approx(metrics.bleu4(*zip(*want_rare)))
    assert rare["cider"] == pytest.approx(10 * metrics.cider(*zip(*want_rare)))
    want_common = [(r["ctrlg"]["text"], r["references"]) for r in records[30:]]
    assert common["bleu4"] == pytest.approx(metrics.bleu4(*zip(*want_common))) and common["bleu4"] > 90


def test_runs_may_differ_in_named_settings_recorded_per_method(tmp_path):
    a = _run(tmp_path / "a", ["logical"], [0, 1])
    b = _run(tmp_path / "b", ["ctrlg"], [0, 1])
    config = OmegaConf.load(b / "config.yaml")
    config.generation.num_beams = 128
    OmegaConf.save(config, b / "config.yaml")
    with pytest.raises(ExperimentConfigError, match="generation"):
        merge_runs(tmp_path / "out", [a, b])
    out = merge_runs(tmp_path / "out", [a, b], allow_differing=["generation.num_beams"])
    merged = OmegaConf.load(out / "config.yaml")
    assert OmegaConf.to_container(merged.differing_settings) == {
        "generation.num_beams": {"logical": 8, "ctrlg": 128}}
    with pytest.raises(ExperimentConfigError, match="section.key"):
        merge_runs(tmp_path / "out2", [a, b], allow_differing=["generation"])
    c = _run(tmp_path / "c", ["ctrlg"], [2])                     # ctrlg at 8 beams elsewhere
    with pytest.raises(ExperimentConfigError, match="different generation.num_beams"):
        merge_runs(tmp_path / "out3", [a, b, c], allow_differing=["generation.num_beams"])


def test_runs_may_differ_in_batch_size_named_whole(tmp_path):
    a = _run(tmp_path / "a", ["logical"], [0, 1])
    b = _run(tmp_path / "b", ["ctrlg"], [0, 1])
    config = OmegaConf.load(b / "config.yaml")
    config.batch_size = config.batch_size + 7
    OmegaConf.save(config, b / "config.yaml")
    with pytest.raises(ExperimentConfigError, match="batch_size"):
        merge_runs(tmp_path / "out", [a, b])
    out = merge_runs(tmp_path / "out", [a, b], allow_differing=["batch_size"])
    merged = OmegaConf.load(out / "config.yaml")
    want = OmegaConf.load(a / "config.yaml").batch_size
    assert OmegaConf.to_container(merged.differing_settings) == {
        "batch_size": {"logical": want, "ctrlg": want + 7}}
    assert [json.loads(line)["index"] for line in open(out / "generations.jsonl")] == [0, 1]
    with pytest.raises(ExperimentConfigError, match="batch_size"):    # a section is not a scalar
        merge_runs(tmp_path / "out2", [a, b], allow_differing=["data"])
