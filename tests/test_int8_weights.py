"""Weight-only int8 linear layers (ctrlg.lm.int8_weights): the product is the dequantised
weight's, each weight within half a step of its float value, a model's every linear replaced,
its outputs close; load_model's switch; and the runs' comparison of the weight-format settings
(int8 and bfloat16 weights: ctrlg.tasks.config.OMITTED_AT_DEFAULT)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_llama

from ctrlg.lm.int8_weights import Int8WeightLinear, use_int8_weights
from ctrlg.lm.models import ModelLoadError, load_model
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.lm.skinny_linear import SkinnyLinear
from ctrlg.tasks.config import OMITTED_AT_DEFAULT


def _tiny_llama():
    return tiny_llama(97, hidden=32, layers=2)


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


def _dequantised_twin(model, quantized):
    """``model`` with each linear layer's weight replaced by its int8 twin's s ⊙ q, its inputs and
    outputs rounded to bfloat16 as the int8 kernel rounds them: the same arithmetic in float."""
    twin = copy.deepcopy(model)
    layers = dict(quantized.named_modules())
    for name, module in list(twin.named_modules()):
        if isinstance(module, torch.nn.Linear):
            int8 = layers[name]
            module.weight = torch.nn.Parameter(int8.q.float() * int8.scales.float()[:, None])
            module.register_forward_pre_hook(lambda m, args: (args[0].to(torch.bfloat16).float(),))
            module.register_forward_hook(lambda m, args, out: out.to(torch.bfloat16).float())
    return twin


def test_a_decoding_lm_computes_what_its_dequantised_weights_compute():
    reference, model = _tiny_llama(), _tiny_llama()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert use_int8_weights(model) == linears == 2 * 7 + 1
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert model.model.embed_tokens.weight.dtype == torch.float32    # the input embedding stays float
    twin = _dequantised_twin(reference, model)
    prompt = torch.tensor([[5, 9, 11, 2], [7, 7, 3, 1]])

    def kl(a, b):
        p, q = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
        return float((p.exp() * (p - q)).sum(-1).max())

    with torch.no_grad():
        outs = [m(prompt, use_cache=True) for m in (reference, twin, model)]
        for token in (None, 4, 8, 15):                              # the prompt, then cached steps
            if token is not None:
                step = torch.full((2, 1), token)
                outs = [m(step, **{cache_keyword(m): returned_cache(o)}, use_cache=True)
                        for m, o in zip((reference, twin, model), outs)]
            float_logits, twin_logits, int8_logits = (o.logits for o in outs)
            torch.testing.assert_close(int8_logits, twin_logits, rtol=2e-2, atol=2e-2)
            assert kl(float_logits, int8_logits) < 0.1               # an approximation of the LM


def test_load_model_applies_int8_weights_on_the_cpu_only(tmp_path, smollm2_tokenizer):
    _tiny_llama().save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    assert isinstance(load_model(tmp_path).lm_head, (torch.nn.Linear, SkinnyLinear))   # off by default
    assert isinstance(load_model(tmp_path, int8_weights=True).lm_head, Int8WeightLinear)
    with pytest.raises(ModelLoadError, match="int8_weights=True is a CPU decoding option"):
        load_model(tmp_path, int8_weights=True, device="meta")


@pytest.mark.parametrize("key", sorted(OMITTED_AT_DEFAULT))     # int8_weights, bf16_weights
def test_the_setting_is_compared_only_when_on(key):
    from omegaconf import OmegaConf

    from benchmarks.merge_common import setting
    from ctrlg.tasks.config import generation_config

    def config(**model):
        return OmegaConf.create({"seed": 0, "model": {"name": None, "dtype": "float32", **model}})

    older, off, on = config(), config(**{key: False}), config(**{key: True})
    # a run kept before the key existed computed in float: it stays comparable with the default
    assert generation_config(off, ["model"]) == generation_config(older, ["model"])
    assert generation_config(on, ["model"]) != generation_config(off, ["model"])
    containers = [OmegaConf.to_container(c) for c in (older, off, on)]
    assert setting(containers[0], "model") == setting(containers[1], "model") != setting(containers[2], "model")


@pytest.mark.parametrize("key", sorted(OMITTED_AT_DEFAULT))
def test_every_shipped_model_config_names_the_setting_off(key):
    from pathlib import Path

    from omegaconf import OmegaConf

    for path in sorted((Path(__file__).resolve().parents[1] / "configs" / "model").glob("*.yaml")):
        assert OmegaConf.load(path)[key] is False, path.name
