"""benchmarks/bench_infill_floor's LM clock: it counts the positions of every forward of the
model, keyword or positional, and stops counting once closed."""

import torch
from helpers import tiny_llama

from benchmarks.bench_infill_floor import LMClock


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
