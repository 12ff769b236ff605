"""A tiny LM + HMM on the real SmolLM2 tokenizer for the editor's tests (and the live server).

The HMM (h = 6) emits almost only a few dozen word tokens, so generations read like words; the LM
is the HMM itself (:class:`ctrlg.lm.hmm_lm.HMMForCausalLM`). Both are built in memory in well under a
second; nothing is downloaded."""

from __future__ import annotations

import functools
import threading

import torch

from ctrlg.app.server import background_server as live_server  # noqa: F401  (re-exported)

WORDS = [" the", " a", " cat", " dog", " sat", " on", " mat", " and", " ran", " in", " park",
         " old", " house", " river", " bright", " lamp", " green", " tree", " was", " with", ".",
         ",", " he", " she", " it", " light", " garden", " small", " quiet", " night", " by",
         " door"]


def tiny_model(tokenizer, hidden: int = 6, seed: int = 0):
    """(model, hmm) over the tokenizer's vocabulary; EOS = the tokenizer's EOS."""
    import ctrlg

    V = len(tokenizer)
    g = torch.Generator().manual_seed(seed)
    ids = [tokenizer.encode(w, add_special_tokens=False)[0] for w in WORDS]
    emission = torch.full((hidden, V), 1e-7)
    emission[:, ids] = torch.rand(hidden, len(ids), generator=g) + 0.2
    emission[:, tokenizer.eos_token_id] = 0.05
    transition = torch.rand(hidden, hidden, generator=g) + 0.1
    initial = torch.rand(hidden, generator=g) + 0.1
    hmm = ctrlg.HMM.from_params(initial, transition, emission, normalize=True)
    model = overlap_counting_lm().from_hmm(hmm, prompt_length=0, eos_token_id=tokenizer.eos_token_id)
    return model, hmm


@functools.lru_cache(maxsize=1)
def overlap_counting_lm():
    """The LM class, made on first use: importing ctrlg.lm.hmm_lm imports Triton (through
    transformers), which must not happen at collection time, before the kernel tests set
    TRITON_INTERPRET=1."""
    from ctrlg.lm.hmm_lm import HMMForCausalLM

    class _LM(HMMForCausalLM):
        """HMMForCausalLM that records the largest number of concurrent forward passes."""

        active = 0
        max_active = 0
        _guard = threading.Lock()

        def forward(self, *args, **kwargs):
            cls = type(self)
            with cls._guard:
                cls.active += 1
                cls.max_active = max(cls.max_active, cls.active)
            try:
                return super().forward(*args, **kwargs)
            finally:
                with cls._guard:
                    cls.active -= 1

    return _LM
