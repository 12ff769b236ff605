"""benchmarks/bench_infill_floor's LM clock: it counts the positions of every forward of the
model, keyword or positional, and the lean forward's, and stops counting once closed; the step
timer runs either forward."""

import pytest
import torch
from helpers import tiny_llama

from benchmarks.bench_infill_floor import LMClock, step_seconds
from ctrlg.lm.growing_cache import GrowingCache
from ctrlg.lm.int8_weights import use_int8_weights
from ctrlg.lm.lean_decoder import lean_llama


def test_the_clock_counts_every_forward_until_closed():
    model = tiny_llama(64, layers=2)
    clock = LMClock(model)
    with torch.no_grad():
        model(input_ids=torch.zeros(2, 5, dtype=torch.long))
        model(torch.zeros(3, 1, dtype=torch.long))
        assert clock.tokens == 2 * 5 + 3 and clock.seconds > 0
        clock.close()
        seconds = clock.seconds
        model(torch.zeros(3, 1, dtype=torch.long))
    assert clock.tokens == 13 and clock.seconds == seconds


def test_the_clock_counts_the_lean_forward_and_the_step_is_timed_by_either_forward():
    model = tiny_llama(64, layers=2)
    lean = lean_llama(model)
    assert lean is not None
    clock = LMClock(model)
    with torch.no_grad():
        lean(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long),
             torch.arange(4).repeat(2, 1), GrowingCache())
    clock.close()
    assert clock.tokens == 8 and clock.seconds > 0
    model = tiny_llama(20_300, layers=1)            # the timer feeds token ids up to 20,000
    assert step_seconds(model, rows=2, cache_tokens=5, steps=2, positions=3) > 0
    assert step_seconds(model, rows=2, cache_tokens=5, steps=2, forward="model") > 0
    use_int8_weights(model)                         # a model the lean forward does not cover
    assert lean_llama(model) is None and step_seconds(model, rows=2, cache_tokens=5, steps=2) > 0
    with pytest.raises(ValueError, match="does not cover"):
        step_seconds(model, rows=2, cache_tokens=5, steps=2, forward="lean")
