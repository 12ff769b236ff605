"""Numbers at the edges of the public arguments: guidance strengths and seeds too large for
float32 / 64 bits, a budget whose tables would not fit in memory, and state ids a lazy automaton
never handed out — each a clear ``CtrlgError`` naming the argument, before any work."""

import pytest
import torch

import ctrlg.memory
from ctrlg import dfa
from ctrlg.errors import ConstraintError, InsufficientMemoryError
from ctrlg.sampler import ConstraintLogitsProcessor, generate
from helpers import random_hmm

V, EOS = 5, 4


@pytest.mark.parametrize("strength", [1e308, 1e39, 3.5e38, float("inf"), float("nan"), 10**400,
                                      -1e-9, 1e6 + 1])
def test_strength_out_of_range_is_named(strength):
    """``strength=1e308`` raised torch's 'value cannot be converted to type float without
    overflow' on the first step; now the processor refuses it when built."""
    with pytest.raises(ConstraintError, match="strength"):
        ConstraintLogitsProcessor(random_hmm(3, V, 0), dfa.phrase([1, 2], V), prompt_length=1,
                                  max_new_tokens=4, eos_token_id=EOS, strength=strength)


def test_the_largest_strength_still_guides():
    proc = ConstraintLogitsProcessor(random_hmm(3, V, 0), dfa.phrase([1, 2], V), prompt_length=1,
                                     max_new_tokens=4, eos_token_id=EOS, strength=1e6)
    out = proc(torch.zeros(2, 1, dtype=torch.long), torch.randn(2, V))
    assert not torch.isnan(out).any() and torch.isfinite(out).any(1).all()


@pytest.mark.parametrize("seed", [2**64, 2**70, 10**30, -1, 1.5, True])
def test_seeds_beyond_64_bits_are_named(seed):
    """``seed=2**70`` raised torch's 'Overflow when unpacking long'."""
    with pytest.raises(ConstraintError, match="seed"):
        random_hmm(3, V, 0).sample(2, 3, seed=seed)
    with pytest.raises(ConstraintError, match="seed"):        # refused before the model is used
        generate(object(), object(), "x", dfa.phrase([1], V), max_new_tokens=2, seed=seed,
                 mode="logical")


def test_the_largest_seed_samples():
    assert random_hmm(3, V, 0).sample(2, 3, seed=2**64 - 1).shape == (2, 3)


@pytest.mark.parametrize("mode", ["logical", "ctrlg"])
def test_a_budget_whose_tables_do_not_fit_is_refused_before_building_them(mode, monkeypatch):
    """``max_new_tokens=10**6`` allocated the feasibility table [n+1, S] (9 GB for a large
    constraint) with no check in logical mode; now both modes compare the tables' size with the
    memory available first (here: 64 MiB)."""
    monkeypatch.setattr(ctrlg.memory, "available_bytes", lambda device=None: 64 << 20)
    constraint = dfa.length(0, 200, vocab_size=V)                    # 202 states
    with pytest.raises(InsufficientMemoryError, match="max_new_tokens=1000000"):
        ConstraintLogitsProcessor(random_hmm(3, V, 0) if mode == "ctrlg" else None, constraint,
                                  mode=mode, prompt_length=1, max_new_tokens=10**6,
                                  eos_token_id=EOS)
    ConstraintLogitsProcessor(random_hmm(3, V, 0) if mode == "ctrlg" else None, constraint,
                              mode=mode, prompt_length=1, max_new_tokens=50, eos_token_id=EOS)


TOKENS = [b"a", b"b", b"ab", b""]


@pytest.mark.parametrize("build", [
    lambda: dfa.regex("(ab)+", TOKENS, eos_token_id=3),
    lambda: dfa.lazy_regex("(ab)+", TOKENS, eos_token_id=3),
])
@pytest.mark.parametrize("state", [10**6, -1, -2, 2**70])
def test_state_ids_never_handed_out_are_named(build, state):
    """``LazyTokenDFA.mask(10**6)`` raised IndexError and ``mask(-1)`` read another state's
    row; now it gives ConstraintError for every query, as the eager TokenDFA does."""
    d = build()
    queries = [lambda: d.step(state, 0), lambda: d.is_accepting(state)]
    if hasattr(d, "mask"):
        queries.append(lambda: d.mask(state))
    for query in queries:
        with pytest.raises(ConstraintError, match="state"):
            query()


@pytest.mark.parametrize("state", [1.0, "1", True])
def test_lazy_state_ids_must_be_ints(state):
    d = dfa.lazy_regex("(ab)+", TOKENS, eos_token_id=3)
    for query in (lambda: d.step(state, 0), lambda: d.is_accepting(state), lambda: d.mask(state),
                  lambda: d.run([0], state=state)):
        with pytest.raises(ConstraintError, match="state"):
            query()


def test_valid_state_ids_of_the_lazy_automaton_still_work():
    d = dfa.lazy_regex("(ab)+", TOKENS, eos_token_id=3)
    q = d.step(d.initial, 2)
    assert d.is_accepting(q) and d.mask(q)[3] and d.mask(q)[0]
    assert d.accepts([0, 1, 2, 3]) and not d.accepts([0, 3])
    assert not d.mask(0).any()                                       # the dead state
