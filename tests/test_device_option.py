"""The ``device`` and ``generation.guide_kernel`` settings of experiments.commongen: how they are
read, that bad values are clear errors, that neither is part of a run's identity (a run decoded on
a GPU resumes and merges with one decoded on the CPU), and that the LM and the HMM land on the
device named."""

import pytest
import torch
from omegaconf import OmegaConf

from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks.commongen.methods import generation_settings, guide_kernel, method_spec
from ctrlg.tasks.commongen.pipeline import load_models
from ctrlg.tasks.config import resolve_device
from experiments.merge_runs import merge_runs
from test_commongen_runs import _run
from test_experiments import compose, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)


def test_resolve_device_reads_cpu_auto_and_refuses_what_is_missing():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ExperimentConfigError, match="expected cpu, cuda"):
        resolve_device("tpu-ish")
    with pytest.raises(ExperimentConfigError, match="expected cpu, cuda"):
        resolve_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ExperimentConfigError, match="no CUDA GPU"):
            resolve_device("cuda")


@pytest.mark.parametrize("value, expected", [("auto", None), (None, None), (True, True), (False, False)])
def test_guide_kernel_values(value, expected):
    assert guide_kernel(OmegaConf.create({"guide_kernel": value})) is expected


def test_guide_kernel_rejects_other_values():
    with pytest.raises(ExperimentConfigError, match="guide_kernel must be auto, true or false"):
        guide_kernel(OmegaConf.create({"guide_kernel": "triton"}))


def test_device_and_guide_kernel_are_not_part_of_a_runs_identity(tiny_lm_dir, tiny_hmm_dir):
    base = [f"model.name={tiny_lm_dir}", f"hmm.path={tiny_hmm_dir}"]
    plain = generation_settings(compose("commongen", base))
    other = generation_settings(compose("commongen", base + ["device=auto",
                                                            "generation.guide_kernel=false"]))
    assert plain == other
    assert "guide_kernel" not in plain["generation"] and "device" not in plain
    changed = generation_settings(compose("commongen", base + ["generation.num_beams=3"]))
    assert changed != plain                       # a setting that decides the outputs still counts


def test_runs_that_differ_only_in_the_guide_kernel_merge(tmp_path):
    a = _run(tmp_path / "a", ["logical"], [0, 1])
    b = _run(tmp_path / "b", ["ctrlg"], [0, 1])
    config = OmegaConf.load(b / "config.yaml")
    config.generation.guide_kernel = False
    OmegaConf.save(config, b / "config.yaml")
    out = merge_runs(tmp_path / "out", [a, b])
    assert (out / "generations.jsonl").read_text().count("\n") == 2
    config.generation.num_beams = 4               # but not in what decides the generations
    OmegaConf.save(config, b / "config.yaml")
    with pytest.raises(ExperimentConfigError, match="generation"):
        merge_runs(tmp_path / "out2", [a, b])


def test_load_models_puts_the_lm_and_the_hmm_on_the_device(tiny_lm_dir, tiny_hmm_dir):
    cfg = compose("commongen", [f"model.name={tiny_lm_dir}", "model.adapter=null",
                                f"hmm.path={tiny_hmm_dir}", "device=cpu", "methods=[ctrlg]"])
    specs = {m: method_spec(cfg, m) for m in cfg.methods}
    model, _, hmm = load_models(cfg, specs)
    assert next(model.parameters()).device == torch.device("cpu")
    assert hmm.emission.device == torch.device("cpu")
    if not torch.cuda.is_available():
        cfg.device = "cuda"
        with pytest.raises(ExperimentConfigError, match="no CUDA GPU"):
            load_models(cfg, specs)
