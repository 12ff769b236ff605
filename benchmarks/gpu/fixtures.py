"""Synthetic inputs of the benchmarks: random HMMs, random Llama models (tiny, or ~1B parameters),
a tiny word-level tokenizer, and random inputs of one backward-table step.

Everything is built from a seed on the target device; nothing is downloaded.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ctrlg.hmm.model import HMM

__all__ = ["random_hmm", "random_llama", "tiny_lm_folder", "backward_step_inputs",
           "LLAMA_1B", "llama_config"]

#: ~1.07 B parameters: 16 layers, hidden 2048, MLP 8192, 32 heads (8 KV heads), SmolLM2's vocab.
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, vocab_size=49152)
#: A tiny Llama for CPU runs.
LLAMA_TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)


def _generator(seed: int, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def random_hmm(hidden_size: int, vocab_size: int, *, seed: int = 0, device="cpu",
               temperature: float = 1.0) -> HMM:
    """An HMM with rows softmax(N(0, 1) / temperature) (float32, on ``device``).

    Built directly on the device (no CPU validation pass: at h = 4096, V = 49152 that would cost
    seconds); the rows are normalised by construction."""
    g = _generator(seed, device)
    dev = torch.device(device)

    def rows(*shape):
        logits = torch.randn(*shape, generator=g, device=dev) / temperature
        return torch.softmax(logits, dim=-1)

    return HMM(rows(hidden_size), rows(hidden_size, hidden_size), rows(hidden_size, vocab_size),
               config={"synthetic": True, "seed": int(seed)})


def llama_config(vocab_size: int | None = None, **overrides):
    """A ``LlamaConfig`` from :data:`LLAMA_TINY` updated with ``overrides``."""
    from transformers import LlamaConfig

    params = dict(LLAMA_TINY)
    params.update(overrides)
    if vocab_size is not None:
        params["vocab_size"] = int(vocab_size)
    params.setdefault("max_position_embeddings", 2048)
    params.setdefault("tie_word_embeddings", True)
    return LlamaConfig(**params)


def random_llama(config, *, seed: int = 0, device="cpu", dtype: torch.dtype = torch.float32):
    """A randomly initialised ``LlamaForCausalLM`` in eval mode, created on ``device``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(int(seed))
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def _word_level_tokenizer(vocab_size: int):
    """A word-level fast tokenizer: ``<eos>`` (id 0), ``<unk>`` (id 1), then ``w2`` … ``w{V-1}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<unk>": 1}
    vocab.update({f"w{i}": i for i in range(2, vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<eos>")


def tiny_lm_folder(directory: str | Path | None = None, *, vocab_size: int = 64, seed: int = 0) -> Path:
    """Save a tiny random Llama and a matching word-level tokenizer into ``directory`` (a new
    temporary folder by default) so that ``ctrlg.lm.models.load_model(folder)`` loads them."""
    folder = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="tiny-llama-"))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _word_level_tokenizer(vocab_size)
    config = llama_config(vocab_size, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = random_llama(config, seed=seed)
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 0
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def backward_step_inputs(num_states: int, hidden_size: int, *, exceptions_per_state: int = 6,
                         emission_rows: int = 4096, seed: int = 0, device="cpu",
                         dtype: torch.dtype = torch.float32) -> dict:
    """Random arguments of ``backward_step_reference`` for ``num_states`` DFA states, each with
    ``exceptions_per_state`` exception edges (the CommonGen DFA of DESIGN.md has 5,143 edges over
    787 states, ≈ 6.5 per state), in CSR order. ``w_prev`` and ``transition`` are cast to
    ``dtype`` (the other operands stay float32). Exception k reads emission row ``exc_row[k]`` of
    an ``[emission_rows, h]`` table (Bᵀ in the guide; its size only affects cache behaviour)."""
    S, h, k = int(num_states), int(hidden_size), int(exceptions_per_state)
    g = _generator(seed, device)
    dev = torch.device(device)
    rand = lambda *shape: torch.rand(*shape, generator=g, device=dev)  # noqa: E731
    randint = lambda hi, n: torch.randint(0, hi, (n,), generator=g, device=dev)  # noqa: E731
    E = S * k
    transition = torch.softmax(torch.randn(h, h, generator=g, device=dev), dim=-1)
    return {
        "w_prev": rand(S, h).to(dtype),
        "default": randint(S, S),
        "coef_default": rand(S),
        "nonexc_mass": 1.0 - 0.01 * rand(S, h),
        "exc_src": torch.arange(S, device=dev).repeat_interleave(k),
        "exc_dst": randint(S, E),
        "exc_row": randint(int(emission_rows), E),
        "emission_rows": 1e-4 * rand(int(emission_rows), h),
        "coef_exc": rand(E),
        "eos_term": 1e-4 * rand(S, h),
        "coef_eos": rand(S),
        "transition": transition.to(dtype),
    }
