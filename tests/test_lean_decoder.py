"""The lean Llama forward (ctrlg.lm.lean_decoder) computes what transformers' LlamaForCausalLM
computes: prompts, one- and many-position steps, rows padded on the right, batch repeats,
selections and beam reorders, in float32, with weight-first and with bfloat16 weights; and it
declines the models it does not cover."""

import copy

import pytest
import torch
from helpers import tiny_llama

from ctrlg.lm.bf16_weights import Bf16WeightLinear, use_bf16_weights
from ctrlg.lm.growing_cache import GrowingCache
from ctrlg.lm.int8_weights import use_int8_weights
from ctrlg.lm.lean_decoder import LeanLlama, lean_llama
from ctrlg.lm.shared_context import cache_keyword
from ctrlg.lm.skinny_linear import use_skinny_linears


def _model(kind: str):
    model = tiny_llama(61, hidden=32, layers=3)
    if kind == "bf16":
        use_bf16_weights(model)
    elif kind == "skinny":
        use_skinny_linears(model)
    return model


def _reference(model, cache, ids, mask, positions):
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                **{cache_keyword(model): cache})
    return out.logits.float()


@pytest.mark.parametrize("kind", ["float32", "skinny", "bf16"])
def test_the_lean_forward_equals_the_models_forward(kind):
    model = _model(kind)
    lean = lean_llama(model)
    assert isinstance(lean, LeanLlama)
    if kind == "bf16":
        assert isinstance(lean.layers[0].qkv, Bf16WeightLinear)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 61, (2, 6), generator=generator)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0                                    # a row padded on the left
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    caches = [GrowingCache(), GrowingCache()]
    tolerance = dict(rtol=1e-4, atol=1e-4) if kind != "bf16" else dict(rtol=2e-2, atol=2e-2)
    with torch.no_grad():
        want = _reference(model, caches[0], ids, mask, positions)
        got = lean(ids, mask, positions, caches[1])
        torch.testing.assert_close(got, want, **tolerance)
        for action in ["step", "ragged", "repeat", "step", "reorder", "ragged", "select", "step"]:
            if action == "repeat":
                for cache in caches:
                    cache.batch_repeat_interleave(2)
                mask, positions = mask.repeat_interleave(2, 0), positions.repeat_interleave(2, 0)
                continue
            if action in ("reorder", "select"):
                order = torch.tensor([3, 0, 0, 2]) if action == "reorder" else torch.tensor([1, 3])
                for cache in caches:
                    (cache.reorder_cache if action == "reorder" else cache.batch_select_indices)(order)
                mask, positions = mask[order], positions[order]
                continue
            rows, width = mask.shape[0], (4 if action == "ragged" else 1)
            new_ids = torch.randint(2, 61, (rows, width), generator=generator)
            new_mask = torch.ones(rows, width, dtype=torch.long)
            if action == "ragged":                     # rows bring 1..4 tokens, padded on the right
                for r in range(rows):
                    new_mask[r, 1 + r % width:] = 0
            new_positions = positions[:, -1:] + torch.arange(1, width + 1)[None]
            mask = torch.cat([mask, new_mask], 1)
            positions = torch.cat([positions, new_positions], 1)
            want = _reference(model, caches[0], new_ids, mask, new_positions)
            got = lean(new_ids, mask, new_positions, caches[1])
            valid = new_mask.bool()                    # pad positions' outputs are never read
            torch.testing.assert_close(got[valid], want[valid], **tolerance)


def test_the_lean_forward_is_kept_and_rebuilt_when_the_layers_change():
    model = _model("float32")
    first = lean_llama(model)
    assert lean_llama(model) is first
    use_bf16_weights(model)
    second = lean_llama(model)
    assert second is not first and isinstance(second.layers[0].qkv, Bf16WeightLinear)
    twin = copy.deepcopy(model)
    assert lean_llama(twin) is not second and lean_llama(twin).model is twin


def test_models_it_does_not_cover_are_declined():
    int8 = _model("float32")
    use_int8_weights(int8)
    assert lean_llama(int8) is None
    scaled = tiny_llama(61, hidden=32, layers=1)
    scaled.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert lean_llama(scaled) is None
    assert lean_llama(torch.nn.Linear(3, 3)) is None
    assert lean_llama(tiny_llama(61, hidden=32, layers=1).to(torch.bfloat16)) is None
