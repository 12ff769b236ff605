"""LoRA adapter folders carry the SHA-256 of their tensor files (and of peft's
adapter_config.json) in ctrlg_adapter.json (``checksums``), written by ``save_adapter`` and
verified by ``merge_adapter`` — so by ``load_model(..., adapter=...)`` and every pipeline —
before peft reads the folder: a flipped bit is a CheckpointError naming the file; adapters saved
before checksums (the shipped ones) load as before; a malformed record is a clear error."""

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from ctrlg.errors import CheckpointError
from ctrlg.lm import adapters
from ctrlg.lm.adapters import (EMBEDDED_ADAPTERS, META_FILE, PEFT_CONFIG_FILE, WEIGHTS_FILE,
                               adapter_info, base_fingerprint, merge_adapter, save_adapter)

from helpers import tiny_llama as _tiny_llama

V = 40
IDS = torch.tensor([[0, 5, 6, 7, 9]])


def tiny_llama(seed: int = 0):
    return _tiny_llama(V, seed, layers=2)


def sha256(path) -> str:
    """The oracle: hashlib over the file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tiny_adapter(seed: int = 0):
    """A peft LoRA model of the tiny Llama whose B factors are random (not peft's zeros), so
    the adapter changes the function."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                        target_modules=["q_proj", "v_proj", "down_proj"])
    model = get_peft_model(tiny_llama(), config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def saved(folder: Path, seed: int = 0):
    model = tiny_adapter(seed)
    save_adapter(model, folder, base_name="tiny", base_fingerprint=base_fingerprint(tiny_llama()),
                 metadata={"prompt_style": "bos"}, dtype=torch.float32)
    return model


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def flip(path: Path, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def edit_info(folder: Path, change) -> None:
    info = json.loads((folder / META_FILE).read_text())
    change(info)
    (folder / META_FILE).write_text(json.dumps(info))


@pytest.fixture
def peft_untouched(monkeypatch):
    """Fail the test if peft (or the safetensors header check) reads the folder: the checksums
    are verified first."""
    import peft

    def refuse(*args, **kwargs):
        raise AssertionError("the adapter folder was read before its checksums were verified")

    monkeypatch.setattr(peft.PeftModel, "from_pretrained", refuse)
    monkeypatch.setattr(adapters, "safe_open", refuse)


def test_the_save_records_the_sha256_of_each_tensor_file_and_the_peft_config(tmp_path):
    model = saved(tmp_path / "a")
    record = adapter_info(tmp_path / "a")["checksums"]
    assert record == {WEIGHTS_FILE: sha256(tmp_path / "a" / WEIGHTS_FILE),
                      PEFT_CONFIG_FILE: sha256(tmp_path / "a" / PEFT_CONFIG_FILE)}
    assert "checksums" not in json.loads((tmp_path / "a" / PEFT_CONFIG_FILE).read_text())
    assert torch.allclose(logits(merge_adapter(tiny_llama(), tmp_path / "a")), logits(model),
                          atol=1e-5)
    # a save over it records the new files' sums (no stale record), and loads
    other = saved(tmp_path / "a", seed=1)
    assert adapter_info(tmp_path / "a")["checksums"][WEIGHTS_FILE] == \
        sha256(tmp_path / "a" / WEIGHTS_FILE) != record[WEIGHTS_FILE]
    assert torch.allclose(logits(merge_adapter(tiny_llama(), tmp_path / "a")), logits(other),
                          atol=1e-5)


@pytest.mark.parametrize("name", [WEIGHTS_FILE, PEFT_CONFIG_FILE])
def test_every_single_bit_flip_in_an_adapter_file_is_a_clear_error(tmp_path, name, peft_untouched):
    """Before, a flipped bit of adapter_model.safetensors that kept the header readable loaded
    silently (different weights); now every flip is a CheckpointError naming the file, raised
    before peft reads the folder."""
    saved(tmp_path / "clean")
    size = (tmp_path / "clean" / name).stat().st_size * 8
    rng = random.Random(f"adapter-{name}")
    for bit in rng.sample(range(size), 40 if name == WEIGHTS_FILE else 10):
        copy = tmp_path / f"flip{bit}"
        shutil.copytree(tmp_path / "clean", copy)
        flip(copy / name, bit)
        with pytest.raises(CheckpointError) as err:
            merge_adapter(tiny_llama(), copy)
        assert str(copy / name) in str(err.value) and "corrupt" in str(err.value), bit
        shutil.rmtree(copy)


def test_a_flipped_bit_is_a_clear_error_through_load_model(tmp_path, peft_untouched):
    """The pipelines load their adapter through load_model(base, adapter=...)."""
    from ctrlg.lm.models import load_model

    tiny_llama().save_pretrained(tmp_path / "base")
    saved(tmp_path / "a")
    flip(tmp_path / "a" / WEIGHTS_FILE, (tmp_path / "a" / WEIGHTS_FILE).stat().st_size * 8 - 13)
    with pytest.raises(CheckpointError, match=r"adapter_model\.safetensors does not match the "
                                              r"SHA-256 ctrlg_adapter\.json records.*corrupt"):
        load_model(tmp_path / "base", adapter=tmp_path / "a")


def test_adapters_saved_before_checksums_still_load(tmp_path):
    """An adapter written before checksums (no 'checksums' in ctrlg_adapter.json) merges as
    before; so do the shipped ones, older ones without checksums and newer ones with them (their
    files are verified as far as they record)."""
    model = saved(tmp_path / "a")
    edit_info(tmp_path / "a", lambda info: info.pop("checksums"))
    assert torch.allclose(logits(merge_adapter(tiny_llama(), tmp_path / "a")), logits(model),
                          atol=1e-5)
    shipped = [adapters.ASSETS / folder for folder in EMBEDDED_ADAPTERS.values()
               if (adapters.ASSETS / folder / META_FILE).is_file()]
    assert shipped
    for folder in shipped:
        adapters._check_weights(folder, adapter_info(folder))   # what merge_adapter runs before peft
    assert any("checksums" not in adapter_info(folder) for folder in shipped)


@pytest.mark.parametrize("record", [
    [1, 2], "abc", 5, {}, {PEFT_CONFIG_FILE: "0" * 64},
    {WEIGHTS_FILE: "0" * 64}, {WEIGHTS_FILE: 5}, {WEIGHTS_FILE: "xyz"}, {WEIGHTS_FILE: None},
    {WEIGHTS_FILE: "WEIGHTS", "../adapter_model.safetensors": "0" * 64},
    {WEIGHTS_FILE: "WEIGHTS", "missing.safetensors": "0" * 64},
], ids=repr)
def test_a_bad_checksum_record_is_a_clear_error(tmp_path, record, peft_untouched):
    saved(tmp_path / "a")
    weights = sha256(tmp_path / "a" / WEIGHTS_FILE)
    if isinstance(record, dict):
        record = {k: weights if v == "WEIGHTS" else v for k, v in record.items()}
    edit_info(tmp_path / "a", lambda info: info.update(checksums=record))
    with pytest.raises(CheckpointError, match=r"ctrlg_adapter\.json") as err:
        merge_adapter(tiny_llama(), tmp_path / "a")
    assert "checksum" in str(err.value) or "SHA-256" in str(err.value)


def test_a_malformed_metadata_file_is_a_clear_error(tmp_path):
    saved(tmp_path / "a")
    text = (tmp_path / "a" / META_FILE).read_text()
    (tmp_path / "a" / META_FILE).write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match=r"ctrlg_adapter\.json is not valid JSON"):
        merge_adapter(tiny_llama(), tmp_path / "a")


def test_a_load_recovers_an_adapter_whose_save_was_killed_between_its_two_renames(tmp_path):
    """A killed save leaves the path empty with the new copy ready (or the old one retired)
    beside it: the load puts the complete copy back, as HMM.load does."""
    from ctrlg.lm.adapters import merge_adapter

    saved(tmp_path / "a", seed=1)
    expected = logits(merge_adapter(tiny_llama(), tmp_path / "a"))
    ready = tmp_path / ".a.ready-999999999-x"                    # a killed save's new adapter
    (tmp_path / "a").rename(ready)
    assert torch.allclose(logits(merge_adapter(tiny_llama(), tmp_path / "a")), expected)
    assert (tmp_path / "a").is_dir() and not ready.exists()
    (tmp_path / "a").rename(tmp_path / ".a.retired-999999999-y")  # a retired copy alone
    assert torch.allclose(logits(merge_adapter(tiny_llama(), tmp_path / "a")), expected)
