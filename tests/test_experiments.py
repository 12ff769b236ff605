"""Smoke tests of every experiment entry point at tiny size: a tiny random Llama (the SmolLM2
tokenizer, so real constraints are built) and a tiny random HMM, passed through Hydra overrides
(``model.name=<dir>``, ``hmm.path=<dir>``) exactly as a user would."""

import json
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@pytest.fixture(scope="module")
def tiny_lm_dir(tmp_path_factory, smollm2_tokenizer):
    """A 1-layer, 16-wide random Llama over SmolLM2's vocabulary, saved with its tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = smollm2_tokenizer
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-random-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_hmm_dir(tmp_path_factory, smollm2_tokenizer):
    """A random 4-state HMM over SmolLM2's vocabulary with a random prior head for the tiny LM
    (width 16), as the default `ctrlg` method (prior=head) needs."""
    from ctrlg import HMM
    from ctrlg.hmm.prior_head import PriorHead

    generator = torch.Generator().manual_seed(0)
    h, V = 4, len(smollm2_tokenizer)
    normalise = lambda t: t / t.sum(-1, keepdim=True)  # noqa: E731
    hmm = HMM.from_params(normalise(torch.rand(h, generator=generator)),
                          normalise(torch.rand(h, h, generator=generator)),
                          normalise(torch.rand(h, V, generator=generator)))
    torch.manual_seed(0)
    hmm.prior_head = PriorHead(16, h, inner_size=4)
    path = tmp_path_factory.mktemp("tiny-hmm")
    hmm.save(path)
    return path


def compose(config_name: str, overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def run_interrupted(module, name: str, call: int, run) -> None:
    """``run()`` with ``module.name`` raising KeyboardInterrupt on its ``call``-th call (an
    interrupted run); the function is restored afterwards."""
    real, calls = getattr(module, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    setattr(module, name, interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            run()
    finally:
        setattr(module, name, real)


def test_commongen_smoke(tiny_lm_dir, tiny_hmm_dir, tmp_path, capsys):
    from experiments import commongen

    cfg = compose("commongen", ["pipeline=instruct", "methods=[unconstrained,logical,ctrlg]", f"model.name={tiny_lm_dir}", f"hmm.path={tiny_hmm_dir}",
                                "data.limit=2", "generation.num_samples=2",
                                "generation.max_new_tokens=10", "metrics.meteor=false"])
    table = commongen.run(cfg, tmp_path)
    assert set(table) == {"unconstrained", "logical", "ctrlg"}
    # the guided methods satisfy the constraint on every item: that is their guarantee
    assert table["logical"]["success"] == 100.0 and table["ctrlg"]["success"] == 100.0
    records = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert len(records) == 2 and records[0]["concepts"] == ["field", "look", "stand"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["items"] == 2 and "bleu4" in metrics["methods"]["ctrlg"]
    assert "generation:" in (tmp_path / "config.yaml").read_text()
    assert "| ctrlg" in capsys.readouterr().out


def test_commongen_beam_search_smoke(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    """generation.num_beams > 1: every method decodes by beam search (deterministic, no seed
    dependence), and the guided beams still satisfy every constraint."""
    from experiments import commongen

    overrides = ["pipeline=instruct", "methods=[unconstrained,logical,ctrlg]", f"model.name={tiny_lm_dir}", f"hmm.path={tiny_hmm_dir}", "data.limit=1",
                 "generation.num_samples=2", "generation.num_beams=3",
                 "generation.max_new_tokens=10", "metrics.meteor=false"]
    first = commongen.run(compose("commongen", overrides + ["seed=0"]), tmp_path / "a")
    second = commongen.run(compose("commongen", overrides + ["seed=5"]), tmp_path / "b")
    assert first["logical"]["success"] == 100.0 and first["ctrlg"]["success"] == 100.0
    texts = [[json.loads(line)[m]["text"] for m in ("unconstrained", "logical", "ctrlg")]
             for line in [(d / "generations.jsonl").read_text().splitlines()[0]
                          for d in (tmp_path / "a", tmp_path / "b")]]
    assert texts[0] == texts[1]


def test_runtime_smoke(tiny_lm_dir, tmp_path, capsys):
    from experiments import runtime

    cfg = compose("runtime", [f"model.name={tiny_lm_dir}", "hmm.hidden_size=4",
                              "concepts=[field_N,stand_V]", "dfa_sweep.max_words=[2,4]",
                              "dfa_sweep.max_new_tokens=6", "length_sweep.max_new_tokens=[4,8]",
                              "length_sweep.max_words=4"])
    result = runtime.run(cfg, tmp_path)
    assert [r["max_words"] for r in result["dfa_sweep"]] == [2, 4]
    assert result["dfa_sweep"][0]["dfa_states"] < result["dfa_sweep"][1]["dfa_states"]
    assert [r["max_new_tokens"] for r in result["length_sweep"]] == [4, 8]
    assert all(r["lm_ms"] > 0 and r["ctrlg_ms"] > 0 for r in result["length_sweep"])
    assert (tmp_path / "runtime.png").stat().st_size > 1000
    assert json.loads((tmp_path / "runtime.json").read_text())["hidden_size"] == 4
    assert "vs sequence length" in capsys.readouterr().out


def test_relm_lambada_smoke(tiny_lm_dir, tmp_path, capsys):
    from ctrlg.tasks.lambada import STOP_WORDS
    from experiments import relm

    cfg = compose("relm", [f"model.name={tiny_lm_dir}", "task=lambada", "lambada.limit=2",
                           "lambada.max_tokens=3", "lambada.top_k=5",
                           "lambada.max_expansions=20"])
    result = relm.run(cfg, tmp_path)
    assert [v["variant"] for v in result["variants"]] == ["baseline", "words", "terminated",
                                                          "no_stop"]
    assert all(0 <= v["accuracy"] <= 100 for v in result["variants"])
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert rows[0]["target"] == "signs"
    # the no_stop variant never predicts a stop word, the word variants always predict a word
    assert all(r["no_stop"].lower() not in STOP_WORDS for r in rows)
    assert all(re.fullmatch(r"[A-Za-z]*", r["words"]) for r in rows)
    assert "accuracy" in capsys.readouterr().out


def test_commongen_plus_smoke(tiny_lm_dir, tiny_hmm_dir, tmp_path):
    """`data=commongen_plus` runs CommonGen+ items (here one of 9 concepts) end to end."""
    from experiments import commongen

    cfg = compose("commongen", ["pipeline=instruct", f"model.name={tiny_lm_dir}",
                                f"hmm.path={tiny_hmm_dir}", "data=commongen_plus",
                                "data.offset=400", "data.limit=1", "generation.num_samples=2",
                                "generation.max_new_tokens=24", "metrics.meteor=false",
                                "bootstrap.resamples=0"])
    table = commongen.run(cfg, tmp_path)
    assert table["logical"]["success"] == 100.0 and table["ctrlg"]["success"] == 100.0
    (record,) = [json.loads(line) for line in
                 (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert record["index"] == 400 and len(record["concepts"]) == 9
