"""Requests too large for the memory available are refused with the estimate before any work
(ctrlg.memory): in ctrlg.generate, in the guide's table build, in the editor's server (HTTP 503,
the server keeps serving) and in the CommonGen experiment. The estimates are checked against the
sizes of the real tensors they predict."""

import sys

import pytest
import torch

import ctrlg
from ctrlg import dfa, memory
from ctrlg.errors import CtrlgError, InsufficientMemoryError


def tiny_hmm(h=4, V=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    norm = lambda t: t / t.sum(-1, keepdim=True)  # noqa: E731
    return ctrlg.HMM.from_params(norm(torch.rand(h, generator=g)), norm(torch.rand(h, h, generator=g)),
                                 norm(torch.rand(h, V, generator=g)))


def limit_memory(monkeypatch, available: int):
    """Pretend every device has ``available`` bytes free; returns the devices asked about."""
    asked = []

    def fake(device=None):
        asked.append(str(device))
        return available

    monkeypatch.setattr(memory, "available_bytes", fake)
    return asked


def test_the_error_is_a_ctrlg_error_and_a_memory_error():
    assert issubclass(InsufficientMemoryError, CtrlgError)
    assert issubclass(InsufficientMemoryError, ValueError)
    assert issubclass(InsufficientMemoryError, MemoryError)


def test_available_bytes_reads_meminfo_without_psutil(monkeypatch):
    with open("/proc/meminfo") as handle:
        line = next(x for x in handle if x.startswith("MemAvailable:"))
    expected = int(line.split()[1]) * 1024
    monkeypatch.setitem(sys.modules, "psutil", None)      # import psutil → ImportError
    got = memory.available_bytes()
    assert abs(got - expected) < 256 * 2**20               # the same figure, up to drift


def test_the_table_estimate_is_the_size_of_the_tables_built():
    from ctrlg.guide.tables import build_tables

    hmm = tiny_hmm(h=5, V=12)
    d = dfa.intersect(dfa.phrase([3, 4], vocab_size=12), dfa.length(0, 9, vocab_size=12))
    tables = build_tables(hmm, d, max_new_tokens=7)
    built = (tables.w_hat.numel() * tables.w_hat.element_size()
             + tables.log_scale.numel() * tables.log_scale.element_size()
             + tables.feasible.size * tables.feasible.itemsize)
    assert memory.guide_table_bytes(tables.dfa.num_states, 5, 7) == built


def test_the_kv_cache_estimate_is_the_size_of_the_cache(smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    rows, length = 3, 11
    with torch.no_grad():
        out = model(input_ids=torch.zeros(rows, length, dtype=torch.long), use_cache=True)
    cache = out.past_key_values
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)] \
        if hasattr(cache, "layers") else [t for pair in cache for t in pair]
    actual = sum(t.numel() * t.element_size() for t in tensors)
    assert memory._kv_cache_bytes(model, rows, length) == actual


def test_generate_refuses_before_decoding(smollm2_tokenizer, monkeypatch):
    from app_fixtures import tiny_model

    model, hmm = tiny_model(smollm2_tokenizer)
    calls = []
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1))
    asked = limit_memory(monkeypatch, 50 * 2**20)           # 50 MiB "available"
    constraint = dfa.keywords([["cat"]], smollm2_tokenizer)
    with pytest.raises(InsufficientMemoryError) as info:
        ctrlg.generate(model, smollm2_tokenizer, "The", constraint, hmm=hmm, max_new_tokens=64,
                       num_samples=64)
    message = str(info.value)
    assert "num_samples=64" in message and "max_new_tokens=64" in message
    assert "50.0 MiB is available" in message and "rescoring" in message
    assert calls == [] and asked == ["cpu"]
    monkeypatch.undo()                     # the real memory and model.generate: it runs
    out = ctrlg.generate(model, smollm2_tokenizer, "The", constraint, hmm=hmm, max_new_tokens=8,
                         num_samples=2, rank_by_lm=False)
    assert all(constraint.accepts(g.token_ids) for g in out)


def test_the_processor_refuses_tables_that_do_not_fit(monkeypatch):
    """The table check runs first: no table is allocated (torch.zeros is never reached)."""
    from ctrlg.guide import tables as tables_module

    hmm = tiny_hmm(h=64, V=12)
    d = dfa.length(0, 200, vocab_size=12)
    need = memory.guide_table_bytes(d.num_states, 64, 200)
    limit_memory(monkeypatch, need - 1)
    allocated = []
    real_zeros = torch.zeros
    monkeypatch.setattr(tables_module.torch, "zeros",
                        lambda *a, **k: allocated.append(a) or real_zeros(*a, **k))
    with pytest.raises(InsufficientMemoryError, match=rf"{d.num_states}-state DFA with an h = 64 "
                                                      r"HMM and max_new_tokens=200"):
        ctrlg.ConstraintLogitsProcessor(hmm, d, prompt_length=1, max_new_tokens=200)
    assert allocated == []
    limit_memory(monkeypatch, need)                         # exactly enough: built
    proc = ctrlg.ConstraintLogitsProcessor(hmm, d, prompt_length=1, max_new_tokens=200)
    assert proc is not None


def test_the_editor_answers_503_and_keeps_serving(smollm2_tokenizer, monkeypatch):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from app_fixtures import live_server, tiny_model
    from ctrlg.app import create_app
    from test_app import call

    model, hmm = tiny_model(smollm2_tokenizer)
    body = {"prefix": "The cat", "keyphrases": ["lamp"], "num_candidates": 8,
            "max_new_tokens": 100}
    with live_server(create_app(model, smollm2_tokenizer, hmm)) as base:
        limit_memory(monkeypatch, 20 * 2**20)
        status, response = call(base, "/api/generate", body)
        assert status == 503 and set(response) == {"error"}
        assert "num_candidates=8" in response["error"] and "20.0 MiB" in response["error"]
        assert call(base, "/api/health")[1]["status"] == "ok"
        monkeypatch.undo()
        status, response = call(base, "/api/generate", dict(body, num_candidates=2,
                                                           max_new_tokens=12))
        assert status == 200 and response["candidates"]


def test_the_commongen_experiment_refuses_a_batch_that_does_not_fit(tiny_lm_dir, tiny_hmm_dir,
                                                                    tmp_path, monkeypatch):
    from experiments import commongen
    from test_commongen import small_overrides
    from test_experiments import compose

    limit_memory(monkeypatch, 10 * 2**20)
    cfg = compose("commongen", small_overrides(tiny_lm_dir, tiny_hmm_dir, "data.limit=2",
                                               "batch_size=2"))
    with pytest.raises(InsufficientMemoryError, match=r"batch_size.*10\.0 MiB|10\.0 MiB.*batch_size"):
        commongen.run(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "generations.jsonl").read_text() == ""   # nothing decoded


from test_experiments import tiny_hmm_dir, tiny_lm_dir  # noqa: E402,F401 (fixtures)
