"""The weight-only int8 LM that benchmarks/bench_infill_floor measures (``--quantization``): its
product is the dequantised weight's, and every linear layer of a model is replaced."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.bench_infill_floor import Int8WeightLinear, int8_weights


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 32), (4, 32), (2, 3, 32)])
def test_int8_weight_product_is_the_dequantised_weights(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 24, bias=bias)
    layer = Int8WeightLinear(linear)
    scales = linear.weight.abs().amax(1) / 127
    assert layer.q.dtype == torch.int8 and int(layer.q.abs().max()) == 127
    # the stored weights are within half a step of the float ones, one step per output channel
    assert bool(((layer.q.float() * scales[:, None] - linear.weight).abs() <= scales[:, None] / 2 + 1e-7).all())
    x = torch.randn(*shape)
    dequantised = layer.q.float() * layer.scales.float()[:, None]
    expected = F.linear(x.to(torch.bfloat16).float(), dequantised, linear.bias)
    got = layer(x)
    assert got.shape == (*shape[:-1], 24) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_every_linear_of_a_model_is_replaced_and_its_outputs_stay_close():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2)).eval()
    quantized = int8_weights(model)
    assert not any(type(m) is torch.nn.Linear for m in quantized.modules())
    assert sum(isinstance(m, Int8WeightLinear) for m in quantized.modules()) == 2 * 7 + 1
    assert any(type(m) is torch.nn.Linear for m in model.modules())        # the original is untouched
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        reference = torch.log_softmax(model(ids).logits, -1)
        approximate = torch.log_softmax(quantized(ids).logits, -1)
    kl = (reference.exp() * (reference - approximate)).sum(-1)
    assert float(kl.max()) < 1e-2
