"""experiments.merge_runs: runs of different methods on the same items merge into one folder that
experiments.commongen scores as if one run had decoded every method."""

import json

import pytest
from omegaconf import OmegaConf

from experiments.common import ExperimentConfigError
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
