"""LoRA adaptation and adapters on a tiny random Llama: training is seeded and resumable, the
saved adapter merges to the same function as the trained peft model, and an adapter refuses a
base it was not trained on."""

import json

import pytest
import torch

from ctrlg.lm.adaptation import Example, LoraSettings, collate, epoch_batches, mean_target_nll, train_lora
from ctrlg.lm.adapters import (AdapterMismatchError, adapter_info, base_fingerprint, merge_adapter,
                            save_adapter)
from ctrlg.errors import CheckpointError, CtrlgError

from helpers import tiny_llama as _tiny_llama

V = 40


def tiny_llama(seed: int = 0, dtype=None):
    return _tiny_llama(V, seed, layers=2, dtype=dtype)


def examples(n: int = 24, seed: int = 0) -> list[Example]:
    """BOS (0), a "sentence" of consecutive tokens s, s+1, ... (learnable), EOS (1); the loss
    starts after BOS."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        first, length = int(torch.randint(2, V, (1,), generator=g)), int(torch.randint(2, 7, (1,), generator=g))
        body = [2 + (first - 2 + k) % (V - 2) for k in range(length)]
        out.append(Example(tuple([0] + body + [1]), 1))
    return out


SETTINGS = dict(rank=2, alpha=4.0, dropout=0.0, target_modules=("q_proj", "v_proj", "down_proj"),
                lr=5e-2, epochs=2, batch_size=4, save_every=2, autocast=None, seed=3)


def test_collate_masks_prompt_and_padding():
    batch = collate([Example((0, 5, 6, 1), 1), Example((0, 2, 3, 7, 8, 9), 3)], pad_id=1)
    assert batch["input_ids"].tolist() == [[0, 5, 6, 1, 1, 1], [0, 2, 3, 7, 8, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    assert batch["labels"].tolist() == [[-100, 5, 6, 1, -100, -100], [-100, -100, -100, 7, 8, 9]]


def test_epoch_batches_cover_each_example_once_and_depend_on_seed_and_epoch():
    data = examples(50)
    for epoch in (0, 1):
        batches = epoch_batches(data, 4, seed=1, epoch=epoch)
        assert sorted(i for b in batches for i in b) == list(range(50))
        assert all(len(b) <= 4 for b in batches)
    assert epoch_batches(data, 4, 1, 0) == epoch_batches(data, 4, 1, 0)
    assert epoch_batches(data, 4, 1, 0) != epoch_batches(data, 4, 1, 1)


def test_training_lowers_the_loss_and_mean_nll_matches_a_direct_computation(tmp_path):
    data = examples()
    base = tiny_llama()
    before = mean_target_nll(base, data, pad_id=1)
    # the mean NLL by hand, one example at a time
    total, count = 0.0, 0
    with torch.no_grad():
        for e in data:
            ids = torch.tensor([e.ids])
            logp = base(input_ids=ids).logits.log_softmax(-1)[0, :-1]
            targets = ids[0, 1:]
            picked = logp.gather(1, targets[:, None])[:, 0][e.start - 1:]
            total, count = total - float(picked.sum()), count + picked.numel()
    assert before == pytest.approx(total / count, rel=1e-5)
    model, losses = train_lora(base, data, 1, LoraSettings(**{**SETTINGS, "epochs": 8}),
                               state_dir=tmp_path / "s")
    assert len(losses) == 48
    assert mean_target_nll(model, data, pad_id=1) < before - 0.1


def test_resumed_training_equals_an_uninterrupted_run(tmp_path):
    data = examples()
    whole, losses = train_lora(tiny_llama(), data, 1, LoraSettings(**SETTINGS), state_dir=tmp_path / "a")
    train_lora(tiny_llama(), data, 1, LoraSettings(**SETTINGS), state_dir=tmp_path / "b", stop_after=5)
    assert json.loads((tmp_path / "b" / "training_state.json").read_text())["step"] == 5
    # a new process continues from the state of the interrupted one (same settings and data)
    resumed, resumed_losses = train_lora(tiny_llama(), data, 1, LoraSettings(**SETTINGS),
                                         state_dir=tmp_path / "b")
    assert resumed_losses == pytest.approx(losses, rel=1e-5)
    ids = torch.tensor([list(data[0].ids)])
    with torch.no_grad():
        assert torch.allclose(whole(input_ids=ids).logits, resumed(input_ids=ids).logits, atol=1e-5)


def test_a_training_state_of_other_settings_is_refused(tmp_path):
    data = examples()
    train_lora(tiny_llama(), data, 1, LoraSettings(**{**SETTINGS, "max_steps": 2}), state_dir=tmp_path)
    with pytest.raises(CheckpointError, match="another configuration"):
        train_lora(tiny_llama(), data, 1, LoraSettings(**{**SETTINGS, "lr": 1e-3}), state_dir=tmp_path)


def test_saved_adapter_merges_to_the_trained_function(tmp_path):
    data = examples()
    base = tiny_llama()
    fingerprint = base_fingerprint(base)
    trained, _ = train_lora(base, data, 1, LoraSettings(**SETTINGS), state_dir=tmp_path / "s")
    save_adapter(trained, tmp_path / "adapter", base_name="tiny", base_fingerprint=fingerprint,
                 metadata={"prompt_style": "bos"}, dtype=torch.float32)
    info = adapter_info(tmp_path / "adapter")
    assert info["base_model"] == "tiny" and info["prompt_style"] == "bos"
    merged = merge_adapter(tiny_llama(), tmp_path / "adapter")
    ids = torch.tensor([list(e.ids) for e in data[:1]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, trained(input_ids=ids).logits, atol=1e-5)
    assert not any("lora_" in name for name, _ in merged.named_parameters())


def test_load_model_merges_an_adapter_and_checks_its_base(tmp_path):
    from ctrlg.lm.models import load_model

    base = tiny_llama()
    base.save_pretrained(tmp_path / "base")
    trained, _ = train_lora(base, examples(), 1, LoraSettings(**{**SETTINGS, "max_steps": 3}),
                            state_dir=tmp_path / "s")
    save_adapter(trained, tmp_path / "adapter", base_name=str(tmp_path / "base"),
                 base_fingerprint=base_fingerprint(tiny_llama()))   # bf16 by default
    model = load_model(tmp_path / "base", adapter=tmp_path / "adapter")
    ids = torch.tensor([[0, 5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, trained(input_ids=ids).logits, atol=2e-2)
    tiny_llama(seed=1).save_pretrained(tmp_path / "other")
    with pytest.raises(AdapterMismatchError, match="trained on"):
        load_model(tmp_path / "other", adapter=tmp_path / "adapter")


def test_fingerprint_is_the_same_in_float32_and_bfloat16_and_differs_between_bases():
    assert base_fingerprint(tiny_llama()) == base_fingerprint(tiny_llama(dtype=torch.bfloat16))
    assert base_fingerprint(tiny_llama()) != base_fingerprint(tiny_llama(seed=1))


def test_bad_adapters_get_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="neither an embedded adapter"):
        merge_adapter(tiny_llama(), tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="lacks"):
        merge_adapter(tiny_llama(), tmp_path / "empty")
    trained, _ = train_lora(tiny_llama(), examples(), 1, LoraSettings(**{**SETTINGS, "max_steps": 1}),
                            state_dir=tmp_path / "s")
    save_adapter(trained, tmp_path / "a", base_name="tiny", base_fingerprint=base_fingerprint(tiny_llama()))
    weights = tmp_path / "a" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        merge_adapter(tiny_llama(), tmp_path / "a")
    with pytest.raises(CtrlgError, match="rank"):
        LoraSettings(rank=0).check()


def test_the_loss_skips_the_output_layer_before_the_first_target_and_is_unchanged():
    """_target_nll_sum keeps only the logits from the first target onwards (logits_to_keep); the
    summed NLL equals the full-logits cross-entropy, on right-padded rows of different lengths."""
    import torch

    from ctrlg.lm.adaptation import Example, _target_nll_sum, collate
    from helpers import tiny_llama

    model = tiny_llama(40, seed=0)
    examples = [Example(tuple(range(2, 12)), 6), Example(tuple(range(5, 9)), 1),
                Example(tuple(range(3, 16)), 10)]
    batch = collate(examples, 1)
    nll, count = _target_nll_sum(model, batch, None)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    full = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 40),
                                             batch["labels"][:, 1:].reshape(-1),
                                             ignore_index=-100, reduction="sum")
    assert count == 4 + 3 + 3
    assert torch.allclose(nll, full, rtol=1e-5)
