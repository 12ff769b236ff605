"""bfloat16-weight linear layers (ctrlg.lm.bf16_weights): the product is that of the rounded
weights and inputs summed in float32, a model's every linear replaced and its outputs those of
its rounded twin; load_model's switch and its refusal of two formats (the runs' comparison of
the setting: tests/test_int8_weights.py, for both weight formats)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_llama

from omegaconf import OmegaConf

from ctrlg.errors import ExperimentConfigError
from ctrlg.lm.bf16_weights import Bf16WeightLinear, native_bf16, use_bf16_weights
from ctrlg.lm.models import ModelLoadError, load_model
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.lm.skinny_linear import SkinnyLinear
from ctrlg.tasks import config as task_config


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 32), (4, 32), (2, 3, 32), (0, 32)])
def test_the_product_is_the_rounded_weights_summed_in_float(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 24, bias=bias)
    layer = Bf16WeightLinear(linear)
    assert layer.weight.dtype == torch.bfloat16
    # every stored weight within half a bfloat16 step (2⁻⁸ relative) of its float value
    assert bool(((layer.weight.float() - linear.weight).abs() <= linear.weight.abs() * 2 ** -8).all())
    x = torch.randn(*shape)
    products = F.linear(_rounded(x), _rounded(linear.weight))       # exact products, float32 sums
    got = layer(x)
    assert got.shape == (*shape[:-1], 24) and got.dtype == torch.float32
    # each sum rounded to bfloat16 once (half a step: 2⁻⁸ relative), then the float32 bias added
    sums = got - (linear.bias.detach() if bias else 0.0)
    assert bool(((sums - products).abs() <= products.abs() * 2 ** -8 + 1e-6).all())


def _rounded_twin(model):
    """``model`` with each linear layer's weight, input and output rounded to bfloat16, computed in
    float32 (Llama's linear layers have no bias)."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight = torch.nn.Parameter(_rounded(module.weight.detach()))
            module.register_forward_pre_hook(lambda m, args: (_rounded(args[0]),))
            module.register_forward_hook(lambda m, args, out: _rounded(out))
    return twin


def test_a_decoding_lm_computes_what_its_rounded_twin_computes():
    reference, model = tiny_llama(97, hidden=32, layers=2), tiny_llama(97, hidden=32, layers=2)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert use_bf16_weights(model) == linears == 2 * 7 + 1
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert model.model.embed_tokens.weight.dtype == torch.float32    # the input embedding stays float
    twin = _rounded_twin(reference)
    prompt = torch.tensor([[5, 9, 11, 2], [7, 7, 3, 1]])
    with torch.no_grad():
        outs = [m(prompt, use_cache=True) for m in (twin, model)]
        for token in (None, 4, 8, 15):                              # the prompt, then cached steps
            if token is not None:
                step = torch.full((2, 1), token)
                outs = [m(step, **{cache_keyword(m): returned_cache(o)}, use_cache=True)
                        for m, o in zip((twin, model), outs)]
            torch.testing.assert_close(outs[1].logits, outs[0].logits, rtol=2e-2, atol=2e-2)


def test_load_model_applies_bf16_weights_on_the_cpu_only_and_one_format_at_a_time(tmp_path, smollm2_tokenizer):
    tiny_llama(97, hidden=32, layers=2).save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    assert isinstance(load_model(tmp_path).lm_head, (torch.nn.Linear, SkinnyLinear))   # off by default
    assert isinstance(load_model(tmp_path, bf16_weights=True).lm_head, Bf16WeightLinear)
    with pytest.raises(ModelLoadError, match="bf16_weights=True is a CPU decoding option"):
        load_model(tmp_path, bf16_weights=True, device="meta")
    with pytest.raises(ModelLoadError, match="choose one weight format"):
        load_model(tmp_path, bf16_weights=True, int8_weights=True)


def test_native_bf16_is_what_onednn_reports():
    assert native_bf16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.parametrize("native", [False, True])
def test_auto_means_bf16_weights_where_the_cpu_multiplies_bfloat16_and_nothing_else_is_asked(monkeypatch, native):
    monkeypatch.setattr(task_config, "native_bf16", lambda: native)
    auto = OmegaConf.create({"bf16_weights": "auto", "int8_weights": False, "dtype": "float32"})
    assert task_config.bf16_weights_setting(auto) is native
    assert task_config.bf16_weights_setting(auto, device="cuda") is False
    assert task_config.bf16_weights_setting(OmegaConf.merge(auto, {"int8_weights": True})) is False
    assert task_config.bf16_weights_setting(OmegaConf.merge(auto, {"dtype": "bfloat16"})) is False
    for fixed in (True, False):
        assert task_config.bf16_weights_setting(OmegaConf.merge(auto, {"bf16_weights": fixed})) is fixed
    with pytest.raises(ExperimentConfigError, match="model.bf16_weights must be true, false or auto, got 'yes'"):
        task_config.bf16_weights_setting(OmegaConf.merge(auto, {"bf16_weights": "yes"}))
    run = OmegaConf.create({"model": {"bf16_weights": "auto"}, "ilm_model": {"bf16_weights": False}, "seed": 0})
    OmegaConf.set_struct(run, True)
    task_config.resolve_weight_formats(run, ("model", "ilm_model", "missing"))
    assert run.model.bf16_weights is native and run.ilm_model.bf16_weights is False
