"""Weight-only int8 linear layers (ctrlg.lm.int8_weights): the product is the dequantised
weight's, each weight within half a step of its float value, a model's every linear replaced,
its outputs close; load_model's switch and the runs' comparison of the setting."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ctrlg.lm.int8_weights import Int8WeightLinear, use_int8_weights
from ctrlg.lm.models import ModelLoadError, load_model
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.lm.skinny_linear import SkinnyLinear


def _tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 32), (4, 32), (2, 3, 32), (0, 32)])
def test_the_product_is_the_dequantised_weights(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 24, bias=bias)
    linear.weight.data[3] = 0.0                                      # an all-zero output channel
    layer = Int8WeightLinear(linear)
    scales = linear.weight.abs().amax(1) / 127
    assert layer.q.dtype == torch.int8 and int(layer.q.abs().max()) == 127
    assert not layer.q[3].any()
    # every stored weight within half a quantisation step of its float value (one step per channel)
    assert bool(((layer.q.float() * scales[:, None] - linear.weight).abs() <= scales[:, None] / 2 + 1e-7).all())
    x = torch.randn(*shape)
    dequantised = layer.q.float() * layer.scales.float()[:, None]
    expected = F.linear(x.to(torch.bfloat16).float(), dequantised, linear.bias)
    got = layer(x)
    assert got.shape == (*shape[:-1], 24) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_a_decoding_lm_has_every_linear_replaced_and_stays_close():
    reference, model = _tiny_llama(), _tiny_llama()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert use_int8_weights(model) == linears == 2 * 7 + 1
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert model.model.embed_tokens.weight.dtype == torch.float32    # the input embedding stays float
    prompt = torch.tensor([[5, 9, 11, 2], [7, 7, 3, 1]])

    def kl(a, b):
        p, q = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
        return float((p.exp() * (p - q)).sum(-1).max())

    with torch.no_grad():
        ref_out, out = reference(prompt, use_cache=True), model(prompt, use_cache=True)
        assert kl(ref_out.logits, out.logits) < 1e-2
        ref_cache, cache = returned_cache(ref_out), returned_cache(out)
        for token in (4, 8, 15):                                    # cached one-token steps
            step = torch.full((2, 1), token)
            ref_out = reference(step, **{cache_keyword(reference): ref_cache}, use_cache=True)
            out = model(step, **{cache_keyword(model): cache}, use_cache=True)
            ref_cache, cache = returned_cache(ref_out), returned_cache(out)
            assert kl(ref_out.logits, out.logits) < 1e-2


def test_load_model_applies_int8_weights_on_the_cpu_only(tmp_path, smollm2_tokenizer):
    _tiny_llama().save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    assert isinstance(load_model(tmp_path).lm_head, SkinnyLinear)               # off by default
    assert isinstance(load_model(tmp_path, int8_weights=True).lm_head, Int8WeightLinear)
    with pytest.raises(ModelLoadError, match="int8_weights=True is a CPU decoding option"):
        load_model(tmp_path, int8_weights=True, device="meta")


def test_the_setting_is_compared_only_when_on():
    from omegaconf import OmegaConf

    from benchmarks.merge_common import setting
    from ctrlg.tasks.config import generation_config

    def config(**model):
        return OmegaConf.create({"seed": 0, "model": {"name": None, "dtype": "float32", **model}})

    older, off, on = config(), config(int8_weights=False), config(int8_weights=True)
    # a run kept before the key existed computed in float: it stays comparable with the default
    assert generation_config(off, ["model"]) == generation_config(older, ["model"])
    assert generation_config(on, ["model"]) != generation_config(off, ["model"])
    containers = [OmegaConf.to_container(c) for c in (older, off, on)]
    assert setting(containers[0], "model") == setting(containers[1], "model") != setting(containers[2], "model")


def test_every_shipped_model_config_names_the_setting_off():
    from pathlib import Path

    from omegaconf import OmegaConf

    for path in sorted((Path(__file__).resolve().parents[1] / "configs" / "model").glob("*.yaml")):
        assert OmegaConf.load(path).int8_weights is False, path.name
