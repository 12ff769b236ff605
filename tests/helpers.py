"""Shared test helpers: random HMMs and DFAs, EOS trimming. Import as ``from helpers import ...``
(the tests folder is on ``sys.path`` under pytest's rootdir import mode)."""

import numpy as np
import torch

from ctrlg import HMM, sampler
from ctrlg.dfa.core import TokenDFA


def random_hmm(h, V, seed, concentration=1.0):
    g = torch.Generator().manual_seed(seed)
    dist = lambda *shape: torch._standard_gamma(torch.full(shape, concentration, dtype=torch.float64),  # noqa: E731
                                                generator=g)
    pi, A, B = dist(h), dist(h, h), dist(h, V)
    return HMM.from_params(pi, A, B, normalize=True)


def random_dfa(S, V, seed):
    rng = np.random.default_rng(seed)
    table = rng.integers(0, S, size=(S, V))
    accepting = rng.random(S) < 0.4
    accepting[rng.integers(S)] = True
    return TokenDFA.from_dense(table, accepting, initial=0)


def random_letter_dfa(S, V, seed):
    """A random DFA stored over letters (token classes): tokens of a letter behave alike."""
    rng = np.random.default_rng(seed)
    letter_of_token = rng.integers(0, 3, size=V)
    letter_of_token[:3] = [0, 1, 2]
    A = 3
    table = rng.integers(0, S, size=(S, A))
    accepting = rng.random(S) < 0.4
    accepting[rng.integers(S)] = True
    default = table[:, 0].copy()
    ptr, exc, nxt = [0], [], []
    for s in range(S):
        for a in range(A):
            if table[s, a] != default[s]:
                exc.append(a)
                nxt.append(table[s, a])
        ptr.append(len(exc))
    dfa = TokenDFA(V, 0, accepting, default, ptr, exc, nxt, letter_of_token=letter_of_token)
    assert dfa.has_letters and np.array_equal(dfa.dense(), table[:, letter_of_token])
    return dfa


def floored_random_hmm(h: int = 3, V: int = 4, seed: int = 0, *, sharp: float = 1.0,
                       floor: float = 0.01):
    """A random HMM with every probability bounded away from 0: rows ∝ U(0,1)^sharp + floor."""
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.rand(*shape, generator=g).pow(sharp).add(floor)  # noqa: E731
    return HMM.from_params(make(h), make(h, h), make(h, V), normalize=True)


def trim_at_eos(row, eos) -> list[int]:
    """``row`` up to and including its first EOS (``eos``: None, an id or ids)."""
    return sampler.trim_at_eos(row, sampler.eos_list(eos))


def tiny_llama(vocab_size: int, seed: int = 0, *, hidden: int = 16, layers: int = 1,
               dtype=None):
    """A tiny random Llama (BOS 0, EOS 1) whose logits are large enough to matter
    (initializer_range 0.5): for tests that enumerate sequences or train LoRA factors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=0,
                         eos_token_id=1, pad_token_id=1, initializer_range=0.5)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    return model if dtype is None else model.to(dtype)


def interpreted_checks(module: str, timeout: float = 600) -> dict:
    """``module.run_all_checks()`` (a test module beside this file) run in a fresh Python with
    ``TRITON_INTERPRET=1``, its JSON result returned: Triton reads the variable at its first
    import, which another test module of this process may already have done."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = f"import json, {module} as m; print(json.dumps(m.run_all_checks()))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent,
                          env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
