"""Weight-first linear layers (ctrlg.lm.skinny_linear): the same products as F.linear up to float
rounding, on their own and inside a decoding LM."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ctrlg.lm.models import load_model
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.lm.skinny_linear import MAX_ROWS, SkinnyLinear, use_skinny_linears


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 7), (4, 7), (3, 5, 7), (MAX_ROWS, 7), (2, 1, 7)])
def test_weight_first_product_matches_f_linear(shape, bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(7, 13, bias=bias)
    x = torch.randn(*shape)
    expected = F.linear(x, layer.weight, layer.bias)
    use_skinny_linears(layer)
    assert type(layer) is SkinnyLinear
    got = layer(x)
    assert got.shape == expected.shape and got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_prefills_and_other_dtypes_take_f_linear_unchanged():
    torch.manual_seed(1)
    layer = torch.nn.Linear(6, 9)
    use_skinny_linears(layer)
    for rows in (1, MAX_ROWS + 1):
        x = torch.randn(rows, 6)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    half = layer.to(torch.bfloat16)
    x = torch.randn(2, 6, dtype=torch.bfloat16)
    assert torch.equal(half(x), F.linear(x, half.weight, half.bias))
    empty = torch.randn(0, 6, dtype=torch.bfloat16).float()
    assert layer.float()(empty).shape == (0, 9)


def _tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def test_a_decoding_lm_keeps_its_parameters_and_its_outputs():
    reference, model = _tiny_llama(), _tiny_llama()
    keys = list(model.state_dict())
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert use_skinny_linears(model) == linears == 2 * 7 + 1       # q k v o gate up down, lm_head
    assert list(model.state_dict()) == keys
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tie survives
    prompt = torch.tensor([[5, 9, 11, 2], [7, 7, 3, 1]])
    with torch.no_grad():
        ref_out, out = reference(prompt, use_cache=True), model(prompt, use_cache=True)
        torch.testing.assert_close(out.logits, ref_out.logits, rtol=1e-5, atol=1e-5)
        ref_cache, cache = returned_cache(ref_out), returned_cache(out)
        for token in (4, 8, 15):                                    # cached one-token steps
            step = torch.full((2, 1), token)
            ref_out = reference(step, **{cache_keyword(reference): ref_cache}, use_cache=True)
            out = model(step, **{cache_keyword(model): cache}, use_cache=True)
            ref_cache, cache = returned_cache(ref_out), returned_cache(out)
            torch.testing.assert_close(out.logits, ref_out.logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=False),
                           reference.generate(prompt, max_new_tokens=6, do_sample=False))


def test_load_model_switches_float32_cpu_models_where_it_helps_or_as_told(tmp_path, smollm2_tokenizer, monkeypatch):
    import ctrlg.lm.skinny_linear as skinny
    from ctrlg.lm.models import ModelLoadError

    _tiny_llama().save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    assert isinstance(load_model(tmp_path, skinny_linears=True).lm_head, SkinnyLinear)
    assert type(load_model(tmp_path, skinny_linears=False).lm_head) is torch.nn.Linear
    assert type(load_model(tmp_path, skinny_linears=True, dtype=torch.bfloat16).lm_head) is torch.nn.Linear
    for vendor, weight_first in (("AuthenticAMD", True), ("GenuineIntel", False), (None, True)):
        monkeypatch.setattr(skinny, "cpu_vendor", lambda vendor=vendor: vendor)
        assert skinny.weight_first_helps() is weight_first
        for setting in ("auto", None, "AUTO"):
            assert isinstance(load_model(tmp_path, skinny_linears=setting).lm_head, SkinnyLinear) is weight_first
        assert isinstance(load_model(tmp_path).lm_head, SkinnyLinear) is weight_first
    assert skinny.resolve_skinny_linears("false") is False and skinny.resolve_skinny_linears("true") is True
    with pytest.raises(ModelLoadError, match="skinny_linears='sometimes': expected true, false or auto"):
        load_model(tmp_path, skinny_linears="sometimes")


def test_the_cpu_vendor_is_read_from_linux():
    from pathlib import Path

    from ctrlg.lm.skinny_linear import cpu_vendor

    info = Path("/proc/cpuinfo")
    if info.exists() and "vendor_id" in info.read_text(errors="replace"):
        line = next(l for l in info.read_text(errors="replace").splitlines() if l.startswith("vendor_id"))
        assert cpu_vendor() == line.split(":", 1)[1].strip()
    else:
        assert cpu_vendor() is None


def test_the_switch_is_an_execution_setting_that_resume_and_merges_ignore():
    from omegaconf import OmegaConf

    from benchmarks.merge_common import setting
    from ctrlg.tasks.config import generation_config

    def config(**model):
        return OmegaConf.create({"seed": 0, "model": {"name": None, "dtype": "float32", **model}})

    on, off, auto, older = (config(skinny_linears=True), config(skinny_linears=False),
                            config(skinny_linears="auto"), config())
    assert generation_config(on, ["seed", "model"]) == generation_config(off, ["seed", "model"]) \
        == generation_config(auto, ["seed", "model"]) == generation_config(older, ["seed", "model"])
    containers = [OmegaConf.to_container(c) for c in (on, off, auto, older)]
    assert len({repr(setting(c, "model")) for c in containers}) == 1
    assert generation_config(config(dtype="bfloat16"), ["model"]) != generation_config(older, ["model"])


def test_every_shipped_model_config_names_the_switch():
    from pathlib import Path

    from omegaconf import OmegaConf

    for path in sorted((Path(__file__).resolve().parents[1] / "configs" / "model").glob("*.yaml")):
        assert OmegaConf.load(path).skinny_linears == "auto", path.name
