"""Per-profession bias tests against scipy on hand-built tables and Bonferroni by hand, and the
merge of single-configuration bias runs (settings checked, configurations joined, plotted)."""

import json

import numpy as np
import pytest
from omegaconf import OmegaConf
from scipy.stats import chi2_contingency, fisher_exact

from ctrlg.errors import ExperimentConfigError
from ctrlg.relm.bias import chi2_test, merge_runs, profession_tests

PROFESSIONS = ["art", "math", "law"]


def test_profession_tests_are_fishers_exact_test_bonferroni_adjusted():
    counts = np.array([[30, 5, 0], [10, 25, 0]])           # law never drawn: not tested
    rows = profession_tests(counts, PROFESSIONS, ["man", "woman"])
    assert [r["profession"] for r in rows] == ["art", "math"]
    for row, j in zip(rows, (0, 1)):
        table = [[counts[0, j], counts[1, j]], [35 - counts[0, j], 35 - counts[1, j]]]
        assert row["p_value"] == pytest.approx(fisher_exact(table)[1])
        assert row["p_adjusted"] == pytest.approx(min(1.0, 2 * row["p_value"]))
        assert row["share"] == {"man": pytest.approx(counts[0, j] / 35),
                                "woman": pytest.approx(counts[1, j] / 35)}
        assert row["significant"] == (row["p_adjusted"] < 0.05)
    assert all(r["significant"] for r in rows)
    equal = profession_tests(np.array([[10, 10, 10], [10, 10, 10]]), PROFESSIONS, ["a", "b"])
    assert not any(r["significant"] for r in equal) and all(r["p_value"] == 1.0 for r in equal)
    three = profession_tests(np.array([[5, 5, 0], [9, 1, 0], [2, 8, 0]]), PROFESSIONS,
                             ["a", "b", "c"])
    table = np.array([[5, 9, 2], [5, 1, 8]])
    assert three[0]["p_value"] == pytest.approx(chi2_contingency(table)[1])


def _run(tmp_path, name, configurations, **bias):
    cfg = {"task": "bias", "seed": 0, "model": {"name": None},
           "bias": {"genders": ["man", "woman"], "professions": PROFESSIONS, "num_samples": 20,
                    "prefix": [True], "encodings": ["canonical"], "edit_distances": [0], **bias}}
    rows = []
    for name_, counts in configurations:
        table = np.array([[counts[0][p] for p in range(3)], [counts[1][p] for p in range(3)]])
        rows.append({"configuration": name_, "counts": {
            g: dict(zip(PROFESSIONS, map(int, table[i]))) for i, g in enumerate(["man", "woman"])},
            **chi2_test(table), "seconds": 1.0})
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    (folder / "results.json").write_text(json.dumps(
        {"task": "bias", "configurations": rows, "wall_seconds": 2.0, "cpu_seconds": 1.5}))
    (folder / "samples.jsonl").write_text(json.dumps({"configuration": rows[0]["configuration"],
                                                      "text": "x"}) + "\n")
    return folder


def test_merged_runs_keep_each_configuration_with_its_tests_and_plot(tmp_path):
    from benchmarks.merge_relm_bias import main

    a = _run(tmp_path, "a", [("prefix, all, 1 edit", ([12, 4, 4], [3, 14, 3]))],
             encodings=["all"], edit_distances=[1])
    b = _run(tmp_path, "b", [("prefix, canonical, 0 edits", ([7, 7, 6], [6, 7, 7]))])
    merged = main([str(a), str(b), "--out", str(tmp_path / "out")])
    assert [c["configuration"] for c in merged["configurations"]] == \
        ["prefix, all, 1 edit", "prefix, canonical, 0 edits"]
    first = merged["configurations"][0]
    assert first["professions"] == profession_tests(
        np.array([[12, 4, 4], [3, 14, 3]]), PROFESSIONS, ["man", "woman"])
    assert merged["runs"] == [{"wall_seconds": 2.0, "cpu_seconds": 1.5}] * 2
    out = tmp_path / "out"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2
    assert (out / "bias.png").stat().st_size > 1000
    config = OmegaConf.load(out / "config.yaml")
    assert list(config.bias.encodings) == ["all", "canonical"]
    assert list(config.bias.edit_distances) == [0, 1] and len(config.runs) == 2


def test_runs_that_differ_in_other_settings_or_repeat_a_configuration_are_refused(tmp_path):
    counts = ([5, 5, 5], [5, 5, 5])
    a = _run(tmp_path, "a", [("prefix, canonical, 0 edits", counts)])
    b = _run(tmp_path, "b", [("prefix, all, 0 edits", counts)], num_samples=40)
    c = _run(tmp_path, "c", [("prefix, canonical, 0 edits", counts)])
    load = lambda run: (json.loads((run / "results.json").read_text()),          # noqa: E731
                        OmegaConf.to_container(OmegaConf.load(run / "config.yaml")))
    with pytest.raises(ExperimentConfigError, match="differs from run 0 in bias"):
        merge_runs(*zip(load(a), load(b)))
    with pytest.raises(ExperimentConfigError, match="comes from two runs"):
        merge_runs(*zip(load(a), load(c)))
    unfinished = {**load(a)[0], "finished": False}
    with pytest.raises(ExperimentConfigError, match="did not finish"):
        merge_runs([unfinished], [load(a)[1]])
