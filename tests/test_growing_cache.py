"""The in-place KV cache (ctrlg.lm.growing_cache): a decoding LM computes with it what it computes
with transformers' DynamicCache, through prompts, one- and many-position steps, padded rows, batch
repeats and selections, beam reorders and crops, past the first buffer's capacity."""

import pytest
import torch
from helpers import tiny_llama
from transformers import DynamicCache

from ctrlg.lm import growing_cache
from ctrlg.lm.growing_cache import GrowingCache, GrowingLayer
from ctrlg.lm.shared_context import cache_keyword


def _step(model, cache, ids, mask, positions):
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_keyword(model): cache},
                use_cache=True)
    return out.logits, out.past_key_values


@pytest.mark.parametrize("spare", [0, 3, 64])
def test_decoding_with_the_growing_cache_equals_decoding_with_the_dynamic_cache(monkeypatch, spare):
    monkeypatch.setattr(growing_cache, "INITIAL_SPARE", spare)
    model = tiny_llama(53, hidden=32, layers=2)
    caches = [DynamicCache(), GrowingCache()]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 53, (2, 5), generator=generator)
    mask = torch.ones(2, 5, dtype=torch.long)
    positions = torch.arange(5)[None].repeat(2, 1)
    schedule = ["step1", "repeat", "step3", "select", "pad", "reorder", "step1", "crop", "step1"]
    with torch.no_grad():
        outs = [_step(model, c, ids, mask, positions) for c in caches]
        caches = [o[1] for o in outs]
        for action in schedule:
            rows = mask.shape[0]
            if action == "repeat":
                for c in caches:
                    c.batch_repeat_interleave(2)
                mask, positions = mask.repeat_interleave(2, 0), positions.repeat_interleave(2, 0)
                continue
            if action in ("select", "reorder"):           # rows kept, or beams reordered
                rows_kept = torch.tensor([0, 2, 3] if action == "select" else [2, 2, 0])
                for c in caches:
                    (c.batch_select_indices if action == "select" else c.reorder_cache)(rows_kept)
                mask, positions = mask[rows_kept], positions[rows_kept]
                continue
            if action == "crop":
                for c in caches:
                    c.crop(-2)
                mask, positions = mask[:, :-2], positions - 2
                continue
            width = 3 if action in ("step3", "pad") else 1
            new_ids = torch.randint(2, 53, (rows, width), generator=generator)
            new_mask = torch.ones(rows, width, dtype=torch.long)
            if action == "pad":                       # row 0 brings one token, padded on the right
                new_mask[0, 1:] = 0
            positions = positions[:, -1:] + 1 + torch.arange(width)[None]
            mask = torch.cat([mask, new_mask], 1)
            outs = [_step(model, c, new_ids, mask, positions) for c in caches]
            caches = [o[1] for o in outs]
            torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
            assert caches[1].get_seq_length() == caches[0].get_seq_length() == mask.shape[1]
    assert all(isinstance(layer, GrowingLayer) for layer in caches[1].layers)


def test_a_step_of_another_batch_size_is_refused():
    layer = GrowingLayer()
    layer.update(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))
    with pytest.raises(ValueError, match="holds 2 rows"):
        layer.update(torch.zeros(3, 1, 1, 4), torch.zeros(3, 1, 1, 4))


def test_the_buffer_grows_geometrically_and_writes_in_place(monkeypatch):
    monkeypatch.setattr(growing_cache, "INITIAL_SPARE", 0)
    layer = GrowingLayer()
    reallocations, buffer = 0, None
    for step in range(100):
        keys = torch.full((1, 1, 1, 2), float(step))
        layer.update(keys, keys + 0.5)
        if layer._key_buffer is not buffer:
            reallocations, buffer = reallocations + 1, layer._key_buffer
    assert reallocations <= 8                        # capacities 2, 4, 8, …, 128
    assert layer.get_seq_length() == 100
    assert torch.equal(layer.keys[0, 0, :, 0], torch.arange(100.0))
    assert torch.equal(layer.values[0, 0, :, 0], torch.arange(100.0) + 0.5)
    with pytest.raises(ValueError, match="negative"):
        layer.crop(3)
